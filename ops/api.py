"""What the day-2 tools read from outside, validated: the endpoint's answers and the stack's outputs.

A server, a file or a flag that says something else is reported in one line naming the first
thing wrong, never a traceback. Unknown extra fields are ignored (servers and stacks grow).
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from core import host_keys


class Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


# ---- the OpenAI-compatible API ------------------------------------------------------------------
class ModelCard(Lenient):
    id: str
    max_model_len: Optional[int] = None  # vLLM's: the context the model is served with


class ModelList(Lenient):
    data: list[ModelCard] = Field(min_length=1)


class Delta(Lenient):
    content: Optional[str] = None
    # reasoning parsers name the field `reasoning_content` (older vLLM) or `reasoning`
    reasoning_content: Optional[str] = None
    reasoning: Optional[str] = None


class ChunkChoice(Lenient):
    delta: Delta = Delta()
    finish_reason: Optional[str] = None


class PromptTokensDetails(Lenient):
    cached_tokens: Optional[int] = None


class Usage(Lenient):
    prompt_tokens: Optional[int] = None
    completion_tokens: Optional[int] = None
    prompt_tokens_details: Optional[PromptTokensDetails] = None


class ChatChunk(Lenient):
    choices: Optional[list[ChunkChoice]] = None
    usage: Optional[Usage] = None
    error: Any = None  # vLLM reports a failure mid-stream as an event with `error`


# ---- the stack's outputs ------------------------------------------------------------------------
class Rail(Lenient):
    iface: str
    hca: str


class Node(Lenient):
    name: str
    role: Literal["head", "worker"]
    host: str
    rayIp: str
    rails: list[Rail]
    # the key `pulumi up` held the node to; ops reaches a node over SSH only with it (nodes.ssh_shell)
    hostKey: Optional[str] = None

    @field_validator("hostKey")
    @classmethod
    def _a_host_key(cls, key: Optional[str]) -> Optional[str]:
        if key is not None:
            try:
                host_keys.parse(key)
            except host_keys.HostKeyError as err:
                raise ValueError(str(err)) from None
        return key


class Fabric(Lenient):
    mtu: Optional[int] = None
    linkSpeedMbps: Optional[int] = None


class Lane(Lenient):
    """One lane of a stack that serves several (the `lanes` output, issue 41)."""
    model: str  # its served name
    recipe: str
    nodes: list[str]
    head: Optional[str] = None  # the node whose guard watches its engine (a stack deployed before: none)
    revision: Optional[str] = None  # the commit its weights hold


class StackOutputs(Lenient):
    """The outputs the tools read; each is optional here, and asked for where a tool needs it."""
    endpoint: Optional[str] = None
    apiKey: Optional[str] = None
    model: Optional[str] = None
    modelDir: Optional[str] = None  # model.dir, the same on every node
    executor: Optional[str] = None  # serving.executor: ray or mp
    recipe: Optional[str] = None  # serving.recipe, by name (core/recipes.py)
    nodes: Optional[list[Node]] = None
    sshUser: Optional[str] = None
    fabric: Optional[Fabric] = None
    lanes: Optional[dict[str, Lane]] = None  # several lanes: each by its name; one lane: absent
    codexConfig: Optional[str] = None
    codexModelCatalog: Optional[str] = None
    claudeCodeEnv: Optional[str] = None


def first_problem(err: ValidationError) -> str:
    """`where: what` of the first error; pydantic's own message is several lines."""
    first = err.errors()[0]
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"]).lstrip(".")
    return f"{where or 'the top level'}: {first['msg']}" + (f" (and {err.error_count() - 1} more)"
                                                        if err.error_count() > 1 else "")


def served_models(body: bytes) -> dict[str, Optional[int]]:
    """The models in a /v1/models answer, each with its context (max_model_len; None where the
    server does not say), in the server's order; ValueError saying what is wrong when it is not a
    model list."""
    try:
        return {card.id: card.max_model_len for card in ModelList.model_validate_json(body).data}
    except ValidationError as err:
        raise ValueError(f"not a model list ({first_problem(err)}): {body[:120]!r}") from None


# ---- the head's serving guard (contract.SERVING_GUARD_STATUS) ------------------------------
class GuardHold(Lenient):
    reason: str
    since: float


class GuardVerdict(Lenient):
    """The serving guard's latest verdict; `ops upgrade` passes the canary on ok without a hold."""
    checked_at: Optional[float] = None  # None: no round yet (a guard just started)
    ok: Optional[bool] = None
    failures: list[str] = []
    consecutive_failures: int = 0
    restarts_in_window: int = 0
    hold: Optional[GuardHold] = None
