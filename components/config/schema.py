"""The whole stack config, StackConfig: the blocks (blocks.py) and the rules that span them.

One head; names, machines and rails distinct; a former name no node has now; the rails cabled as
fabric.topology says (direct, switch: rail N of every node in one subnet of its own; ring: each
link's two ends in one subnet of its own), apart from the LAN; the configured ports apart from each
other and the monitoring's; as many nodes as the recipe supports; TP × PP spanning the nodes, in a
layout the model splits over.
"""

from __future__ import annotations

import functools
import importlib.util
import ipaddress
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from pydantic import BaseModel, Field, model_validator
from pydantic.alias_generators import to_camel, to_snake

from core import contract

from core.memory_budget import BudgetError, MemoryBudget
from core.memory_budget import memory_budget as budget_of

from .blocks import (LANE_SERVING_KEYS, ConfigBlock, Fabric, LaneConfig, ModelConfig, Node, Observability, PlatformConfig,
                     PowerWatch, Serving, SshConfig)
from .errors import CrossFieldError

STRUCTURED_KEYS = ("ssh", "nodes", "fabric", "serving")
# omitted: the block's defaults; `model` xor `lanes` (StackConfig._one_model_or_lanes)
OPTIONAL_STRUCTURED_KEYS = ("model", "lanes", "observability", "platform", "powerWatch")
DEFAULT_LANE = "default"  # the one lane of a stack without `lanes`: its name appears in no resource


@dataclass(frozen=True)
class ServedLane:
    """One engine: a model served on some nodes with the lane keys of `serving` (issue 41). A stack
    without `lanes` has one, of `model` and `serving` on every node, whose keys are named as before."""

    name: str
    nodes: tuple[Node, ...]
    model: ModelConfig
    serving: Serving
    prefix: str  # where its keys are in the stack config: "" or "lanes[i]."

    def key(self, path: str) -> str:
        """A key path of the lane as the user wrote it: 'serving.tensorParallel' -> 'lanes[1].serving.tensorParallel'."""
        return self.prefix + path

    @property
    def nodes_key(self) -> str:
        return self.key("nodes")

    @property
    def world_size(self) -> int:
        return len(self.nodes)  # one GB10 GPU per Spark: one rank each

    @property
    def pipeline_parallel_size(self) -> int:
        return self.serving.pipeline_parallel

    @property
    def tensor_parallel_size(self) -> int:
        """serving.tensorParallel, or unset the lane's node count ÷ PP (its node count without PP)."""
        return self.serving.tensor_parallel or self.world_size // self.pipeline_parallel_size

    @property
    def model_revision(self) -> Optional[str]:
        """The commit to serve: model.revision, else the one serving.recipe was proven at when
        model.repo is the recipe's repository; None: the hub's at the first `pulumi up`, kept."""
        recipe = self.serving.recipe_spec
        return self.model.revision or (recipe.revision if self.model.repo == recipe.repo else None)

    @property
    def parallelism_warning(self) -> Optional[str]:
        """PP on a recipe proven without it: allowed (it is what 3 nodes may need), said out loud."""
        recipe = self.serving.recipe_spec
        if self.pipeline_parallel_size == 1 or "pp" in recipe.parallelism:
            return None
        return (f"{self.key('serving.pipelineParallel')} {self.pipeline_parallel_size}: recipe {recipe.name} was "
                f"proven with {', '.join(recipe.parallelism)} only, not pipeline parallelism: its flags (speculative "
                "decoding above all) and its baseline are unproven at this layout; vLLM refuses at load what it cannot "
                "run")

    @property
    def remote_code_warning(self) -> Optional[str]:
        """Another repository than the recipe's, its code run, no commit set: said out loud."""
        recipe = self.serving.recipe_spec
        if not recipe.vllm.trust_remote_code or self.model.repo == recipe.repo or self.model.revision:
            return None
        return (f"{self.key('serving.recipe')} {recipe.name} runs the model's own code (--trust-remote-code) and "
                f"{self.key('model.revision')} is unset: {self.model.repo}'s code as the hub serves it at the first "
                "`pulumi up` runs as root on every node; set it to a commit you have reviewed")

    @property
    def recipe_repo_warning(self) -> Optional[str]:
        """model.repo is not the repository the chosen recipe was proven on: said, not refused (a
        fine-tune or a mirror of the same model is served with the recipe's flags on purpose)."""
        recipe = self.serving.recipe_spec
        if self.model.repo == recipe.repo:
            return None
        return (f"{self.key('model.repo')} {self.model.repo} is not {recipe.repo}, the repository of "
                f"{self.key('serving.recipe')} {recipe.name}: the recipe's flags, environment and parsers are applied "
                f"to {self.model.repo} as they are; choose the recipe made for it if there is one (see Models in "
                "docs/configuration.md)")

    @property
    def warnings(self) -> list[str]:
        """What is allowed and said out loud, in this order."""
        return [w for w in (self.recipe_repo_warning, self.parallelism_warning, self.remote_code_warning) if w]

class StackConfig(ConfigBlock):
    ssh: SshConfig
    nodes: list[Node] = Field(min_length=1)
    fabric: Fabric
    # the field's name is not `model`: the property `model` is the one lane's (pydantic reserves model_*)
    single_model: Optional[ModelConfig] = Field(default=None, alias="model")
    serving: Serving
    lanes: Optional[list[LaneConfig]] = Field(default=None, min_length=1)
    observability: Observability = Field(default_factory=Observability)
    platform: PlatformConfig = Field(default_factory=PlatformConfig)
    power_watch: PowerWatch = Field(default_factory=PowerWatch)

    @model_validator(mode="before")
    @classmethod
    def _lanes_over_the_stack_serving(cls, data: Any) -> Any:
        """Each lane's `serving`: the stack's keys as written, the lane's own lane keys over them
        (validated as one `serving` block, so the lane's recipe fills what neither sets)."""
        if not isinstance(data, dict) or not isinstance(data.get("lanes"), list):
            return data
        stack = data["serving"] if isinstance(data.get("serving"), dict) else {}
        lanes = []
        for i, lane in enumerate(data["lanes"]):
            own = lane.get("serving", {}) if isinstance(lane, dict) else None
            if not isinstance(own, dict):
                lanes.append(lane)  # not a mapping: pydantic says what is expected
                continue
            for key in own:
                if to_camel(key) not in LANE_SERVING_KEYS:
                    raise CrossFieldError(f"lanes[{i}].serving.{key}", repr(own[key]),
                                          f"a lane key ({', '.join(LANE_SERVING_KEYS)}); serving.{to_camel(key)} is "
                                          "the stack's, one for every lane: set it under serving")
            lanes.append({**lane, "serving": {**stack, **own}})
        return {**data, "lanes": lanes}

    @property
    def served_lanes(self) -> list[ServedLane]:
        """Every engine the stack serves: its `lanes`, or the one lane of `model` and `serving` on every node."""
        if self.lanes is None:
            assert self.single_model is not None  # _one_model_or_lanes
            return [ServedLane(DEFAULT_LANE, tuple(self.nodes), self.single_model, self.serving, "")]
        by_name = {n.name: n for n in self.nodes}
        return [ServedLane(lane.name, tuple(by_name[name] for name in lane.nodes), lane.model, lane.serving,
                           f"lanes[{i}].") for i, lane in enumerate(self.lanes)]

    @property
    def only_lane(self) -> ServedLane:
        """The lane of a stack that serves one (what the program deploys until several are wired)."""
        lanes = self.served_lanes
        if len(lanes) != 1:
            raise ValueError(f"{len(lanes)} lanes: this part of twinspark serves one")
        return lanes[0]

    @property
    def model(self) -> ModelConfig:
        return self.only_lane.model

    @property
    def head(self) -> Node:
        return next(n for n in self.nodes if n.role == "head")

    @property
    def workers(self) -> list[Node]:
        return [n for n in self.nodes if n.role == "worker"]

    @property
    def world_size(self) -> int:
        return self.only_lane.world_size

    @property
    def members(self) -> str:
        """The cluster's machines (their LAN hosts, sorted): what a role swap or a rename keeps, and
        a node added or taken out changes."""
        return ",".join(sorted(n.host for n in self.nodes))

    @property
    def pipeline_parallel_size(self) -> int:
        return self.only_lane.pipeline_parallel_size

    @property
    def tensor_parallel_size(self) -> int:
        return self.only_lane.tensor_parallel_size

    @property
    def parallelism_in_words(self) -> str:
        tp, pp, n = self.tensor_parallel_size, self.pipeline_parallel_size, self.world_size
        if pp == 1:
            return f"tensor parallel over {n} DGX Sparks"
        return f"{'' if tp == 1 else f'tensor parallel {tp} × '}pipeline parallel {pp} over {n} DGX Sparks"

    @property
    def warnings(self) -> list[str]:
        """Every lane's allowed-but-said choices (a recipe on another repository, PP unproven, remote code unpinned)."""
        return [w for lane in self.served_lanes for w in lane.warnings]

    @property
    def several_lanes(self) -> bool:
        return len(self.served_lanes) > 1

    def lane_head(self, lane: ServedLane) -> Node:
        """Where the lane's engine and gateway run: the stack's head when the lane has it, else its first node."""
        return self.head if self.head in lane.nodes else lane.nodes[0]

    @property
    def head_lane(self) -> ServedLane:
        """The lane the stack's head heads (every node is in a lane, and a lane with the head is headed there)."""
        return next(lane for lane in self.served_lanes if self.lane_head(lane) == self.head)

    def lane_view(self, lane: ServedLane) -> "StackConfig":
        """The stack as the lane's engine sees it: its nodes (its head the head), model and serving; with several
        lanes its gateway on contract.LANE_GATEWAY_PORT, behind the head's front. One lane: the stack itself."""
        if not self.several_lanes:
            return self
        head = self.lane_head(lane)
        nodes = [n.model_copy(update={"role": "head" if n == head else "worker"}) for n in lane.nodes]
        serving = lane.serving.model_copy(update={"port": contract.LANE_GATEWAY_PORT})
        return self.model_copy(update={"nodes": [nodes[lane.nodes.index(head)], *(n for n in nodes if n.role == "worker")],
                                       "single_model": lane.model, "serving": serving, "lanes": None})

    def client_view(self, lane: ServedLane) -> "StackConfig":
        """The stack as a client of `lane` sees it: every node, the lane's model and serving at serving.port."""
        if not self.several_lanes:
            return self
        return self.model_copy(update={"single_model": lane.model, "lanes": None,
                                       "serving": lane.serving.model_copy(update={"port": self.serving.port})})

    @property
    def client_views(self) -> list["StackConfig"]:
        """What clients are told, one view a lane: the head's lane first (their default), then the others in
        `lanes` order."""
        head = self.head_lane
        return [self.client_view(lane) for lane in (head, *(lane for lane in self.served_lanes if lane.name != head.name))]

    @property
    def hub_endpoints(self) -> dict[str, str]:
        """Each lane's model.hubEndpoint, by its key (where the HF token goes)."""
        return {lane.key("model.hubEndpoint"): lane.model.hub_endpoint for lane in self.served_lanes}

    def lanes_on(self, node: Node) -> list[ServedLane]:
        return [lane for lane in self.served_lanes if node in lane.nodes]

    def node_memory_budget(self, node: Node) -> MemoryBudget:
        """The node's budget (core/memory_budget.py): its lanes' shares together; validated, so it adds up."""
        # rounded to the budget's basis points: 0.45 + 0.40 is 0.8500000000000001 in floats
        lanes = self.lanes_on(node)
        return budget_of(round(sum(lane.serving.gpu_memory_utilization for lane in lanes), 4),
                         self.serving.cotenant_memory_max, sum(lane.serving.kv_tier_gib for lane in lanes))

    @property
    def head_public_ports_by_key(self) -> dict[str, int]:
        """Every configured port in use, by its key: what the head serves to the LAN."""
        ports = {"serving.port": self.serving.port}
        if self.observability.enabled:
            ports["observability.grafanaPort"] = self.observability.grafana_port
        return ports

    @property
    def head_public_ports(self) -> tuple[int, ...]:
        """What the head serves to the LAN (the host firewall opens these and SSH, nothing else)."""
        return tuple(self.head_public_ports_by_key.values())

    @model_validator(mode="after")
    def _cross_field_rules(self) -> "StackConfig":
        heads = [i for i, n in enumerate(self.nodes) if n.role == "head"]
        if len(heads) != 1:
            raise CrossFieldError(
                "nodes", f"{len(heads)} nodes have role head", "exactly one node with role: head"
            )
        _require_distinct(self.nodes, "nodes", "name")
        self._former_names_are_free()
        self._one_node_per_machine()
        rail_counts = {len(n.rails) for n in self.nodes}
        if len(rail_counts) != 1:
            raise CrossFieldError(
                "nodes", f"rail counts {sorted(rail_counts)}", "the same number of rails on every node"
            )
        for i, node in enumerate(self.nodes):
            for r, rail in enumerate(node.rails):
                if rail.iface == self.fabric.bootstrap_iface:
                    raise CrossFieldError(
                        f"nodes[{i}].rails[{r}].iface", rail.iface,
                        "a QSFP interface, not fabric.bootstrapIface (the LAN port SSH uses: the rails' netplan "
                        "would switch its DHCP off)")
            _require_distinct(node.rails, f"nodes[{i}].rails", "iface")
            _require_distinct(node.rails, f"nodes[{i}].rails", "hca")
        self._rails_fit_the_topology()
        if len(self.nodes) == 1 and self.fabric.min_bus_bandwidth_gbps > 0:
            raise CrossFieldError(
                "fabric.minBusBandwidthGBps", self.fabric.min_bus_bandwidth_gbps,
                "0 on a single-node stack (NcclCheck measures the cable between nodes; alone, it can never pass)")
        self._configured_ports_apart()
        self._one_model_or_lanes()
        for lane in self.served_lanes:
            self._nodes_the_recipe_supports(lane)
            self._remote_code_is_pinned(lane)
            self._parallelism_spans_the_nodes(lane)
            self._layout_splits_the_model(lane)
            self._kv_tier_on_one_node(lane)
        self._memory_budget_of_every_node_adds_up()
        return self

    def _one_model_or_lanes(self) -> None:
        """`model` (one lane on every node) or `lanes`; lanes named apart, served apart, each on nodes of the stack,
        and every node serving one."""
        if self.lanes is None:
            if self.single_model is None:
                raise CrossFieldError("model", "missing", "the model block of the config contract (see "
                                      "Pulumi.spark.yaml), or `lanes`, each with its own model")
            return
        if self.single_model is not None:
            raise CrossFieldError("model", self.single_model.repo, "no `model` beside `lanes`: each lane names its "
                                  "own (lanes[N].model); move this one into the lane that serves it")
        _require_distinct(self.lanes, "lanes", "name")
        names = [n.name for n in self.nodes]
        served: dict[str, int] = {}
        for i, lane in enumerate(self.lanes):
            for j, name in enumerate(lane.nodes):
                if name not in names:
                    raise CrossFieldError(f"lanes[{i}].nodes[{j}]", name, f"the name of a node: {' or '.join(names)}")
                if name in lane.nodes[:j]:
                    raise CrossFieldError(f"lanes[{i}].nodes[{j}]", name, "each node once (one rank on its GPU)")
            holder = next((k for k, other in enumerate(self.lanes[:i]) if other.model.dir == lane.model.dir), None)
            if holder is not None and (self.lanes[holder].model.repo, self.lanes[holder].model.revision) != \
                    (lane.model.repo, lane.model.revision):
                raise CrossFieldError(f"lanes[{i}].model.dir", lane.model.dir,
                                      f"a directory other than lanes[{holder}].model.dir: it holds "
                                      f"{self.lanes[holder].model.repo} (one directory, one checkout of one commit)")
            j = served.setdefault(lane.model.served_name, i)
            if j != i:
                raise CrossFieldError(f"lanes[{i}].model.servedName", lane.model.served_name,
                                      f"a name other than lanes[{j}]'s: requests go to the lane whose name they ask for")
        idle = [n for n in names if not any(n in lane.nodes for lane in self.lanes)]
        if idle:
            raise CrossFieldError("lanes", f"no lane on {', '.join(idle)}",
                                  "every node in some lane's nodes (or take the node out of `nodes`)")

    def _memory_budget_of_every_node_adds_up(self) -> None:
        """A node's lanes together: their shares + the co-tenants' caps + headroom <= its memory (one lane's own
        budget is its `serving`'s check, named there)."""
        for node in self.nodes:
            lanes = self.lanes_on(node)
            if len(lanes) < 2:
                continue
            try:
                self.node_memory_budget(node)
            except BudgetError as err:
                shares = " + ".join(f"lane {lane.name} {lane.serving.gpu_memory_utilization:g}" +
                                    (f" (kvTier {lane.serving.kv_tier_gib} GiB)" if lane.serving.kv_tier_gib else "")
                                    for lane in lanes)
                raise CrossFieldError(lanes[-1].key("serving.gpuMemoryUtilization"),
                                      f"{node.name} holds {shares}",
                                      f"shares that fit {node.name} together: {err}") from None

    @staticmethod
    def _kv_tier_on_one_node(lane: ServedLane) -> None:
        """vLLM 0.24.0's file tier holds the KV blocks of the ranks on the head's host only (core/kv_tier.py)."""
        if lane.serving.kv_tier is not None and len(lane.nodes) > 1:
            raise CrossFieldError(lane.key("serving.kvTier"), f"set on {lane.name}, served by {len(lane.nodes)} nodes",
                                  "no kvTier on a lane over several nodes (vLLM 0.24.0's KV tier keeps the head's ranks' "
                                  "blocks only: every other node's would be lost or wrong after a restart); set it on a "
                                  "lane of one node (`lanes`)")

    @staticmethod
    def _parallelism_spans_the_nodes(lane: ServedLane) -> None:
        """One rank per node: TP × PP = the lane's node count, or a rank has no GPU (or a GPU no rank)."""
        n, pp, tp_set = lane.world_size, lane.pipeline_parallel_size, lane.serving.tensor_parallel
        rules = shape_rules()
        layouts = " or ".join(rules.layout_option(t, p) for t, p in rules.layouts_of(n))
        if tp_set is None and n % pp:
            raise CrossFieldError(lane.key("serving.pipelineParallel"), pp,
                                   f"a pipelineParallel that divides the node count {n} (tensorParallel, unset, is "
                                   f"the node count ÷ pipelineParallel): with {n} nodes set {layouts}")
        if lane.tensor_parallel_size * pp != n:
            assert tp_set is not None  # unset, TP is n ÷ pp, which the check above found whole
            key = lane.key("serving.tensorParallel" if "pipeline_parallel" not in lane.serving.model_fields_set
                           else "serving.pipelineParallel")
            raise CrossFieldError(key, f"tensorParallel {tp_set} × pipelineParallel {pp} = {tp_set * pp} ranks on "
                                   f"{n} nodes",
                                   f"tensorParallel × pipelineParallel = {n}, the node count (one rank on each "
                                   f"node's GPU): with {n} nodes set {layouts}")

    @staticmethod
    def _layout_splits_the_model(lane: ServedLane) -> None:
        """Where the recipe records its model's shape, a TP × PP it cannot split stops here,
        before any resource, with the layouts that work (the rules: launch/model-shape.py's)."""
        recipe = lane.serving.recipe_spec
        if recipe.shape is None or lane.model.repo != recipe.repo:  # another model: judged after the pin
            return
        shape, tp, pp = recipe.shape.as_config_json(), lane.tensor_parallel_size, lane.pipeline_parallel_size
        rules = shape_rules()
        fails = [line.removeprefix("FAIL ") for line in rules.head_lines(shape, tp, pp) if line.startswith("FAIL")]
        if not fails:
            return
        n = lane.world_size
        works = [rules.layout_option(t, p) for t, p in rules.workable_layouts(shape, n)]
        key = lane.key("serving.pipelineParallel" if all(f.startswith("hidden layers") for f in fails) else
                       "serving.tensorParallel")
        advice = (f"with {n} nodes set {' or '.join(works)}" if works else
                  f"no TP × PP of {n} nodes splits it: another node count")
        figures = (f"{recipe.shape.attention_heads} attention heads, {recipe.shape.kv_heads or 'one per head'} KV "
                   f"heads{', latent' if recipe.shape.kv_lora_rank else ''}, {recipe.shape.hidden_layers} layers")
        raise CrossFieldError(key, f"TP={tp} × PP={pp} on {n} nodes: " + "; ".join(fails),
                               f"a layout model {recipe.repo} splits over (recipe {recipe.name}'s shape: {figures}): "
                               f"{advice}")

    @staticmethod
    def _nodes_the_recipe_supports(lane: ServedLane) -> None:
        """As many nodes as the recipe was proven on: TP × PP spans the lane's nodes (world_size)."""
        recipe = lane.serving.recipe_spec
        if not recipe.nodes.min <= lane.world_size <= recipe.nodes.max:
            span = (f"{recipe.nodes.min}" if recipe.nodes.min == recipe.nodes.max
                    else f"{recipe.nodes.min} to {recipe.nodes.max}")
            raise CrossFieldError(lane.nodes_key, f"{lane.world_size} nodes",
                                   f"{span} nodes, what serving.recipe {recipe.name} supports (its nodes in recipes/), "
                                   "or a recipe made for this many")

    @property
    def model_revision(self) -> Optional[str]:
        return self.only_lane.model_revision

    @staticmethod
    def _remote_code_is_pinned(lane: ServedLane) -> None:
        """`--trust-remote-code` runs the repository's Python as root on every node: only at a
        commit someone chose, never whatever the hub serves on the day of the first `pulumi up`."""
        recipe = lane.serving.recipe_spec
        if recipe.vllm.trust_remote_code and lane.model.repo == recipe.repo and lane.model_revision is None:
            raise CrossFieldError(
                lane.key("model.revision"), f"unset, and serving.recipe {recipe.name} runs {lane.model.repo}'s own code "
                f"(--trust-remote-code: {recipe.vllm.trust_remote_code_reason}) with no commit recorded",
                "the 40-hex commit of that repository you have reviewed (its code then runs at that commit only)")

    def _former_names_are_free(self) -> None:
        """A formerName becomes aliases to the resources of that name (components/renames.py): one
        node's, and none that a node of the stack still declares under its own name."""
        names = {n.name: i for i, n in enumerate(self.nodes)}
        former: dict[str, int] = {}
        for i, node in enumerate(self.nodes):
            old = node.former_name
            if old is None:
                continue
            path = f"nodes[{i}].formerName"
            if old == node.name:
                raise CrossFieldError(path, old, "the name this node had until now, not its name now (remove "
                                       "formerName once the rename's `pulumi up` is done)")
            if old in names:
                raise CrossFieldError(path, old, f"a name no node has now, not nodes[{names[old]}].name (its "
                                       "resources would be claimed by both)")
            if old in former:
                raise CrossFieldError(path, old, f"a formerName different from nodes[{former[old]}].formerName "
                                       "(one node had that name)")
            former[old] = i

    def _one_node_per_machine(self) -> None:
        """DNS names ignore case (an address has one spelling: HostName), so SPARK-A.local is spark-a.local."""
        seen: dict[str, int] = {}
        for i, node in enumerate(self.nodes):
            j = seen.setdefault(node.host.lower(), i)
            if j != i:
                other = self.nodes[j].host
                why = "" if other == node.host else " (DNS names ignore case: both name one machine)"
                raise CrossFieldError(f"nodes[{i}].host", node.host,
                                       f"a machine other than nodes[{j}].host {other!r}{why}")

    def _configured_ports_apart(self) -> None:
        """Each configured port is checked against what always listens by its field (Port); here
        against the monitoring's, while it is on, and against each other (the key blamed is one
        the user set, where only one of them is)."""
        ports = self.head_public_ports_by_key
        monitoring = contract.OBSERVABILITY_PORTS if self.observability.enabled else {}
        keys = list(ports)
        for i, key in enumerate(keys):
            owner = next((name for name, port in monitoring.items() if port == ports[key]), None)
            if owner:
                raise CrossFieldError(key, ports[key], f"a port other than {owner}'s, while observability is on")
            for other in keys[:i]:
                if ports[key] == ports[other]:
                    if self._set_by_user(other) and not self._set_by_user(key):
                        key, other = other, key
                    raise CrossFieldError(key, ports[key], f"a port other than {other}'s: both listen on the head")

    def _set_by_user(self, key: str) -> bool:
        block, field = key.split(".")
        return to_snake(field) in getattr(self, block).model_fields_set

    def _rails_fit_the_topology(self) -> None:
        """fabric.topology against the node count, then the rails' subnets against the cabling."""
        topology, n = self.fabric.topology, len(self.nodes)
        if topology == "direct" and n > 2:
            raise CrossFieldError("fabric.topology", f"direct with {n} nodes",
                                   "fabric.topology switch, or ring for three Sparks cabled to each other (direct is "
                                   "one cable between two Sparks)")
        if topology == "switch" and n < 2:
            raise CrossFieldError("fabric.topology", f"switch with {n} node",
                                   "2 or more nodes on a switch, or fabric.topology direct for a single Spark")
        if topology == "ring" and n != 3:
            other = ("direct for two Sparks (one cable)" if n < 3 else
                     "switch for four or more Sparks (a ring of four or more needs NCCL_ALGO=Ring and tensor "
                     "parallelism only; NVIDIA's setup refuses it, twinspark does not build it)")
            raise CrossFieldError("fabric.topology", f"ring with {n} nodes",
                                   f"exactly 3 nodes in a ring (three cables, every Spark cabled to both others), or "
                                   f"fabric.topology {other}")
        if topology == "ring":
            self._ring_rails_name_their_peers()
            self._ring_links_apart()
        else:
            for i, node in enumerate(self.nodes):
                for r, rail in enumerate(node.rails):
                    if rail.peer is not None:
                        raise CrossFieldError(
                            f"nodes[{i}].rails[{r}].peer", rail.peer,
                            f"no peer with fabric.topology {topology} (rail N of every node shares one subnet and "
                            "reaches every node); peer is for fabric.topology ring")
            self._rail_n_shares_a_subnet()
        self._rail_addresses_apart_from_each_other_and_the_lan()

    def _ring_rails_name_their_peers(self) -> None:
        """Every rail names another node, and every node has as many rails toward each."""
        names = [n.name for n in self.nodes]
        for i, node in enumerate(self.nodes):
            others = [m for m in names if m != node.name]
            for r, rail in enumerate(node.rails):
                path, choice = f"nodes[{i}].rails[{r}].peer", " or ".join(others)
                if rail.peer is None:
                    raise CrossFieldError(path, "unset", f"the node this rail's cable goes to, {choice} "
                                           "(fabric.topology ring: every rail names its peer)")
                if rail.peer == node.name:
                    raise CrossFieldError(path, rail.peer, f"another node than {node.name} itself: {choice}")
                if rail.peer not in names:
                    raise CrossFieldError(path, rail.peer, f"the name of another node: {choice}")
            counts = {m: sum(r.peer == m for r in node.rails) for m in others}
            if len(set(counts.values())) != 1:
                shown = ", ".join(f"{c} toward {m}" for m, c in counts.items())
                raise CrossFieldError(f"nodes[{i}].rails", shown,
                                       "as many rails toward each other node (in a ring every Spark has one cable to "
                                       "each other, two rails per cable)")

    def _ring_links_apart(self) -> None:
        """Rail k of node A toward B and rail k of B toward A: one subnet, that no other rail overlaps
        (two rails of a cable never share one: NVIDIA's connect-three-sparks README warns of routing
        ambiguity and NCCL failures)."""
        slots: dict[tuple[frozenset, int], tuple[str, ipaddress.IPv4Network]] = {}
        for i, node in enumerate(self.nodes):
            toward: dict[str, int] = {}
            for r, rail in enumerate(node.rails):
                assert rail.peer is not None  # _ring_rails_name_their_peers, run first, refuses an unset peer
                k = toward[rail.peer] = toward.get(rail.peer, -1) + 1
                slot, path = (frozenset((node.name, rail.peer)), k), f"nodes[{i}].rails[{r}]"
                if slot in slots:
                    twin, network = slots[slot]
                    if rail.network != network:
                        raise CrossFieldError(
                            f"{path}.address", rail.address,
                            f"an address in {network}, the subnet of {twin} (rail {k + 1} between {node.name} and "
                            f"{rail.peer}: the two ends of a link share one subnet)")
                    continue
                for other, network in slots.values():
                    if rail.network.overlaps(network):
                        raise CrossFieldError(
                            f"{path}.address", rail.address,
                            f"a subnet that does not overlap {other}'s {network} (another link: each rail of each "
                            "cable its own subnet)")
                slots[slot] = (path, rail.network)

    def _rail_n_shares_a_subnet(self) -> None:
        """Direct and switch: rail N of every node in one subnet of its own, apart from every other rail."""
        first = self.nodes[0].rails
        for r, rail in enumerate(first):  # node 0's first: every other node must match it
            for q in range(r):
                if rail.network.overlaps(first[q].network):
                    raise CrossFieldError(
                        f"nodes[0].rails[{r}].address", rail.address,
                        f"a subnet that does not overlap nodes[0].rails[{q}]'s {first[q].network} (each rail is "
                        "its own cable)")
        for i, node in enumerate(self.nodes):
            for r, rail in enumerate(node.rails):
                if rail.network != first[r].network:
                    raise CrossFieldError(
                        f"nodes[{i}].rails[{r}].address",
                        rail.address,
                        f"an address in {first[r].network} (rail {r} of every node shares one subnet, "
                        f"as nodes[0].rails[{r}] does)",
                    )

    def _rail_addresses_apart_from_each_other_and_the_lan(self) -> None:
        hosts = {}
        for j, node in enumerate(self.nodes):
            try:
                hosts[j] = ipaddress.IPv4Address(node.host)
            except ValueError:
                continue  # a DNS name: its address is not known here
        seen: dict[str, str] = {}
        for i, node in enumerate(self.nodes):
            for r, rail in enumerate(node.rails):
                path = f"nodes[{i}].rails[{r}].address"
                if rail.ip in seen:
                    raise CrossFieldError(path, rail.address, f"a rail address not already used by {seen[rail.ip]}")
                seen[rail.ip] = path
                for j, host in hosts.items():
                    if host in rail.network:
                        raise CrossFieldError(
                            path, rail.address,
                            f"a subnet apart from the LAN, without nodes[{j}].host {host} (SSH and the API would "
                            "be routed over the cable)")


@functools.cache
def shape_rules():
    """launch/model-shape.py, whose rules the node runs (stdlib only): one copy of vLLM's rules."""
    path = Path(__file__).resolve().parents[2] / "launch" / "model-shape.py"
    spec = importlib.util.spec_from_file_location("twinspark_model_shape", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _require_distinct(items: Sequence[BaseModel], prefix: str, field: str) -> None:
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        value = getattr(item, field)
        if value in seen:
            raise CrossFieldError(
                f"{prefix}[{i}].{field}", value, f"a value different from {prefix}[{seen[value]}].{field}"
            )
        seen[value] = i
