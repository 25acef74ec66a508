"""Issue 19 item 10: the NCCL ranks run together whatever changes, and a reinstalled node gets
everything again.

`planned` is the engine's choice for each resource of a `pulumi up` from one program run (the
state) to the next, in the order pulumi/pulumi pkg/resource/deploy/step_generator.go decides it
(diff): a `--replace` target is replaced; so is a resource whose replaceWith names a resource
being replaced (registered before it, so already decided); otherwise the provider's diff of the
compared inputs (ignoreChanges left out) — a command is replaced when its triggers change
(pulumi-command: replaceOnChanges) and updated otherwise, which runs its create again; a random
resource is replaced on any change (keepers and all); a container or image on any change. A
replaced resource gets a new id: an input holding its id (the mocks' NAME_id) changes too.
"""

import copy
import json
import socket
import subprocess
import sys
import threading
import time

import pytest
from program_harness import flag_value, flag_values, runner_call, unwrap
from ssh_fixtures import OTHER_HOST_KEY, Sshd, new_key

from components.remote import LAUNCH_DIR
from toolbox import free_port, load_file

COMMAND = "command:remote:Command"
CHECK_PROGRAM = LAUNCH_DIR / "nccl-allreduce-check.py"
RANKS = ("spark1-nccl-check", "spark2-nccl-check")


def replaced_on(resource, changed: set[str]) -> bool:
    if resource.type == COMMAND:
        return "triggers" in changed
    if resource.type.startswith("pulumi:providers:"):
        return bool(changed & set(resource.replace_on_changes))
    return True  # random (keepers), docker containers and images


def planned(before, after, replace=()) -> dict[str, str]:
    """name -> create | replace | update | same, for every custom resource of `after`."""
    name_of = {r.urn: r.name for r in after.resources}
    steps: dict[str, str] = {}
    for r in after.resources:
        if r.type.startswith("twinspark:"):
            continue  # components have no step of their own
        old = before.by_name.get(r.name)
        if old is None:
            steps[r.name] = "create"
        elif r.name in replace or any(steps.get(name_of.get(urn)) == "replace" for urn in r.replace_with):
            steps[r.name] = "replace"
        else:
            changed = {k for k in old.compared.keys() | r.compared.keys() if old.compared.get(k) != r.compared.get(k)}
            new_ids = [f"{name}_id" for name, step in steps.items() if step == "replace"]
            changed |= {k for k, v in r.compared.items() if any(i in json.dumps(v) for i in new_ids)}
            steps[r.name] = "same" if not changed else "replace" if replaced_on(r, changed) else "update"
    return steps


def rank_steps(steps):
    return {name: steps[name] for name in RANKS}


def load_check():
    return load_file(CHECK_PROGRAM)


def rerun_all(run) -> str:
    return f"pulumi up --replace '{run.named('nccl-run').urn}'"


# ---- every rank re-runs, or none ---------------------------------------------------------------
def test_a_no_op_up_runs_no_rank_and_changes_nothing(program, recipe_run):
    steps = planned(recipe_run, program())
    assert {name: step for name, step in steps.items() if step != "same"} == {}


def new_host_key(config, node):
    config["twinspark:nodes"][node]["hostKey"] = OTHER_HOST_KEY


def new_host(config, node):
    config["twinspark:nodes"][node]["host"] = "192.168.1.21"


def new_rail_device(config, node):  # that node's twinspark.env (NCCL_IB_HCA) alone changes
    config["twinspark:nodes"][node]["rails"][1]["hca"] = "roceP2p1s0f1"


@pytest.mark.parametrize("node", [0, 1], ids=["head", "worker"])
@pytest.mark.parametrize("change", [new_host_key, new_host, new_rail_device], ids=["host key", "identity", "env"])
def test_every_rank_reruns_when_one_nodes_connection_or_environment_changes(program, recipe_config, recipe_run,
                                                                             change, node):
    change(recipe_config, node)
    changed = program(recipe_config)
    assert changed.error is None, changed.error
    # replaced together: both run their create in this one `pulumi up`
    assert rank_steps(planned(recipe_run, changed)) == {name: "replace" for name in RANKS}


def test_the_run_keeps_all_of_each_ranks_connection_that_the_rank_compares(recipe_run):
    """Any field of one node's connection (not only user@host and the host key) that would
    update its rank alone replaces the run, and with it every rank."""
    keepers = unwrap(recipe_run.named("nccl-run").inputs["keepers"])
    for name in RANKS:
        node = name.removesuffix("-nccl-check")
        assert json.loads(keepers[f"{node}.connection"]) == recipe_run.named(name).compared["connection"]
        assert keepers[f"{node}.image"] == flag_value(runner_call(recipe_run.named(name)).args, "--image")


def test_every_rank_reruns_when_the_clusters_image_changes(program, recipe_run):
    """The head's build gives another image id (the state's outputs are what the next run reads):
    it is shipped to the workers again, and every rank runs on it."""
    rebuilt = copy.deepcopy(recipe_run)
    rebuilt.by_name["spark1-image-build"].outputs["repoDigest"] = "sha256:" + "e" * 64
    changed = program(prior=rebuilt)
    for node in ("spark1", "spark2"):
        assert flag_value(runner_call(changed.named(f"{node}-nccl-check")).args, "--image") == "sha256:" + "e" * 64
    assert rank_steps(planned(recipe_run, changed)) == {name: "replace" for name in RANKS}


def test_a_worker_holding_another_image_is_refused_before_any_rank_runs(program, recipe_run):
    """A worker whose copy is not the head's build (the ship step printed another ID)."""
    shipped = copy.deepcopy(recipe_run)
    shipped.by_name["spark2-image-ship"].outputs["stdout"] = "sha256:" + "e" * 64 + "\n"
    refused = program(prior=shipped)
    assert refused.error is not None and "nodes differ in image" in refused.error["message"]
    assert not set(RANKS) & set(refused.by_name)


def test_replacing_the_run_replaces_every_rank_and_each_rank_names_that_command(recipe_run):
    steps = planned(recipe_run, recipe_run, replace={"nccl-run"})
    assert rank_steps(steps) == {name: "replace" for name in RANKS}
    assert {name for name, step in steps.items() if step != "same"} == {"nccl-run", *RANKS}
    for name in RANKS:
        check_args = flag_values(runner_call(recipe_run.named(name)).args, "--check-arg")
        assert flag_value(check_args, "--rerun-all") == rerun_all(recipe_run)
        assert flag_value(check_args, "--nodes") == "spark1,spark2"


# ---- a rank alone ------------------------------------------------------------------------------
def run_rank_alone(run, name, port, join_timeout_s=2):
    """The rank's own check program with its recorded arguments, its master on loopback."""
    check_args = flag_values(runner_call(run.named(name)).args, "--check-arg")
    check_args[check_args.index("--master") + 1] = f"127.0.0.1:{port}"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(CHECK_PROGRAM), *check_args, "--join-timeout-s", str(join_timeout_s)],
                          capture_output=True, text=True, timeout=60)
    return proc, time.monotonic() - started


@pytest.mark.parametrize("name, rank, missing", [
    ("spark1-nccl-check", 0, "spark2 (rank 1) did not join within 2 s"),
    ("spark2-nccl-check", 1, "spark1 (rank 0) did not answer at 127.0.0.1:{port} within 2 s (Connection refused)"),
])
def test_a_rank_replaced_alone_fails_fast_saying_how_to_run_every_rank(recipe_run, name, rank, missing):
    """`pulumi up --replace` of one rank replaces that rank only: nothing registered before the
    others can make the engine replace them. It must then fail soon, and say what to run."""
    steps = planned(recipe_run, recipe_run, replace={name})
    assert rank_steps(steps) == {r: "replace" if r == name else "same" for r in RANKS}
    port = free_port()
    proc, elapsed = run_rank_alone(recipe_run, name, port)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    node = name.removesuffix("-nccl-check")
    last = proc.stdout.strip().splitlines()[-1]
    assert last.endswith(f" nccl-check {node}: FAIL rank {rank} of 2: {missing.format(port=port)} — the NCCL ranks "
                         f"run only together: {rerun_all(recipe_run)}"), last
    assert elapsed < 10
    # and by default well before NCCL's own wait (900 s), itself under the step's 1200 s
    check_args = flag_values(runner_call(recipe_run.named(name)).args, "--check-arg")
    assert "--join-timeout-s" not in check_args and load_check().JOIN_TIMEOUT_S <= 180


def test_the_join_timeout_set_in_the_stack_reaches_every_rank_and_a_rank_alone_fails_within_it(program,
                                                                                                 recipe_config):
    config = copy.deepcopy(recipe_config)
    config["twinspark:fabric"]["ncclJoinTimeoutSeconds"] = 10
    run = program(config)
    assert run.error is None, run.error
    for name in RANKS:
        assert flag_value(flag_values(runner_call(run.named(name)).args, "--check-arg"), "--join-timeout-s") == "10"
    check_args = flag_values(runner_call(run.named("spark1-nccl-check")).args, "--check-arg")
    check_args[check_args.index("--master") + 1] = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(CHECK_PROGRAM), *check_args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "spark2 (rank 1) did not join within 10 s" in proc.stdout, proc.stdout + proc.stderr
    assert 10 <= time.monotonic() - started < 30


class Ranks:
    """Ranks of one roll call on loopback, each in a thread: outcome "go" or why not."""

    def __init__(self, nodes):
        self.check, self.port, self.nodes, self.outcomes, self.threads = load_check(), free_port(), nodes, {}, []

    def start(self, rank, timeout_s, nodes=None, key=None):
        def run():
            try:
                self.check.roll_call(rank, nodes or self.nodes, f"127.0.0.1:{self.port}", timeout_s)
                self.outcomes[key or rank] = "go"
            except self.check.NotTogether as missing:
                self.outcomes[key or rank] = str(missing)

        thread = threading.Thread(target=run)
        thread.start()
        self.threads.append(thread)
        return thread

    def wait(self):
        for thread in self.threads:
            thread.join(timeout=30)
        return self.outcomes


def test_the_roll_call_lets_every_rank_on_together_and_refuses_a_stranger():
    ranks = Ranks(["spark1", "spark2", "spark3"])
    ranks.start(0, 10)
    time.sleep(0.3)
    # a rank of another run (other nodes) is turned away; rank 0 waits on for this run's
    ranks.start(2, 2, nodes=["spark1", "spark9", "spark3"], key="stranger").join(timeout=30)
    ranks.start(1, 10)
    ranks.start(2, 10)
    outcomes = ranks.wait()
    assert (outcomes[0], outcomes[1], outcomes[2]) == ("go", "go", "go"), outcomes
    assert outcomes["stranger"].startswith("spark1 (rank 0) did not answer at 127.0.0.1:"), outcomes
    assert "(refused: rank 0 runs spark1,spark2,spark3" in outcomes["stranger"]
    with socket.create_server(("127.0.0.1", ranks.port)):  # free again at once, for torch's store
        pass


def test_a_rank_that_reaches_an_old_rank_0_first_waits_for_this_runs():
    """Seen on the H200: what listens on the port may not be this run's rank 0 yet (a store or
    rank 0 of a run before, until its node replaces it). That is no reason to give up."""
    ranks = Ranks(["spark1", "spark2"])
    old = socket.create_server(("127.0.0.1", ranks.port))
    closer = threading.Thread(target=lambda: [old.accept()[0].close() for _ in range(2)])
    closer.start()
    ranks.start(1, 10)
    closer.join(timeout=10)
    old.close()
    ranks.start(0, 10)
    assert ranks.wait() == {0: "go", 1: "go"}


def test_the_ranks_that_came_are_told_who_is_missing():
    ranks = Ranks(["spark1", "spark2", "spark3"])
    ranks.start(0, 2)
    ranks.start(1, 2)
    missing = "spark3 (rank 2) did not join within 2 s"
    assert ranks.wait() == {0: missing, 1: missing}


# ---- a reinstalled node ------------------------------------------------------------------------
def on_node(run, resource, node) -> bool:
    """Does the resource act on `node`: a command over its connection, or its docker daemon."""
    if resource.type == COMMAND:
        return unwrap(resource.inputs["connection"])["host"] == unwrap(run.named(f"{node}-docker").inputs["host"]).split("@")[1]
    return resource.type.startswith("docker:") and resource.provider.startswith(run.named(f"{node}-docker").urn)


@pytest.mark.parametrize("node, index", [("spark2", 1), ("spark1", 0)], ids=["worker", "head"])
def test_pinning_a_reinstalled_nodes_new_key_makes_everything_on_it_again(program, recipe_config, recipe_run,
                                                                          node, index):
    """docs/operating.md, Operating and recovering: a reinstalled node. Its own steps run again (host prep, bundle, fabric
    check, its exporters' directories, ...); its image is built (the head) or shipped to it (a
    worker) and its containers created again; its weights are downloaded (the head) or copied to it
    (a worker); every NCCL rank runs."""
    new_host_key(recipe_config, index)
    rekeyed = program(recipe_config)
    assert rekeyed.error is None, rekeyed.error
    steps = planned(recipe_run, rekeyed)
    docker = [r.name for r in rekeyed.resources if r.type.startswith("docker:index/") and on_node(rekeyed, r, node)]
    commands = [r.name for r in rekeyed.of_type(COMMAND)
                if on_node(rekeyed, r, node) and not r.name.endswith("image-pin-resolve")]
    built_here = {f"{node}-image-build"} if node == "spark1" else set()  # one build, on the head
    assert built_here | {f"{node}-serving-container", f"{node}-observability-node-exporter",
                         f"{node}-observability-gpu-exporter-image"} <= set(docker)
    assert {f"{node}-hostprep-netplan", f"{node}-bundle-twinspark-env", f"{node}-fabric-check"} <= set(commands)
    assert {name: steps[name] for name in docker} == {name: "replace" for name in docker}
    assert all(steps[name] in ("update", "replace") for name in commands), {n: steps[n] for n in commands}
    expected = {f"{node}-installation": "replace", "nccl-run": "replace", "spark1-nccl-check": "replace",
                "spark2-nccl-check": "replace", "spark1-readiness-wait": "replace"}
    if node == "spark2":  # the head sends the weights again, to the worker's new key, and re-forms Ray
        # (and its new key pinned for the guard's re-qualification, in the head's own known_hosts)
        expected |= {"spark2-weights-host-key": "update", "spark2-requalify-host-key": "update",
                     "spark2-weights-sync": "replace",
                     "spark2-image-ship": "replace", "spark1-serving-container": "replace"}
    else:  # the head's steps that use the sync key run again: the worker admits it again, then revokes it
        assert steps["spark1-weights-fetch"] == "update"
        expected |= {"spark2-weights-authorize": "replace", "spark2-weights-revoke": "replace"}
    for name, step in expected.items():
        assert steps[name] == step, name
    # nothing else anywhere
    rest = {name: step for name, step in steps.items() if name not in {*docker, *commands, *expected}}
    assert {name: step for name, step in rest.items() if step != "same"} == {}


def test_the_head_checks_a_worker_against_its_pinned_key_even_after_a_reinstall(tmp_path, recipe_run):
    """spark2-weights-host-key, run for real: the head had learnt the old installation's key; the
    copy's ssh (the options of launch/step-prelude.sh) takes the pinned key instead, and only it."""
    pinned = recipe_run.named("spark2-weights-host-key")
    call = runner_call(pinned)
    assert call.script == "peer-host-key.sh"
    assert flag_values(call.args, "--address") == ["10.0.0.2", "10.0.1.2"]
    # the key `pulumi up` checks spark2 against (its own steps' connection)
    assert flag_value(call.args, "--host-key") == unwrap(recipe_run.named("spark2-weights-authorize")
                                                          .inputs["connection"])["hostKey"]
    key = new_key(tmp_path / "client" / "id")
    sshd = Sshd(tmp_path, key.with_name("id.pub"))
    home = tmp_path / "home"
    known_hosts = home / ".ssh" / "twinspark_known_hosts"
    address = f"[127.0.0.1]:{sshd.port}"
    known_hosts.parent.mkdir(parents=True)
    known_hosts.write_text(f"{address} {OTHER_HOST_KEY}\n")  # learnt from the node before its reinstall

    def copy_connects():
        script = (f'. {LAUNCH_DIR}/prelude.sh; . {LAUNCH_DIR}/step-prelude.sh; '
                  f'sync_key_ssh_options o {key} {known_hosts}; ssh "${{o[@]}}" -p {sshd.port} 127.0.0.1 true')
        return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)

    def pin(host_key):
        args = list(call.args)
        args[args.index("--host-key") + 1] = host_key
        args = [a for i, a in enumerate(args) if a != "--address" and (i == 0 or args[i - 1] != "--address")]
        return subprocess.run(["bash", str(LAUNCH_DIR / call.script), *args, "--address", address],
                              capture_output=True, text=True, timeout=30, env={"HOME": str(home), "PATH": "/usr/bin:/bin"})

    try:
        refused = copy_connects()
        assert refused.returncode != 0 and "REMOTE HOST IDENTIFICATION HAS CHANGED" in refused.stderr, refused.stderr
        out = pin(sshd.host_key)
        assert out.returncode == 0 and "pinned: spark2's host key" in out.stdout, out.stdout + out.stderr
        assert copy_connects().returncode == 0
        before = known_hosts.read_text()
        again = pin(sshd.host_key)  # idempotent
        assert "unchanged" in again.stdout and known_hosts.read_text() == before
        pin(OTHER_HOST_KEY)  # a key the node does not hold is refused, not learnt anew
        assert copy_connects().returncode != 0
    finally:
        sshd.stop()


def test_once_every_rank_is_there_the_roll_calls_port_refuses_until_torchs_store_listens():
    """A rank that goes on at once (the sim's torch stand-in imports in no time) must not land in
    the roll call's backlog, which closes under it (the engine sim's rank 1 died so, rank 0 then
    waited out NCCL's 900 s): rank 0 stops listening before it says go, so an early connect is
    refused and retried until torch's store listens."""
    ranks = Ranks(["spark1", "spark2"])
    ranks.start(0, 10)
    time.sleep(0.3)
    ranks.check.roll_call(1, ranks.nodes, f"127.0.0.1:{ranks.port}", 10)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", ranks.port), timeout=2).close()
    assert ranks.wait()[0] == "go"
