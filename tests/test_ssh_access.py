"""SSH from the operator's machine (issue 8 items 4-6, issue 9 "SSH host keys"): which
credentials and host keys both providers get, what stops the program before any resource,
and which changes re-run steps on the nodes."""

import json
import os
import subprocess
from pathlib import Path

import pytest
from ssh_fixtures import OTHER_HOST_KEY, TEST_HOST_KEYS, new_key, pinned
from program_harness import compared_inputs, config_blocks, plain_occurrences, stack_config, unwrap
from ssh_fixtures import DEAD_AGENT_KINDS, Agent, DeadAgent, sshd_argv

from core import host_keys
from components.config import parse_stack_config
from components.serving_image import PIN_KEEPS_ACROSS

COMMAND = "command:remote:Command"
DOCKER_PROVIDER = "pulumi:providers:docker"
PASSPHRASE = "correct horse battery staple"
CREDENTIAL_FIELDS = ["connection.privateKey", "connection.privateKeyPassword"]  # ignored in every step's diff
SSH_SECRET = ["twinspark:ssh"]  # what the engine marks secret once the passphrase is set with --secret


@pytest.fixture
def agent():
    a = Agent()
    yield a
    a.stop()


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    return {"plain": new_key(d / "plain"), "other": new_key(d / "other"),
            "locked": new_key(d / "locked", PASSPHRASE)}


def with_ssh(config, **ssh):
    config = pinned(config)
    config["twinspark:ssh"] = {"user": "nvidia", **ssh}
    return config


PIN = "image-pin-resolve"  # keeps its digest across every connection change (test_image_pin_and_gate.py)


def pins(run):
    """serving.image's pin and each monitoring image's (observability-<capability>-image-pin-resolve)."""
    found = [r for r in commands(run) if r.name.endswith(PIN)]
    assert len(found) > 1, [r.name for r in found]
    return found


def commands(run):
    return run.of_type(COMMAND)


def node_steps(run):
    """The commands that follow their node's connection: all but the image pins."""
    return [r for r in commands(run) if not r.name.endswith(PIN)]


def connection(resource):
    return unwrap(resource.inputs["connection"])


def docker_opts(run, node):
    return json.loads(run.named(f"{node}-docker").inputs["sshOpts"])


def opt_value(opts, name):
    values = [o.split("=", 1)[1] for o in opts if o.startswith(f"{name}=")]
    assert len(values) == 1, (name, opts)
    return values[0]


def assert_stopped_before_any_resource(run, *fragments):
    assert run.error and run.error["kind"] == "RunError", run.error
    for fragment in fragments:
        assert fragment in run.error["message"], run.error["message"]
    assert run.resources == []


# ---- item 4: credentials -------------------------------------------------------------------
@pytest.mark.parametrize("make", ["missing", "directory", "not a key"])
def test_an_unusable_key_path_stops_before_any_resource(program, tmp_path, make):
    path = tmp_path / "id_ed25519"
    if make == "directory":
        path.mkdir()
    elif make == "not a key":
        path.write_text("ssh-ed25519 AAAA this is a public key\n")
    run = program(with_ssh(stack_config(), privateKeyPath=str(path)))
    assert_stopped_before_any_resource(run, "twinspark:ssh.privateKeyPath:", str(path))


def test_a_passphrase_key_with_its_passphrase_goes_to_the_commands_as_secrets(program, keys, agent):
    agent.add(keys["locked"], PASSPHRASE)
    config = with_ssh(stack_config(), privateKeyPath=str(keys["locked"]), privateKeyPassphrase=PASSPHRASE)
    run = program(config, extra_env=agent.env, secret_keys=SSH_SECRET)
    assert run.error is None, run.error
    key_text = keys["locked"].read_text()
    for r in commands(run):
        conn = connection(r)
        assert conn["privateKey"] == key_text and conn["privateKeyPassword"] == PASSPHRASE, r.name
    for r in run.resources:
        for secret in (PASSPHRASE, key_text.splitlines()[1]):
            assert not plain_occurrences(r.inputs, secret), (r.name, secret)
    for name, out in run.outputs.items():
        assert PASSPHRASE not in json.dumps(out["value"]), name
    # docker's ssh names the key and signs through the agent, which holds it
    for node in ("spark1", "spark2"):
        opts = docker_opts(run, node)
        assert opts[opts.index("-i") + 1] == str(keys["locked"]) and "IdentitiesOnly=yes" in opts


def test_a_passphrase_key_without_its_passphrase_uses_the_agent_on_both_sides(program, keys, agent):
    agent.add(keys["locked"], PASSPHRASE)
    run = program(with_ssh(stack_config(), privateKeyPath=str(keys["locked"])), extra_env=agent.env)
    assert run.error is None, run.error
    for r in commands(run):
        conn = connection(r)
        assert "privateKey" not in conn and "privateKeyPassword" not in conn, r.name  # pulumi-command asks the agent
    opts = docker_opts(run, "spark1")
    assert opts[opts.index("-i") + 1] == str(keys["locked"])


@pytest.mark.parametrize("with_passphrase", [False, True])
@pytest.mark.parametrize("agent_state", ["none", "without the key"])
def test_a_passphrase_key_the_agent_does_not_hold_is_refused(program, keys, agent, with_passphrase, agent_state):
    agent.add(keys["plain"])
    ssh = {"privateKeyPath": str(keys["locked"])}
    if with_passphrase:
        ssh["privateKeyPassphrase"] = PASSPHRASE
    env = agent.env if agent_state == "without the key" else {}
    run = program(with_ssh(stack_config(), **ssh), extra_env=env, secret_keys=SSH_SECRET)
    assert_stopped_before_any_resource(run, "twinspark:ssh.privateKeyPath:", "passphrase-protected",
                                       f"ssh-add {keys['locked']}", "docker provider")
    assert PASSPHRASE not in run.error["message"]


def test_a_wrong_passphrase_is_refused_without_showing_it(program, keys, agent):
    agent.add(keys["locked"], PASSPHRASE)
    config = with_ssh(stack_config(), privateKeyPath=str(keys["locked"]), privateKeyPassphrase="wrong passphrase")
    run = program(config, extra_env=agent.env, secret_keys=SSH_SECRET)
    assert_stopped_before_any_resource(run, "twinspark:ssh.privateKeyPassphrase:", "does not open")
    assert "wrong passphrase" not in run.error["message"]


def test_a_passphrase_in_plain_text_is_refused(program, keys, agent):
    agent.add(keys["locked"], PASSPHRASE)
    config = with_ssh(stack_config(), privateKeyPath=str(keys["locked"]), privateKeyPassphrase=PASSPHRASE)
    run = program(config, extra_env=agent.env)  # not set with --secret
    assert_stopped_before_any_resource(run, "twinspark:ssh.privateKeyPassphrase:", "--secret")
    assert PASSPHRASE not in run.error["message"]


def test_a_passphrase_for_a_key_without_one_is_refused(program, keys):
    config = with_ssh(stack_config(), privateKeyPath=str(keys["plain"]), privateKeyPassphrase=PASSPHRASE)
    run = program(config, secret_keys=SSH_SECRET)
    assert_stopped_before_any_resource(run, "twinspark:ssh.privateKeyPassphrase:", "has no passphrase")


def test_without_a_key_path_both_sides_use_the_agent(program, keys, agent):
    run = program(with_ssh(stack_config()))
    assert_stopped_before_any_resource(run, "twinspark:ssh.privateKeyPath:", "SSH_AUTH_SOCK is not set", "ssh-add")
    run = program(with_ssh(stack_config()), extra_env=agent.env)
    assert_stopped_before_any_resource(run, "twinspark:ssh.privateKeyPath:", "has no keys")
    agent.add(keys["plain"])
    run = program(with_ssh(stack_config()), extra_env=agent.env)
    assert run.error is None, run.error
    assert all("privateKey" not in connection(r) for r in commands(run))
    assert "-i" not in docker_opts(run, "spark1")


@pytest.fixture(params=DEAD_AGENT_KINDS)
def dead_agent(request):
    a = DeadAgent(request.param)
    yield a
    a.stop()


@pytest.mark.parametrize("key", [None, "plain", "locked"])
def test_an_agent_socket_that_does_not_answer_stops_before_any_resource(program, keys, dead_agent, key):
    """Issue 19 item 9: pulumi-command dials SSH_AUTH_SOCK whenever it is set, so a dead agent beside
    an unencrypted key file would fail every remote command later, with nothing said before."""
    ssh = {"privateKeyPath": str(keys[key])} if key else {}
    run = program(with_ssh(stack_config(), **ssh), extra_env=dead_agent.env)
    assert_stopped_before_any_resource(run, "twinspark:ssh.privateKeyPath:",
                                       f"SSH_AUTH_SOCK={dead_agent.sock}: no ssh-agent answers there")
    message = run.error["message"]
    if key == "plain":
        assert "unset SSH_AUTH_SOCK" in message and "pulumi-command" in message, message
    if key == "locked":
        assert f"ssh-add {keys['locked']}" in message and "passphrase-protected" in message, message


def test_a_misspelt_passphrase_key_does_not_show_its_value():
    import pulumi

    raw = config_blocks()
    raw["ssh"] = {"user": "nvidia", "privateKeyPasphrase": "hunter2-secret"}
    with pytest.raises(pulumi.RunError) as err:
        parse_stack_config(raw)
    assert "twinspark:ssh.privateKeyPasphrase:" in str(err.value)
    assert "hunter2-secret" not in str(err.value)
    raw["ssh"] = {"user": "nvidia", "privateKeyPassphrase": {"not": "a string", "x": "hunter2-secret"}}
    with pytest.raises(pulumi.RunError) as err:
        parse_stack_config(raw)
    assert "twinspark:ssh.privateKeyPassphrase:" in str(err.value) and "hunter2-secret" not in str(err.value)


# ---- item 5 / issue 9: host keys, per node, verified by default ----------------------------
def test_unpinned_nodes_are_refused_by_default(program):
    run = program(stack_config(), pin_host_keys=False)  # the shipped stack file: hostKey not pinned yet
    assert_stopped_before_any_resource(
        run, "twinspark:nodes[0].hostKey: not pinned", "twinspark:nodes[1].hostKey: not pinned",
        "twinspark pin-host-keys --stack-file Pulumi.spark.yaml", "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub",
        "ssh.trustOnFirstUse")


def test_each_node_is_verified_with_its_own_key_on_both_sides(recipe_run):
    hosts = {"spark1": "192.168.1.10", "spark2": "192.168.1.11"}
    for r in commands(recipe_run):
        host = connection(r)["host"]
        node = next(n for n, h in hosts.items() if h == host)
        assert connection(r)["hostKey"] == TEST_HOST_KEYS[node], r.name
    files = set()
    for node in hosts:
        opts = docker_opts(recipe_run, node)
        assert opt_value(opts, "StrictHostKeyChecking") == "yes"
        assert opt_value(opts, "GlobalKnownHostsFile") == "/dev/null"
        assert opt_value(opts, "HostKeyAlgorithms") == "ssh-ed25519"
        files.add(opt_value(opts, "UserKnownHostsFile"))
    assert len(files) == 2  # one file per node


def test_the_nodes_output_carries_the_key_each_node_is_held_to(recipe_run):
    """What ops holds its own ssh to (issue 19 item 8): the keys this run enforced."""
    nodes = recipe_run.outputs["nodes"]["value"]
    assert [(n["name"], n["hostKey"]) for n in nodes] == [(n, TEST_HOST_KEYS[n]) for n in ("spark1", "spark2")]


def tofu_env(tmp_path, scanned: dict[str, str], known_hosts: Path):
    """A stand-in ssh-keyscan answering `scanned` (host -> key) and logging each call."""
    shim = tmp_path / "bin" / "ssh-keyscan"
    shim.parent.mkdir(exist_ok=True)
    table = "".join(f'  {host}) echo "{host} {key}";;\n' for host, key in scanned.items())
    shim.write_text(f'#!/bin/bash\necho "$*" >> {tmp_path}/scans\ncase "${{@: -1}}" in\n{table}'
                    '  *) echo "connect refused" >&2; exit 1;;\nesac\n')
    shim.chmod(0o755)
    return {"PATH": f"{shim.parent}:{os.environ['PATH']}", "TWINSPARK_KNOWN_HOSTS_DIR": str(known_hosts)}


def test_trust_on_first_use_records_the_first_key_and_holds_to_it(program, tmp_path):
    config = stack_config()  # spark1 pinned, spark2 not
    config["twinspark:nodes"][0]["hostKey"] = TEST_HOST_KEYS["spark1"]
    config["twinspark:ssh"]["trustOnFirstUse"] = True
    known_hosts = tmp_path / "known_hosts.d"
    env = tofu_env(tmp_path, {"192.168.1.11": OTHER_HOST_KEY}, known_hosts)
    run = program(config, extra_env=env, pin_host_keys=False, keyscan=None)
    assert run.error is None, run.error
    assert (tmp_path / "scans").read_text().split("\n")[:-1] == [
        "-T 10 -p 22 -t ed25519 192.168.1.11",  # the first contact, recorded
        "-T 5 -p 22 -t ed25519 192.168.1.10", "-T 5 -p 22 -t ed25519 192.168.1.11"]  # every node's key checked
    by_node = {"192.168.1.10": TEST_HOST_KEYS["spark1"], "192.168.1.11": OTHER_HOST_KEY}
    for r in commands(run):
        assert connection(r)["hostKey"] == by_node[connection(r)["host"]], r.name
    for node, host in (("spark1", "192.168.1.10"), ("spark2", "192.168.1.11")):
        file = Path(opt_value(docker_opts(run, node), "UserKnownHostsFile").strip('"'))
        assert file.read_text() == f"{host} {by_node[host]}\n"
        assert opt_value(docker_opts(run, node), "StrictHostKeyChecking") == "yes"
    # the next run holds to the record: the node now showing another key is refused before any resource
    env = tofu_env(tmp_path, {"192.168.1.11": TEST_HOST_KEYS["spark3"]}, known_hosts)
    run = program(config, extra_env=env, pin_host_keys=False, keyscan=None)
    assert_stopped_before_any_resource(
        run, "spark2 (192.168.1.11): refused: its SSH host key is not the one `pulumi up` holds it to "
             f"({host_keys.fingerprint(OTHER_HOST_KEY)}; it shows {host_keys.fingerprint(TEST_HOST_KEYS['spark3'])})",
        "nothing ran there", "twinspark pin-host-keys --stack-file Pulumi.spark.yaml")
    # the recorded key shown again (or the node not answering): the run goes on with the record
    for scanned in ({"192.168.1.11": OTHER_HOST_KEY}, {}):
        run = program(config, extra_env=tofu_env(tmp_path, scanned, known_hosts), pin_host_keys=False, keyscan=None)
        assert run.error is None, run.error
        assert connection(run.named("spark2-fabric-check"))["hostKey"] == OTHER_HOST_KEY
        assert [n["hostKey"] for n in run.outputs["nodes"]["value"]] == [TEST_HOST_KEYS["spark1"], OTHER_HOST_KEY]


def test_a_node_that_shows_another_key_than_its_pinned_one_stops_the_program_before_any_resource(program):
    """A reinstalled node: nothing of it changed in the config, so no step would connect to it."""
    shown = {"192.168.1.10": TEST_HOST_KEYS["spark1"], "192.168.1.11": OTHER_HOST_KEY}
    run = program(stack_config(), keyscan=shown)
    assert_stopped_before_any_resource(
        run, f"spark2 (192.168.1.11): refused: its SSH host key is not the one `pulumi up` holds it to "
             f"({host_keys.fingerprint(TEST_HOST_KEYS['spark2'])}; it shows {host_keys.fingerprint(OTHER_HOST_KEY)})")
    assert "spark1" not in run.error["message"]
    assert program(stack_config(), keyscan={**shown, "192.168.1.11": TEST_HOST_KEYS["spark2"]}).error is None


def test_trust_on_first_use_that_cannot_reach_a_node_names_it(program, tmp_path):
    config = stack_config()
    config["twinspark:nodes"][0]["hostKey"] = TEST_HOST_KEYS["spark1"]
    config["twinspark:ssh"]["trustOnFirstUse"] = True
    run = program(config, extra_env=tofu_env(tmp_path, {}, tmp_path / "kh"), pin_host_keys=False, keyscan=None)
    assert_stopped_before_any_resource(run, "twinspark:nodes[1].hostKey: not pinned, and its first contact failed",
                                       "192.168.1.11")


@pytest.mark.parametrize("key, fragment", [
    ("ssh-ed25519", "as ssh-keyscan prints it"),
    ("ssh-ed25519 AAAA!!!", "not a base64 SSH public key"),
    ("ecdsa-sha2-nistp256 " + TEST_HOST_KEYS["spark1"].split()[1], "holds a ssh-ed25519 key"),
    ("ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC6", "one of ssh-ed25519"),
])
def test_a_malformed_host_key_is_named(key, fragment):
    import pulumi

    raw = config_blocks(pinned(stack_config()))
    raw["nodes"][1]["hostKey"] = key
    with pytest.raises(pulumi.RunError) as err:
        parse_stack_config(raw)
    assert "twinspark:nodes[1].hostKey:" in str(err.value) and fragment in str(err.value)


REAL_SSH = """
set -u
ip link set lo up
"$SSHD" "${SSHD_ARGS[@]}" & sshd=$!
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/22) 2>/dev/null && break; sleep 0.05; done
ssh "$@" root@127.0.0.1 true; rc=$?
kill "$sshd"; exit "$rc"
"""


@pytest.mark.parametrize("pin, login_key", [("its own", "plain"), ("another", "plain"), ("its own", "locked")])
def test_docker_ssh_options_hold_a_real_ssh_to_the_pinned_key(tmp_path, monkeypatch, agent, pin, login_key):
    """The docker provider's ssh, with exactly the options the program gives it, against a real
    sshd on port 22 of a private network namespace; a passphrase key signs through the agent."""
    from components.ssh_access import resolve_ssh_access

    login = new_key(tmp_path / "login", PASSPHRASE if login_key == "locked" else "")
    if login_key == "locked":
        agent.add(login, PASSPHRASE)
    argv = sshd_argv(tmp_path, 22, Path(f"{login}.pub"))
    node_key = " ".join((tmp_path / "ssh_host_ed25519_key.pub").read_text().split()[:2])
    raw = config_blocks()
    raw["ssh"] = {"user": "root", "privateKeyPath": str(login)}
    raw["nodes"] = raw["nodes"][:1]
    raw["serving"] = {**raw["serving"], "recipe": "gpt-oss-120b"}  # one node: a model that fits one Spark
    raw["nodes"][0].update(host="127.0.0.1", hostKey=node_key if pin == "its own" else OTHER_HOST_KEY)
    raw["fabric"] = {**raw["fabric"], "minBusBandwidthGBps": 0}  # one node: no cable to measure
    monkeypatch.setenv("TWINSPARK_KNOWN_HOSTS_DIR", str(tmp_path / "known_hosts.d"))
    cfg = parse_stack_config(raw)
    access = resolve_ssh_access(cfg, env=agent.env)
    opts = access.docker_ssh_opts(cfg.nodes[0])
    script = f"SSHD={argv[0]}; SSHD_ARGS=({' '.join(repr(a) for a in argv[1:])})\n" + REAL_SSH
    proc = subprocess.run(["unshare", "--net", "bash", "-c", script, "real-ssh", *opts],
                          capture_output=True, text=True, timeout=60, env={**os.environ, **agent.env})
    if pin == "its own":
        assert proc.returncode == 0, proc.stderr
    else:
        assert proc.returncode == 255 and "Host key verification failed" in proc.stderr, proc.stderr


# ---- item 6: operator-local details re-run nothing -----------------------------------------
def effective(run):
    """Per resource, what the engine would compare with the state."""
    return {r.name: (r.type, compared_inputs(r), r.parent, sorted(r.dependencies)) for r in run.resources}


def test_who_deploys_and_with_which_key_changes_no_step(program, keys, agent, recipe_run):
    agent.add(keys["locked"], PASSPHRASE)
    agent.add(keys["other"])
    runs = {
        "another key file": program(with_ssh(stack_config(), privateKeyPath=str(keys["other"]))),
        "the agent": program(with_ssh(stack_config()), extra_env=agent.env),
        "a passphrase key via the agent": program(with_ssh(stack_config(), privateKeyPath=str(keys["locked"])),
                                                  extra_env=agent.env),
        "a passphrase key with its passphrase": program(
            with_ssh(stack_config(), privateKeyPath=str(keys["locked"]), privateKeyPassphrase=PASSPHRASE),
            extra_env=agent.env, secret_keys=SSH_SECRET),
    }
    before = effective(recipe_run)
    for what, run in runs.items():
        assert run.error is None, (what, run.error)
        after = effective(run)
        assert set(after) == set(before), what
        differing = {name for name in before if before[name] != after[name]}
        # only the docker providers' ssh options: a provider update, which re-runs nothing
        assert differing <= {"spark1-docker", "spark2-docker"}, (what, differing)
        for name in differing:
            b, a = before[name][1], after[name][1]
            assert {k for k in b.keys() | a.keys() if b.get(k) != a.get(k)} == {"sshOpts"}, (what, name)
    assert all(r.ignore_changes == CREDENTIAL_FIELDS for r in node_steps(recipe_run))
    assert all(pin.ignore_changes == CREDENTIAL_FIELDS + PIN_KEEPS_ACROSS for pin in pins(recipe_run))


def test_another_machine_or_login_replaces_that_nodes_steps(program, recipe_config, recipe_run):
    recipe_config["twinspark:nodes"][1]["host"] = "192.168.1.21"
    moved = program(recipe_config)
    assert moved.error is None, moved.error
    before, after = effective(recipe_run), effective(moved)
    for r in node_steps(moved):
        b, a = before[r.name][1], after[r.name][1]
        # triggers are replaceOnChanges in pulumi-command: a change replaces the step. (spark1's
        # steps may change for their own reasons: its firewall admits its peers' addresses.)
        if a["connection"]["host"] == "192.168.1.21":
            assert (b["triggers"][0], a["triggers"][0]) == ("ssh://nvidia@192.168.1.11", "ssh://nvidia@192.168.1.21")
        else:
            assert b["triggers"][0] == a["triggers"][0] == "ssh://nvidia@192.168.1.10", r.name
    assert before["nccl-run"] != after["nccl-run"]  # which every rank follows (tests/test_nccl_ranks.py)
    provider = moved.named("spark2-docker")
    assert provider.replace_on_changes == ["host"] and provider.inputs["host"] == "ssh://nvidia@192.168.1.21"
    assert recipe_run.named("spark1-docker").inputs == moved.named("spark1-docker").inputs

    recipe_config["twinspark:ssh"]["user"] = "spark"
    relogged = program(recipe_config)
    assert all(compared_inputs(r)["triggers"][0].startswith("ssh://spark@") for r in node_steps(relogged))


def test_a_new_host_key_updates_that_nodes_steps_without_replacing_them(program, recipe_config, recipe_run):
    recipe_config["twinspark:nodes"][1]["hostKey"] = OTHER_HOST_KEY
    rekeyed = program(recipe_config)
    before, after = effective(recipe_run), effective(rekeyed)
    differing = {name for name in before if before[name] != after[name]}
    spark2_steps = {r.name for r in commands(recipe_run) if connection(r)["host"] == "192.168.1.11"}
    # and what follows the key from elsewhere (tests/test_nccl_ranks.py): its pins on the head (the
    # weight copy's, the guard's re-qualification's), the node's installation (its image, containers,
    # weights copy), the NCCL run (every rank)
    assert differing == spark2_steps | {"spark2-weights-host-key", "spark2-requalify-host-key", "spark2-installation",
                                        "nccl-run"}
    for name in spark2_steps:
        b, a = before[name][1], after[name][1]
        assert b["triggers"] == a["triggers"]  # no replacement: pulumi-command's Update runs the step again
        assert {k for k in b if b[k] != a[k]} == {"connection"}
        assert a["connection"]["hostKey"] == OTHER_HOST_KEY


def test_credentials_can_be_taken_on_purpose(program):
    run = program(extra_env={"TWINSPARK_UPDATE_CREDENTIALS": "1"})
    assert all(r.ignore_changes == [] for r in node_steps(run))
    assert all(pin.ignore_changes == PIN_KEEPS_ACROSS for pin in pins(run))  # the whole connection: the digests stay


def test_host_key_fingerprint_is_ssh_keygens(tmp_path):
    from core import host_keys

    key = new_key(tmp_path / "k")
    shown = subprocess.run(["ssh-keygen", "-lf", f"{key}.pub"], capture_output=True, text=True, check=True).stdout
    assert host_keys.fingerprint(" ".join(Path(f"{key}.pub").read_text().split()[:2])) == shown.split()[1]
