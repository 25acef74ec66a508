"""The bench gate's first half (tests/ops/bench_gate.py): five comparisons of an unchanged server,
three 4x slower decodes."""

from bench_gate import unchanged_runs_agree_and_slower_decodes_fire


def test_five_runs_of_an_unchanged_server_never_disagree_and_three_4x_slower_decodes_always_do(endpoint, tmp_path):
    unchanged_runs_agree_and_slower_decodes_fire(endpoint, tmp_path, comparisons=5, slow_against=range(1, 6, 2))
