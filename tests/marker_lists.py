"""Which tests need what beyond a checkout and its .venv: tests/conftest.py marks them from these
lists, tests/test_markers.py checks the lists name tests that exist."""

# What a test needs beyond a checkout and its .venv, as markers (`scripts/test.sh --quick` runs the
# tests with none of them, as any user): `engine`, the Pulumi engine scripts/engine.sh builds;
# `simulator`, the simulated Sparks; `root`, network namespaces, mounts, nft or a system daemon
# (dockerd, sshd on port 22). By file, or by a fixture that sets such a machine up.
# The root lists are what failed when the rest ran as an unprivileged user (docs/testing.md, "A
# fast loop"); tests/test_markers.py holds every file that makes a namespace to them.
NEEDS_ENGINE = {"test_engine_providers.py", "test_engine_command_triggers.py", "test_engine_docker_provider.py",
                "test_engine_installed_plugins.py", "test_engine_language_host.py"}
NEEDS_ROOT_FILES = {"test_node_security.py", "test_sim_images.py", "test_node_access.py", "test_pin_host_keys.py"}
NEEDS_ROOT_FIXTURES = {"private_node", "pair"}  # a mount namespace; two network namespaces cabled
# `quiet`: a test whose figures are the machine's own pace: scripts/test.sh runs it with the engine's
# tests only, never beside the engine's Go build nor the simulator (the bench gate's noise test saw
# an unchanged server regress beside the one and missed a 4x slower decode beside the other:
# docs/testing.md, "CI").
# ops upgrade's flows, whose bench gate measures the stand-in for real (the larger of 10 % and the
# measured spread): beside the simulator a slower image's bench fell inside a loaded machine's
# spread and the upgrade passed, at nice 19 and at normal priority alike (docs/testing.md,
# "Session of 2026-12-05, noon"); the fabric watch's real guards (a process ticking every 2 s each, its
# re-qualifications' subprocesses): beside the simulator at normal priority they took CPU from it (the
# rehearsal of 8404162, docs/testing.md), before it they fit in the root tests' stage
QUIET_FILES = {"test_upgrade.py", "test_fabric_watch.py"}
NEEDS_A_QUIET_MACHINE = {
    # the bench gate at a Spark's pace: a 4x slower decode passed as noise beside the simulator
    "test_bench_gate.py::test_runs_of_an_unchanged_server_never_disagree_and_4x_slower_decodes_always_do",
    # the worker's message names the grace's 6.0 s: beside the simulator it said 6.1
    # ops bench's figures against a stand-in of known rates: beside the simulator a first token
    # stalled 90 ms read 129 tok/s single-stream against 100 (the cold rehearsal of 2026-12-06)
    "test_bench.py::test_bench_measures_the_known_rates",
    "test_ray_membership.py::test_the_grace_is_what_the_readme_says_measured_from_the_head_going_silent",
    # the doctor's --live: ops bench's figures of a stand-in of known rates, judged against the recipe's
    "test_doctor.py::test_live_figures_stand_beside_the_recipes_and_a_shortfall_with_no_cause_says_so",
    # the stand-in's rates against the recipe's figures: beside the simulator its 4-way aggregate read
    # 46.5 tok/s at 200 a stream, and needle's first size missed its 1.8 s deadline (rehearsal of d20f6e9)
    "test_bench.py::test_bench_compare_recipe_gates_on_the_stacks_recipe",
    "test_bad_input.py::test_needle_keeps_the_sizes_done_at_the_deadline",
}
# `paced`: a file whose tests wait on the clock (a guard's rounds, Ray's grace, a heartbeat, NCCL's
# roll call): scripts/test.sh runs them beside the simulator at normal priority, the rest yielding to
# it. Starved at nice 19 some failed (a join that missed the restarted head, a heartbeat 13.5 s apart,
# a rank that missed the 3 s roll call); the list is the files whose tests' wall time was over twice
# their CPU time, run alone, and the roll call's (docs/testing.md, "Session of 2026-12-05, noon").
PACED_FILES = {
    "test_serving_guard.py", "test_ray_membership.py", "test_mp_executor.py", "test_observability_live.py",
    "test_bench.py", "test_bad_input.py", "test_node_artifacts.py", "test_nccl_ranks.py", "test_nccl_pairs.py",
    "test_status.py", "test_needle.py",
    # the memory check's first verdict within 10 s: starved at nice 19 in the rehearsal of 8bb55a5
    "test_memory_guard.py",
    # the recorder's first memory picture and the plug's and sshd's answers, waited for within seconds
    "test_box_recovery.py",
    # the stand-in's engine death: refused 0.5 s after its 3 s of 503 (starved at nice 19 in the rehearsal of 7d6312e)
    "test_standin_matches_vllm.py",
    # a lane's drain against a gauge counting down per scrape (starved at nice 19 in the rehearsal of 2e83dfb)
    "test_lane_drain.py",
}
NEEDS_ROOT_TESTS = {  # FILE::NAME (without parameters)
    "test_weights.py::test_copy_speed_against_rsync_over_ssh_on_the_same_data_and_link",  # network namespaces
    "test_nccl_ranks.py::test_the_head_checks_a_worker_against_its_pinned_key_even_after_a_reinstall",  # sshd as root
    "test_observability.py::test_dirs_script_creates_owns_and_is_idempotent",  # chown to the services' users
    "test_ssh_access.py::test_docker_ssh_options_hold_a_real_ssh_to_the_pinned_key",  # sshd in a network namespace
}

