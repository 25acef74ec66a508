"""The weight loaders a stack may choose (`serving.loadFormat`, a recipe's `vllm.loadFormat`): the
values of vLLM's `--load-format` that read the safetensors twinspark downloads, each with the
Python package it needs in the serving image. vLLM registers more (recipes/vllm-names.toml,
[load_formats]): `dummy` serves random weights, the others read formats no download here makes
(a pre-sharded or tensorized copy, .bin files, a quantized checkpoint) or a server of their own.

A leaf module: data only.
"""

from __future__ import annotations

from typing import Optional

DEFAULT = "auto"  # vLLM's own: its safetensors reader, file by file through the page cache

# name: the package that must be importable in the serving image (None: vLLM's own code)
LOADERS: dict[str, Optional[str]] = {
    "auto": None,
    "safetensors": None,
    # a requirement of vLLM's own (0.24.0: fastsafetensors>=0.3.2), so every vLLM image holds it
    "fastsafetensors": "fastsafetensors",
    # vLLM extras: installed into the serving image from launch/serving-image/loader-requirements.lock
    # when its base lacks them (locked-install.sh)
    "instanttensor": "instanttensor",
    "runai_streamer": "runai-model-streamer",
}


def loader_problem(name: str, registered: list[str]) -> Optional[str]:
    """Why `name` cannot be a stack's loader (what is expected instead), or None."""
    if name in LOADERS:
        return None
    if name not in registered:
        return f"a --load-format vLLM registers, and one of twinspark's loaders: {', '.join(LOADERS)}"
    return (f"one of twinspark's loaders, which read the downloaded safetensors ({', '.join(LOADERS)}); vLLM's "
            f"{name!r} reads another format or none (dummy weights) and is not served here")
