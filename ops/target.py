"""Where the day-2 tools point: the stack's outputs, or flags that stand in for them."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import httpx
from pydantic import TypeAdapter, ValidationError

from core import recipes

from .api import Node, StackOutputs, first_problem, served_models
from .inputs import EndpointError, InputError, one_line, read_json_file


class TargetError(InputError):
    """The tools cannot tell which endpoint to talk to; the message says what to pass."""


@dataclass
class Target:
    endpoint: str  # .../v1
    api_key: str
    model: str
    nodes: list[dict[str, Any]] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    ssh_user: Optional[str] = None
    fabric: dict[str, Any] = field(default_factory=dict)  # {"mtu": .., "linkSpeedMbps": ..}
    recipe: Optional[str] = None  # the serving recipe's name: the stack's `recipe` output or --recipe
    lane: Optional[str] = None  # of a stack with several lanes: the one serving `model`
    max_model_len: Optional[int] = None  # the served model's context, as check_endpoint found it

    @property
    def base_url(self) -> str:
        return self.endpoint.rstrip("/").removesuffix("/v1")


def add_target_arguments(parser: argparse.ArgumentParser, endpoint: bool = True, nodes: bool = False) -> None:
    """The stack's flags, and those that stand in for its outputs: the endpoint's (`endpoint`),
    the nodes' (`nodes`); a tool offers only the ones it reads."""
    group = parser.add_argument_group("target (default: the outputs of the current Pulumi stack; the flags below "
                                      "stand in for them)")
    group.add_argument("--stack", help="Pulumi stack to read outputs from")
    add_project_dir_argument(group)
    group.add_argument("--outputs-file", help="a saved `pulumi stack output --json --show-secrets`")
    if endpoint:
        group.add_argument("--endpoint", help="OpenAI base URL, e.g. http://192.168.1.10:8000/v1")
        group.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"), help="default: $VLLM_API_KEY")
        group.add_argument("--model", help="served model name (default: the stack's `model` output, its head's lane; "
                                           "else the first one /v1/models lists)")
    if nodes:
        group.add_argument("--nodes", help="JSON list of nodes as in the `nodes` stack output")


CHECKOUT = Path(__file__).resolve().parent.parent  # an installed `twinspark`'s copy holds no Pulumi.yaml


def add_project_dir_argument(parser) -> None:
    parser.add_argument("--project-dir", type=Path, help="the Pulumi project (its Pulumi.yaml) whose stacks to read "
                                                         "(default: the current directory if it is one, else the "
                                                         "checkout these tools run from)")


def project_dir(args: argparse.Namespace) -> Path:
    """--project-dir, else the current directory where it is a Pulumi project, else the checkout these tools
    came from: run from a checkout, they find its stacks from anywhere."""
    if getattr(args, "project_dir", None):
        return args.project_dir
    for candidate in (Path.cwd(), CHECKOUT):
        if (candidate / "Pulumi.yaml").is_file():
            return candidate
    return Path.cwd()


def pulumi_command(args: argparse.Namespace, *words: str) -> list[str]:
    """`pulumi WORDS` in the project's directory, for --stack's stack if given."""
    stack = getattr(args, "stack", None)
    return ["pulumi", *words, "--cwd", str(project_dir(args))] + (["--stack", stack] if stack else [])


def add_recipe_argument(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--recipe", help=f"the serving recipe, by name, for {what} (default: the stack's `recipe` "
                                         "output)")


def stack_outputs(args: argparse.Namespace) -> dict[str, Any]:
    command = pulumi_command(args, "stack", "output", "--json", "--show-secrets")
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise TargetError("the Pulumi CLI is not on PATH (README, Prerequisites; the simulator's: "
                          "eval \"$(scripts/sim.sh env)\"), so no stack can be read") from None
    except subprocess.TimeoutExpired:
        raise TargetError(f"`{' '.join(command)}` did not answer in 120 s") from None
    if "no Pulumi.yaml project file found" in proc.stderr:
        raise TargetError(f"{project_dir(args)} is not the Pulumi project (no Pulumi.yaml), so no stack can be read: "
                          "run inside your checkout, or pass --project-dir")
    if proc.returncode != 0:
        raise TargetError(f"`{' '.join(command)}` failed: {one_line(proc.stderr.strip()[-500:])}")
    return parse_outputs(proc.stdout, f"`{' '.join(command)}`")


def exported_resources(args: argparse.Namespace) -> dict[str, dict]:
    """{resource name: its state} from `pulumi stack export --show-secrets`; empty where no stack can
    be read (the tools that use it do without: a repair command's URNs, the last NCCL figure)."""
    command = pulumi_command(args, "stack", "export", "--show-secrets")
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
        resources = json.loads(proc.stdout)["deployment"]["resources"] if proc.returncode == 0 else []
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError):
        return {}
    return {r["urn"].rsplit("::", 1)[-1]: r for r in resources if isinstance(r, dict) and "urn" in r}


def read_outputs_file(path: str) -> dict[str, Any]:
    return check_outputs(read_json_file(path, "--outputs-file"), f"--outputs-file {path}")


def parse_outputs(text: str, source: str) -> dict[str, Any]:
    try:
        outputs = json.loads(text)
    except json.JSONDecodeError as err:
        raise TargetError(f"{source}: not JSON ({err.msg}, line {err.lineno})") from None
    return check_outputs(outputs, source)


def check_outputs(outputs: Any, source: str) -> dict[str, Any]:
    """The outputs as a dict, each one the tools read of the type they expect."""
    try:
        StackOutputs.model_validate(outputs)
    except ValidationError as err:
        raise TargetError(f"{source}: not `pulumi stack output --json --show-secrets` ({first_problem(err)})") from None
    return outputs


def parse_nodes(text: str) -> list[dict[str, Any]]:
    try:
        TypeAdapter(list[Node]).validate_json(text)  # refuses what is not a node list; the JSON is returned as given
    except ValidationError as err:
        problem = first_problem(err)
        if err.errors()[0]["type"] == "json_invalid":
            problem = "not JSON"
        raise TargetError(f"--nodes: {problem}; pass the `nodes` stack output "
                          "(a JSON list of {name, role, host, rayIp, rails: [{iface, hca}]})") from None
    return json.loads(text)


def check_endpoint(target: Target, timeout: float = 10.0) -> str:
    """Before bench or needle spend minutes: the endpoint answers, takes the key and serves the
    model. Returns the model to ask for: the one given, else the first one served."""
    url = f"{target.base_url}/v1/models"
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    try:
        resp = httpx.get(url, headers=headers, timeout=timeout)
    except httpx.HTTPError as err:
        raise EndpointError(f"cannot reach {url}: {type(err).__name__}: {one_line(str(err))}") from None
    if resp.status_code in (401, 403):
        raise EndpointError(f"{url} refused the API key (HTTP {resp.status_code}): pass --api-key or set VLLM_API_KEY")
    if resp.status_code != 200:
        raise EndpointError(f"{url} answered HTTP {resp.status_code}: {one_line(resp.text[:200])}")
    try:
        models = served_models(resp.content)
    except ValueError as err:
        raise EndpointError(f"{url} answered {err}") from None
    if target.model and target.model not in models:
        raise EndpointError(f"{url} does not serve {target.model!r} (it serves {', '.join(models)}): pass --model")
    model = target.model or next(iter(models))
    target.max_model_len = models[model]
    return model


def flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def resolve_target(args: argparse.Namespace, stands_in: Sequence[str] = ("endpoint", "api_key")) -> Target:
    """Flags win over stack outputs. `stands_in`: the flags (argparse dests) that together say all the
    tool reads: the stack is read only when one of them is missing, and where it cannot be read
    the error names those missing. A tool without `endpoint` among them never needs one; one with
    `nodes` needs nodes and exactly one head."""
    outputs: dict[str, Any] = {}
    missing = [flag(dest) for dest in stands_in if not getattr(args, dest, None)]
    if args.outputs_file:
        outputs = read_outputs_file(args.outputs_file)
    elif missing or not stands_in:
        try:
            outputs = stack_outputs(args)
        except TargetError as err:
            raise TargetError(f"{err}: pass {' and '.join(missing)}, or run inside the Pulumi project"
                              if missing else str(err)) from None
    endpoint = getattr(args, "endpoint", None) or outputs.get("endpoint") or ""
    if "endpoint" in stands_in:
        if not endpoint:
            raise TargetError("no endpoint: pass --endpoint http://HEAD:8000/v1 or run inside the Pulumi project")
        if not endpoint.startswith(("http://", "https://")):
            raise TargetError(f"endpoint {endpoint!r} is not an http:// or https:// URL")
    nodes = parse_nodes(args.nodes) if getattr(args, "nodes", None) else outputs.get("nodes") or []
    if "nodes" in stands_in:
        if not nodes:
            raise TargetError("no nodes: pass --nodes '[{\"name\":...,\"role\":...,\"host\":...,\"rayIp\":...,\"rails\":[...]}]'")
        heads = [n["name"] for n in nodes if n["role"] == "head"]
        if len(heads) != 1:
            raise TargetError(f"nodes: expected exactly one with role head, found {len(heads)}")
    model = getattr(args, "model", None) or outputs.get("model") or ""
    # a lane's recipe where the model is one of the stack's lanes (a flag's --endpoint is not the stack's)
    lane, lane_recipe = lane_serving(outputs, model) if endpoint == outputs.get("endpoint") else (None, None)
    return Target(
        endpoint=endpoint,
        api_key=getattr(args, "api_key", None) or outputs.get("apiKey") or "",
        model=model,
        nodes=nodes,
        outputs=outputs,
        ssh_user=outputs.get("sshUser"),
        fabric=outputs.get("fabric") or {},
        recipe=getattr(args, "recipe", None) or lane_recipe or outputs.get("recipe"),
        lane=lane,
    )


def lane_serving(outputs: dict[str, Any], model: str) -> tuple[Optional[str], Optional[str]]:
    """The lane of a stack with several that serves `model`, and its recipe; (None, None) for a stack of one
    lane. TargetError naming every lane's model where none serves it."""
    lanes = outputs.get("lanes") or {}
    if not lanes or not model:
        return None, None
    for name, lane in lanes.items():
        if lane["model"] == model:
            return name, lane["recipe"]
    served = ", ".join(f"{lane['model']} (lane {name})" for name, lane in lanes.items())
    raise TargetError(f"--model {model!r}: no lane of the stack serves it; it serves {served}: pass one of them")


def target_recipe(target: Target, default: Optional[str] = None) -> recipes.Recipe:
    """The recipe the target serves (--recipe, else the stack's `recipe` output, else `default`);
    TargetError naming the catalog when there is none or it is not one of recipes/."""
    name = target.recipe or default
    if not name:
        raise TargetError(f"no recipe: pass --recipe NAME (one of {', '.join(recipes.catalog())}), or run inside the "
                          "Pulumi project of a stack that has the `recipe` output")
    try:
        return recipes.recipe_named(name)
    except recipes.RecipeError as err:
        raise TargetError(f"recipe {name!r}: {err}") from None


def target_from_outputs(outputs: dict[str, Any], source: str, model: Optional[str] = None) -> Target:
    """The stack's own endpoint, key, model, nodes and SSH user, nothing overridden; `model`: one lane's
    of a stack with several (its recipe too; TargetError naming the lanes where none serves it)."""
    outputs = check_outputs(outputs, source)
    missing = [key for key in ("endpoint", "apiKey", "model", "nodes", "sshUser") if not outputs.get(key)]
    if missing:
        raise TargetError(f"{source}: no {', '.join(missing)} (has the stack been deployed with `pulumi up`?)")
    lane, lane_recipe = lane_serving(outputs, model) if model else (None, None)
    return Target(endpoint=outputs["endpoint"], api_key=outputs["apiKey"], model=model or outputs["model"],
                  nodes=outputs["nodes"], outputs=outputs, ssh_user=outputs["sshUser"],
                  fabric=outputs.get("fabric") or {}, recipe=lane_recipe or outputs.get("recipe"), lane=lane)


def engine_head(target: Target) -> dict[str, Any]:
    """The node whose guard watches the target's engine: the stack's head, or its lane's head (the `lanes`
    output names it)."""
    head = (target.outputs.get("lanes") or {}).get(target.lane, {}).get("head") if target.lane else None
    return next(n for n in target.nodes if (n["name"] == head if head else n["role"] == "head"))


@dataclass
class StatusExpectations:
    ssh_user: str
    mtu: int
    speed_mbps: int


def ssh_user(args: argparse.Namespace, target: Target) -> str:
    user = args.ssh_user or target.ssh_user
    if not user:
        raise TargetError("the stack outputs do not say --ssh-user: pass --ssh-user (or run inside the Pulumi project)")
    return user


def status_expectations(args: argparse.Namespace, target: Target) -> StatusExpectations:
    """The SSH user and what every rail must show: from the stack, flags overriding."""
    values = {
        "--ssh-user": args.ssh_user or target.ssh_user,
        "--expect-mtu": args.expect_mtu or target.fabric.get("mtu"),
        "--expect-speed-mbps": args.expect_speed_mbps or target.fabric.get("linkSpeedMbps"),
    }
    missing = [flag for flag, value in values.items() if not value]
    if missing:
        raise TargetError(f"the stack outputs do not say {', '.join(missing)}: pass "
                          + " and ".join(missing) + " (or run inside the Pulumi project)")
    return StatusExpectations(*values.values())  # type: ignore[arg-type]  # every one set: `missing` refused the rest
