"""A node renamed in place (`nodes[i].formerName`): every resource of the node is named
`{node}-{capability}-{step}`, so a new name is a new set of resources to the engine, created
before the old ones are deleted, and the docker containers' fixed names collide. An alias to the
former name makes each resource the one in the state: the engine updates (or replaces) what
names the node in its inputs and creates and deletes nothing.
"""

from __future__ import annotations

import copy
from typing import Callable, Optional, Sequence

import pulumi

from .config.blocks import Node


def former_resource_name(resource_name: str, nodes: Sequence[Node]) -> Optional[str]:
    """The resource's name under its node's former name, or None (not a node's, or a node not
    being renamed). The node is the one with the longest `{name}-` prefix: a resource of `sim2-b`
    is not `sim2`'s."""
    owners = [n for n in nodes if resource_name.startswith(f"{n.name}-")]
    if not owners:
        return None
    owner = max(owners, key=lambda n: len(n.name))
    if owner.former_name is None:
        return None
    return f"{owner.former_name}-" + resource_name[len(owner.name) + 1:]


def alias_renamed_nodes(nodes: Sequence[Node]) -> Callable[
        [pulumi.ResourceTransformationArgs], Optional[pulumi.ResourceTransformationResult]]:
    """A stack transformation (pulumi.runtime.register_stack_transformation: the SDK runs it in
    each resource's constructor, so under the test mocks too; the newer register_stack_transform
    is run by the engine, which the mock monitor does not) adding an alias to the former name."""

    def transformation(args: pulumi.ResourceTransformationArgs) -> Optional[pulumi.ResourceTransformationResult]:
        former = former_resource_name(args.name, nodes)
        if former is None:
            return None
        # A name-only alias keeps the type and parent: the URN is the parent's type chain, not its
        # name (sdk/python/lib/pulumi/runtime/resource.py, create_urn: `u[0 : u.rfind("::")] + "$"`),
        # so it fits the children of a renamed component as well.
        opts = copy.copy(args.opts)  # as given (ResourceOptions.merge would also rewrite depends_on)
        opts.aliases = [*(args.opts.aliases or []), pulumi.Alias(name=former)]
        return pulumi.ResourceTransformationResult(args.props, opts)

    return transformation
