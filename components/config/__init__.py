"""The stack config contract (Pulumi.spark.yaml) as pydantic models, validated before any resource exists.

`load_stack_config` reads the `twinspark:*` keys, refuses keys it does not know, validates
field and cross-field rules and raises `pulumi.RunError` naming the key path as the user
wrote it, the bad value and, in words, what is expected; `load_secrets` does the same for the
secrets without ever showing them; `resolve_node_addresses` resolves the nodes' names (the
firewall's addresses). Nothing here touches a node.

One job per module, each importing only modules listed before it:
  errors.py          the key path and the RunError every check ends in
  values.py          the value types (names, addresses, ports, paths, images), each refusing in words
  blocks.py          the blocks (ssh, nodes, fabric, model, serving, observability, platform)
  schema.py          StackConfig: the rules across blocks, the parallelism rules among them
  secret_keys.py     the secrets, read and checked without showing them
  node_addresses.py  the nodes' names resolved to the firewall's addresses
  topology.py        what fabric.topology decides: rail peers, Ray's addresses, NCCL env, copy rails
  loading.py         reading the stack (or a stack file) and rendering pydantic's errors as one line each
  parameter_table.py the parameter table of docs/configuration.md, from the field descriptions
What `serving.extraArgs` may hold lives beside the recipes: core/vllm_flags.py.
"""

from core.vllm_flags import FLAGS_NOT_IN_EXTRA_ARGS
from .blocks import (LANE_SERVING_KEYS, AlertEmail, ConfigBlock, ModelConfig, Node, Observability, PowerWatch, Serving,
                     ServingGuard)
from .errors import NAMESPACE, config_error, format_key_path
from .loading import load_stack_config, parse_stack_config, stack_config_keys, stack_file_config
from .node_addresses import resolve_node_addresses
from .parameter_table import parameter_table
from .schema import DEFAULT_LANE, OPTIONAL_STRUCTURED_KEYS, STRUCTURED_KEYS, ServedLane, StackConfig, shape_rules
from .topology import CopyRail, Link, NodeFabric, Topology
from .secret_keys import _checked_secrets, load_secrets
from .values import DEFAULT_HUB_ENDPOINT, SERVING_IMAGE_LOCK

__all__ = [
    "CopyRail", "Link", "NodeFabric", "Topology",
    "DEFAULT_HUB_ENDPOINT", "DEFAULT_LANE", "FLAGS_NOT_IN_EXTRA_ARGS", "LANE_SERVING_KEYS", "NAMESPACE",
    "OPTIONAL_STRUCTURED_KEYS",
    "SERVING_IMAGE_LOCK",
    "STRUCTURED_KEYS", "AlertEmail", "ConfigBlock", "ModelConfig", "Node", "Observability", "PowerWatch", "Serving",
    "ServingGuard",
    "ServedLane",
    "StackConfig", "_checked_secrets", "config_error", "format_key_path", "load_secrets", "load_stack_config", "parameter_table",
    "parse_stack_config", "resolve_node_addresses", "shape_rules", "stack_config_keys", "stack_file_config",
]
