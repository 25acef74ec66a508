"""The bench gate's second half (tests/ops/bench_gate.py): five more comparisons of an unchanged
server, two more 4x slower decodes (ten and five in all, as one test made them before it was split)."""

from bench_gate import unchanged_runs_agree_and_slower_decodes_fire


def test_five_more_runs_of_an_unchanged_server_never_disagree_and_two_4x_slower_decodes_always_do(endpoint, tmp_path):
    unchanged_runs_agree_and_slower_decodes_fire(endpoint, tmp_path, comparisons=5, slow_against=range(1, 4, 2))
