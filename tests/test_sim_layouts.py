"""The simulator's node plans (tests/sim/cluster.py, what `scripts/sim.sh up --nodes N` and the
third-node scenario boot): every N it offers gives a stack the program accepts and the sim's
model splits over."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "sim"))

import cluster  # noqa: E402
import sim_model  # noqa: E402
from components.config import parse_stack_config  # noqa: E402
from components.config.schema import shape_rules  # noqa: E402


def parsed(config: dict):
    return parse_stack_config({k.split(":", 1)[1]: v for k, v in config.items()
                               if k.split(":", 1)[1] in ("ssh", "nodes", "fabric", "model", "serving")})


@pytest.mark.parametrize("count, tp, pp", [(2, 2, 1), (3, 1, 3)])
def test_n_sim_nodes_get_a_layout_the_sim_model_splits_over(tmp_path, count, tp, pp):
    cfg = parsed(cluster.load_sim_config(tmp_path / "id_ed25519", nodes=count))
    assert [n.name for n in cfg.nodes] == [f"sim{i}" for i in range(1, count + 1)]
    assert (cfg.tensor_parallel_size, cfg.pipeline_parallel_size) == (tp, pp)
    lines = shape_rules().head_lines(sim_model.SIM_MODEL_CONFIG, tp, pp)
    assert not [line for line in lines if line.startswith("FAIL")], lines


def test_a_new_sim_node_does_not_take_the_pinned_host_key_of_the_node_it_is_patterned_on():
    pinned = [{"name": "sim1", "role": "head", "host": "198.18.1.11", "rails": []},
              {"name": "sim2", "role": "worker", "host": "198.18.2.12", "hostKey": "ssh-ed25519 AAAA", "rails": []}]
    third = cluster.sim_nodes(pinned, 3)[2]
    assert third["name"] == "sim3" and third["host"] == "198.18.3.13"
    assert "hostKey" not in third
