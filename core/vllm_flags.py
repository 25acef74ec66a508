"""What `serving.extraArgs` may hold: vLLM flags twinspark does not own, read as vLLM's parser reads them.

A flag is refused when a config key (or the node list) owns its value, when it would bypass
this check or blind the monitoring (FLAGS_NOT_IN_EXTRA_ARGS), or when the chosen recipe or
profile renders it (`refused_flags`). The schema (components/config) raises what
`extra_args_problem` finds at `serving.extraArgs[i]`.

A leaf module beside the recipes it reads: nothing of Pulumi.
"""

from __future__ import annotations

import re
from typing import Optional

from . import recipes

CODE_BY_NAME = ("vLLM imports the code it names (any module, as root on every node, as --middleware os.system "
                "showed): build it into the serving image and set it in a recipe, where it is reviewed")
# vLLM flags extraArgs may not set, and why: a config key (or the node list) owns their value,
# or they would bypass this check.
FLAGS_NOT_IN_EXTRA_ARGS = {
    "--served-model-name": "set model.servedName",
    "--port": "vLLM listens on a Unix socket behind the API gateway; set serving.port for the API",
    "--host": "vLLM listens on a Unix socket only the API gateway opens, behind its key check",
    "--uds": "vLLM's socket is twinspark's: only the API gateway may open it",
    "--max-model-len": "set serving.maxModelLen",
    "--gpu-memory-utilization": "set serving.gpuMemoryUtilization",
    "--kv-cache-dtype": "set serving.kvCacheDtype",
    "--load-format": "set serving.loadFormat",
    "--kv-transfer-config": "set serving.kvTier: its KV tier is twinspark's connector, held to a lane of one node "
    "with its hash seed and its bound on the disk",
    "--tensor-parallel-size": "set serving.tensorParallel (tensorParallel × pipelineParallel = the node count)",
    "--pipeline-parallel-size": "set serving.pipelineParallel (tensorParallel × pipelineParallel = the node count)",
    "--distributed-executor-backend": "set serving.executor (ray or mp)",
    # serving.executor mp: the node ranks and the head's address are the node list's
    "--nnodes": "the node count, with serving.executor mp",
    "--node-rank": "each node's rank, from the node list (the head is 0), with serving.executor mp",
    "--master-addr": "the head's rail address, with serving.executor mp",
    "--master-port": "twinspark's (contract.MP_MASTER_PORT), with serving.executor mp",
    "--headless": "every worker runs headless with serving.executor mp; the head serves the API",
    "--data-parallel-backend": "data parallelism is not a supported setting: TP × PP spans every node",
    "--api-key": "set twinspark:apiKey, a secret; as a flag it would show in argv and state",
    "--config": "it reads more flags from a file, where twinspark cannot check them; list them in serving.extraArgs",
    # what would blind the monitoring and the guard, which read vLLM's /metrics
    "--disable-log-stats": "it removes every vllm:* metric, which the dashboards, the alerts and the serving "
    "guard's wedge check read",
    "--data-parallel-size": "data parallelism is not a supported setting: TP × PP spans every node, and more than one "
    "engine puts vLLM's metrics in multiprocess mode, where the restart alert's series is missing",
    "--api-server-count": "more than one API server puts vLLM's metrics in multiprocess mode, where the restart "
    "alert's series (process_start_time_seconds) is missing",
    # what makes vLLM import code it is given by name or path, run as root on every node
    **{flag: CODE_BY_NAME for flag in ("--middleware", "--worker-cls", "--worker-extension-cls", "--scheduler-cls",
                                       "--logits-processors", "--tool-parser-plugin", "--io-processor-plugin",
                                       "--log-config-file")},
}
# A flag as vLLM's parser reads it: '_' for '-' (FlexibleArgumentParser), an optional
# '.key' into a JSON flag, an optional '=value'.
_FLAG = re.compile(r"--(?P<name>[a-z0-9][a-z0-9_-]*)(?P<key>\.[A-Za-z0-9_.-]+)?(?P<value>=.*)?", re.S)
# vLLM's single-dash aliases of refused flags (every other single-dash token is refused as no '--flag')
SHORT_FLAGS = {"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size", "-dp": "--data-parallel-size",
               "-n": "--nnodes", "-r": "--node-rank"}
_SHORT_FLAG = re.compile(r"(?P<name>-[a-z]+)(?P<value>=.*)?", re.S)


# What vLLM refuses without Ray (vllm/config/parallel.py ParallelConfig._verify_args), refused in
# extraArgs with serving.executor mp before any resource rather than by the engine on the nodes.
RAY_ONLY_FLAGS = {
    "--ray-workers-use-nsight": "vLLM refuses it unless the workers run on Ray ('Unable to use nsight profiling "
    "unless workers run with Ray'); serving.executor is mp",
}


def refused_flags(recipe: recipes.Recipe, executor: str = "ray") -> dict[str, str]:
    """What extraArgs may not set: what twinspark's keys own, every flag `recipe` renders, and
    with serving.executor mp what vLLM takes only with Ray."""
    refused = dict(FLAGS_NOT_IN_EXTRA_ARGS, **(RAY_ONLY_FLAGS if executor == "mp" else {}))
    profiles = " or ".join(repr(p) for p in recipe.profiles)
    for flag in recipes.rendered_flags(recipe):
        refused.setdefault(flag, f"set by serving.profile of recipe {recipe.name}, which is not meant to be "
                           f"overridden; choose {profiles}" if flag in recipes.PROFILE_FLAGS else
                           f"set by serving.recipe {recipe.name} (recipes/): choose or add a recipe instead")
    return refused


def _flag_refusal(name: str, refused: dict[str, str]) -> Optional[str]:
    """Why extraArgs may not hold flag `name` (without '--'), or None; `refused`: flag -> reason.

    argparse (allow_abbrev, vLLM's default) takes any unambiguous prefix of a flag for the flag,
    so every prefix of a refused flag is refused too.
    """
    name = "--" + name.replace("_", "-")
    for flag, reason in refused.items():
        if flag.startswith(name):
            subject = flag if name == flag else f"vLLM takes {name} for {flag}"
            return f"a flag twinspark does not own ({subject}: {reason})"
    return None


def _short_flag_refusal(token: str) -> Optional[str]:
    short = _SHORT_FLAG.fullmatch(token)
    if not short or short["name"] not in SHORT_FLAGS:
        return None
    flag = SHORT_FLAGS[short["name"]]
    return f"a flag twinspark does not own ({short['name']} is {flag}: {FLAGS_NOT_IN_EXTRA_ARGS[flag]})"


def extra_args_problem(extra_args: list[str], refused: dict[str, str]) -> Optional[tuple[int, str, str]]:
    """The first token extraArgs may not hold, as (its index, the token as shown, what is expected); None if none."""
    expect_value = False
    for i, token in enumerate(extra_args):
        flag = _FLAG.fullmatch(token)
        if flag:
            refusal = _flag_refusal(flag["name"], refused)
            if refusal:  # the value is left out: it may be the very secret that belongs elsewhere
                shown = token if flag["value"] is None else token.split("=", 1)[0] + "=(value not shown)"
                return i, shown, refusal
            expect_value = flag["value"] is None
        elif expect_value and not token.startswith("-"):
            expect_value = False
        elif refusal := _short_flag_refusal(token):
            return i, token.split("=", 1)[0], refusal
        else:
            return i, repr(token), "'--flag', '--flag=value', or a value right after a '--flag'"
    return None
