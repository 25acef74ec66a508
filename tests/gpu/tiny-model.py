#!/usr/bin/env python3
"""tiny-model.py DIR — write, offline, a model directory vLLM 0.24 loads with `--load-format dummy`.

A Qwen2 (native in vLLM: Qwen2ForCausalLM) of 4 layers, hidden 256, 4 attention heads over 2 KV
heads (TP 1 and 2 divide both), and a byte-level BPE tokenizer trained here on a fixed text
(deterministic), with Qwen2.5's special tokens and a chat template that renders tools and
`<tool_call>` blocks: what vLLM's `hermes` tool parser looks for. No weights: dummy ones are drawn.
Needs only the `tokenizers` library (the device has it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# added but not special (as in Qwen2.5): a detokenizer that skips special tokens keeps them for the parser
TOOL_TOKENS = ["<tool_call>", "</tool_call>"]
VOCAB_SIZE = 4096  # a multiple of 64 (vLLM pads the embedding to it anyway)

# Qwen2.5's template, cut to what the canary and a tool call need: system, tools, tool calls, tool results.
CHAT_TEMPLATE = """{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}{% else %}You are a helpful assistant.{% endif %}

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' %}<|im_start|>assistant
{% if message.content %}{{ message.content }}{% endif %}
{%- for call in message.tool_calls | default([]) %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments if call.function.arguments is string \
else call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "vocab_size": VOCAB_SIZE,
    "bos_token_id": None,
    "eos_token_id": 2,  # <|im_end|>, as Qwen2.5-Instruct
    "pad_token_id": 0,
}


def training_text() -> list[str]:
    """Fixed text covering digits, JSON and English: the canary's sums and the tool call's arguments."""
    words = ("what is the sum of plus equals answer weather city tool call function name arguments json "
             "paris london berlin tokyo please reply with only the number today is sunny rainy").split()
    lines = [" ".join(words[i:] + words[:i]) for i in range(len(words))]
    lines += [f"What is {a} + {b}? {a + b}" for a in range(0, 1000, 7) for b in range(0, 1000, 97)]
    lines += ['{"name": "get_weather", "arguments": {"city": "Paris"}}', "<tool_call> </tool_call>"]
    return lines


def build_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE - len(TOOL_TOKENS), special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(training_text(), trainer=trainer)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    return tokenizer


def write(model_dir: Path) -> None:
    model_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    tokenizer.save(str(model_dir / "tokenizer.json"))
    ids = {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}
    if tokenizer.get_vocab_size() > VOCAB_SIZE:
        raise SystemExit(f"tokenizer has {tokenizer.get_vocab_size()} tokens, config.json says {VOCAB_SIZE}")
    if ids["<|im_end|>"] != CONFIG["eos_token_id"] or ids["<|endoftext|>"] != CONFIG["pad_token_id"]:
        raise SystemExit(f"special token ids moved: {ids}")
    (model_dir / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}) + "\n")
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": CONFIG["max_position_embeddings"],
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "unk_token": None,
        "additional_special_tokens": SPECIAL_TOKENS[1:],
        "chat_template": CHAT_TEMPLATE,
    }
    (model_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: tiny-model.py DIR (where the model directory is written)")
    write(Path(sys.argv[1]))
    print(f"wrote {sys.argv[1]}: Qwen2ForCausalLM, vocab {VOCAB_SIZE}")
