"""A node renamed in place (`nodes[i].formerName`, components/renames.py): under mocks, every
resource of the renamed node is registered with an alias to the URN it had under the former
name, and nothing else is; the config refuses a formerName that could claim the wrong resources."""

import copy

import pulumi
import pytest
from program_harness import config_blocks, stack_config
from ssh_fixtures import pinned

from components.config import parse_stack_config
from components.config.blocks import Node
from components.renames import former_resource_name

RAILS = [{"iface": "enp1s0f0np0", "hca": "rocep1s0f0", "address": "10.0.0.1/24"}]


def renamed(config, index: int, name: str, former: str):
    config = copy.deepcopy(config)
    config["twinspark:nodes"][index].update(name=name, formerName=former)
    return config


def alias_urns(resource) -> set[str]:
    """The URNs the engine matches the resource's name aliases to: a spec with a name only keeps
    the resource's type and parent (RegisterResource in the engine, create_alias_spec in the SDK),
    so its URN is the resource's own with the last part the alias's name."""
    prefix = resource.urn.rsplit("::", 1)[0]
    return {f"{prefix}::{a['spec']['name']}" for a in resource.aliases if a.get("spec", {}).get("name")}


@pytest.fixture(scope="module")
def before(program):
    run = program(pinned(stack_config()))
    assert run.error is None, run.error
    return run


@pytest.fixture(scope="module", params=[(1, "spark2"), (0, "spark1")], ids=["worker", "head"])
def rename(request, program, before):
    """The recipe stack with one node renamed `{name}b` in place (same host, same key): the run, the
    former name, the new."""
    index, former = request.param
    after = program(renamed(pinned(stack_config()), index, f"{former}b", former))
    assert after.error is None, after.error
    return after, former, f"{former}b"


def test_every_resource_of_the_renamed_node_is_aliased_to_its_urn_under_the_former_name(before, rename):
    after, former, name = rename
    old = {r.urn for r in before.resources if r.name.startswith(f"{former}-")}
    new = [r for r in after.resources if r.name.startswith(f"{name}-")]
    assert len(new) == len(old) > 30  # components and their children, custom and provider resources
    for r in new:
        assert alias_urns(r) == {before.named(f"{former}-" + r.name.removeprefix(f"{name}-")).urn}, r.name
    assert set().union(*map(alias_urns, new)) == old
    # a child's URN holds its parent's type chain, not the parent's name: renaming the parent
    # leaves the rest of a child's alias as it was
    by_urn = {r.urn: r for r in after.resources}
    children = [r for r in new if r.parent in by_urn and by_urn[r.parent].name.startswith(f"{name}-")]
    assert children
    for r in children:
        assert by_urn[r.parent].name not in r.urn.rsplit("::", 1)[0], r.urn


def test_no_other_resource_gets_an_alias_and_what_they_had_is_kept(before, rename):
    after, former, name = rename
    others = [r for r in after.resources if not r.name.startswith(f"{name}-")]
    assert others and not [r.name for r in others if alias_urns(r)]
    # the aliases the program gives (the head's image build: to its former type) stay, renamed or not
    kept = {r.name: r.aliases for r in before.resources if r.aliases}
    assert "spark1-image-build" in kept, "the recipe stack has aliases of its own"
    for old_name, aliases in kept.items():
        now = after.named(old_name.replace(f"{former}-", f"{name}-", 1))
        assert [a for a in now.aliases if a.get("spec", {}).get("name") is None] == aliases, old_name


def test_without_a_former_name_no_resource_has_a_name_alias(recipe_run):
    assert [r.name for r in recipe_run.resources if alias_urns(r)] == []


def test_a_resource_belongs_to_the_node_with_the_longest_name_it_starts_with():
    host = {"role": "worker", "host": "192.168.1.20", "rails": RAILS}
    nodes = [Node(name="sim2", formerName="old", **host), Node(name="sim2-b", **host)]
    assert former_resource_name("sim2-hostprep-netplan", nodes) == "old-hostprep-netplan"
    assert former_resource_name("sim2-b-hostprep-netplan", nodes) is None
    assert former_resource_name("sim2", nodes) is None  # no `{node}-` prefix
    assert former_resource_name("weights", nodes) is None


BASE = config_blocks()


@pytest.mark.parametrize("former, fragments", [
    ("spark2", ["twinspark:nodes[1].formerName: spark2", "not its name now", "remove formerName"]),
    ("spark1", ["twinspark:nodes[1].formerName: spark1", "a name no node has now, not nodes[0].name"]),
    ("Spark 2", ["twinspark:nodes[1].formerName", "lowercase letters, digits or '-'"]),
])
def test_a_former_name_that_is_a_current_name_is_refused(former, fragments):
    cfg = copy.deepcopy(BASE)
    cfg["nodes"][1]["formerName"] = former
    with pytest.raises(pulumi.RunError) as err:
        parse_stack_config(cfg)
    for fragment in fragments:
        assert fragment in str(err.value), str(err.value)


def test_a_former_name_given_to_two_nodes_is_refused():
    cfg = copy.deepcopy(BASE)
    cfg["nodes"][0]["formerName"] = cfg["nodes"][1]["formerName"] = "spark0"
    with pytest.raises(pulumi.RunError) as err:
        parse_stack_config(cfg)
    assert "twinspark:nodes[1].formerName: spark0 — expected a formerName different from nodes[0].formerName" \
        in str(err.value), str(err.value)


def test_a_former_name_no_node_has_passes():
    cfg = copy.deepcopy(BASE)
    cfg["nodes"][1].update(name="spark2b", formerName="spark2")
    assert parse_stack_config(cfg).nodes[1].former_name == "spark2"


def test_with_the_former_name_removed_every_resource_is_as_it_was_registered_with_it(program, rename):
    """The second `up` of the rename, `formerName` removed, finds nothing to change: the key is in
    no resource's inputs or options, only in the aliases."""
    after, former, name = rename
    config = pinned(stack_config())
    index = [n["name"] for n in config["twinspark:nodes"]].index(former)
    config["twinspark:nodes"][index]["name"] = name
    done = program(config)
    assert done.error is None, done.error
    assert sorted(done.by_name) == sorted(after.by_name)
    for now in done.resources:
        then = after.named(now.name)
        assert (now.urn, now.compared, sorted(now.dependencies), now.parent, now.provider) == \
            (then.urn, then.compared, sorted(then.dependencies), then.parent, then.provider), now.name
        assert not alias_urns(now), now.name
