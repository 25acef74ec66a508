"""What lands on the nodes, checked with real tools: shellcheck, netplan, bash, curl, codex."""

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from core import contract
from openai_standin import Behaviour, serve
from program_harness import ROOT, config_blocks, unwrap

from components import host_prep, launch_bundle, model_weights, remote
from components.config import CopyRail, parse_stack_config
from components.client_outputs import render_codex_config, render_codex_model_catalog
from components.readiness import SCRIPT as WAIT_READY, ReadinessArgs, wait_ready_args
from components.remote import (LAUNCH_DIR, MANAGED_FILE_SCRIPT, ManagedFile, encode_secret, launch_file,
                               managed_file_script, runner_stdin, script_command, script_text)
from toolbox import agent_cli, load_launch

CFG = parse_stack_config(config_blocks())


def vllm_of(cfg):
    return launch_bundle.VllmServe(cfg.serving, cfg.model, cfg.tensor_parallel_size)
SHELL_SCRIPTS = sorted(LAUNCH_DIR.glob("*.sh")) + sorted(LAUNCH_DIR.glob("serving-image/*.sh"))


def shellcheck(path_or_text, name="script"):
    if isinstance(path_or_text, Path):
        proc = subprocess.run(["shellcheck", "-x", str(path_or_text)], capture_output=True, text=True, cwd=LAUNCH_DIR)
    else:
        proc = subprocess.run(["shellcheck", "-s", "bash", "-"], input=path_or_text, capture_output=True, text=True)
    assert proc.returncode == 0, f"{name}:\n{proc.stdout}{proc.stderr}"


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=[p.name for p in SHELL_SCRIPTS])
def test_launch_scripts_pass_shellcheck(script):
    shellcheck(script)


def test_rendered_launch_script_passes_shellcheck():
    shellcheck(launch_bundle.render_launch_vllm(vllm_of(CFG)), "launch-vllm.sh")


def test_every_remote_command_passes_shellcheck(recipe_run):
    """The bash bodies the program sends over SSH, exactly as recorded under mocks."""
    checked = 0
    for r in recipe_run.of_type("command:remote:Command"):
        for field in ("create", "delete"):
            line = unwrap(r.inputs.get(field))
            if not line:
                continue
            argv = shlex.split(line)
            assert argv[:2] == ["bash", "-c"], (r.name, field)
            shellcheck(argv[2], f"{r.name}.{field}")
            checked += 1
    assert checked >= 25


def test_netplan_generate_accepts_the_rendered_rails(tmp_path):
    for node in CFG.nodes:
        root = tmp_path / node.name
        (root / "etc/netplan").mkdir(parents=True)
        target = root / "etc/netplan/99-qsfp.yaml"
        target.write_text(host_prep.render_netplan(node, CFG.fabric.mtu))
        target.chmod(0o600)
        proc = subprocess.run(["netplan", "generate", "--root-dir", str(root)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        generated = {p.name: p.read_text() for p in (root / "run/systemd/network").glob("*")}
        for rail in node.rails:
            network = generated[f"10-netplan-{rail.iface}.network"]
            assert f"Address={rail.address}" in network
            # no DHCP on a rail: networkd's default is off, so no line may switch it on
            assert not re.search(r"^DHCP=(yes|ipv4|ipv6)$", network, re.M), network
            link = generated[f"10-netplan-{rail.iface}.link"]
            assert "MTUBytes=9000" in link


def test_example_netplan_matches_the_renderer():
    example = (ROOT / "netplan/99-qsfp.spark1.example.yaml").read_text()
    assert example == host_prep.render_netplan(CFG.head, CFG.fabric.mtu)


def fake_vllm_bundle(tmp_path, cfg, api_key="sk-test-key"):
    """A bundle directory with the rendered launch script and a `vllm` that records argv, env and pid."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    launch = bundle / "launch-vllm.sh"
    launch.write_text(launch_bundle.render_launch_vllm(vllm_of(cfg)))
    launch.chmod(0o755)
    (bundle / "secrets.env").write_text(launch_bundle.render_secrets_env(api_key))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "vllm"
    fake.write_text(
        "#!/usr/bin/env python3\nimport json, os, sys\n"
        "json.dump({'argv': sys.argv[1:], 'key': os.environ.get('VLLM_API_KEY'), 'pid': os.getpid()},"
        " open(os.environ['RECORD'], 'w'))\n"
    )
    fake.chmod(0o755)
    return launch, bin_dir


@pytest.mark.parametrize("profile, spec_tokens, seqs", [("default", 7, "6"), ("multiagent", 3, "8")])
def test_launch_script_runs_vllm_with_exact_argv(tmp_path, profile, spec_tokens, seqs):
    cfg = CFG.model_copy(update={"serving": CFG.serving.model_copy(update={"profile": profile})})
    launch, bin_dir = fake_vllm_bundle(tmp_path, cfg, api_key="sk-it's \"quoted\" $HOME")
    record = tmp_path / "record.json"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RECORD": str(record)}
    proc = subprocess.Popen([str(launch)], env=env)
    assert proc.wait(timeout=30) == 0
    seen = json.loads(record.read_text())
    assert seen["pid"] == proc.pid, "launch-vllm.sh must exec vllm (vLLM is the container's PID 1)"
    assert seen["argv"] == launch_bundle.vllm_argv(vllm_of(cfg))
    argv = seen["argv"]
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {
        "method": "dspark", "num_speculative_tokens": spec_tokens, "draft_sample_method": "probabilistic",
    }
    assert argv[argv.index("--max-num-seqs") + 1] == seqs
    # vLLM listens on loopback behind the API gateway, which alone holds the key
    assert seen["key"] is None
    assert not any("sk-it" in a for a in argv)


def test_fabric_check_reports_each_failure_with_node_rail_expected_and_measured(tmp_path):
    """On this machine `lo` is no QSFP rail: every check must fail, and say why."""
    env = {**os.environ, "PATH": f"{tmp_path}:/usr/sbin:/usr/bin:/sbin:/bin"}  # no ibv_devinfo here
    proc = subprocess.run(
        ["bash", str(LAUNCH_DIR / "fabric-check.sh"), "--node", "sparkX", "--mtu", "9000", "--speed-mbps", "200000",
         "--rail", "lo:rocep1s0f0:127.0.0.1", "--rail", "nosuchrail0:roceX:10.0.0.2"],
        capture_output=True, text=True, env=env, timeout=60,
    )
    out = proc.stdout
    assert proc.returncode == 1, out
    fails = [line for line in out.splitlines() if " FAIL " in line]
    assert all("sparkX" in line for line in fails)
    assert any("rail lo: MTU expected 9000, measured 65536" in line for line in fails), out
    assert any("rail lo: speed expected 200000 Mb/s" in line for line in fails), out
    assert any("rail lo: RoCE rocep1s0f0" in line and "ibv_devinfo missing" in line for line in fails), out
    assert any("rail nosuchrail0: interface expected present, measured absent" in line for line in fails), out
    # 127.0.0.1 answers an 8972-byte DF ping on lo (MTU 65536): that check must pass
    assert "ok   rail lo: 8972-byte DF ping to 127.0.0.1" in out


@pytest.mark.parametrize("config_hca, says", [
    ("rocep1s0f0", "ok   rail lo: HCA rocep1s0f0 (rdma link show)"),
    ("roceP2p1s0f0", "FAIL rail lo: HCA expected roceP2p1s0f0, measured rocep1s0f0: lo is rocep1s0f0's port (rdma "
                     "link show); set hca: rocep1s0f0 on this node's rail with iface: lo"),
])
def test_fabric_check_refuses_an_interface_paired_with_another_hca_naming_the_right_one(tmp_path, config_hca, says):
    """iproute2's `rdma link show` says which HCA's port each interface is (here `lo` stands in for
    the first ConnectX-7 port, the second's netdev elsewhere)."""
    (tmp_path / "rdma").write_text("#!/bin/sh\necho 'link rocep1s0f0/1 state ACTIVE physical_state LINK_UP netdev lo'\n"
                                   "echo 'link roceP2p1s0f0/1 state ACTIVE physical_state LINK_UP netdev enP2p1s0f0np0'\n")
    (tmp_path / "rdma").chmod(0o755)
    proc = subprocess.run(
        ["bash", str(LAUNCH_DIR / "fabric-check.sh"), "--node", "sparkX", "--mtu", "65536", "--speed-mbps", "200000",
         "--rail", f"lo:{config_hca}:"],
        capture_output=True, text=True, env={**os.environ, "PATH": f"{tmp_path}:/usr/sbin:/usr/bin:/sbin:/bin"},
        timeout=60)
    assert says in proc.stdout, proc.stdout


FAR_ENDS = ["--far-end", "10.0.0.2=spark2:enp1s0f0np0", "--far-end", "10.0.1.2=spark2:enP2p1s0f0np0"]
ARP = {"answered": "10.0.1.2 dev lo lladdr 02:00:00:00:01:02 used 0/0/0probes 1 REACHABLE",
       "long_ago": "10.0.1.2 dev lo lladdr 02:00:00:00:01:02 used 40/40/40probes 1 REACHABLE",
       "failed": "10.0.0.2 dev lo  used 1/1/1probes 3 FAILED"}


@pytest.mark.parametrize("neighbours, small_ping_answered_by, lldp, says", [
    ({"10.0.1.2": "answered", "10.0.0.2": "failed"}, None, None,
     "its cable reaches spark2's enP2p1s0f0np0 (10.0.1.2 answered ARP on lo), not spark2's enp1s0f0np0: crossed "
     "cables: plug it into spark2's enp1s0f0np0"),
    ({"10.0.0.2": "answered"}, None, None,
     "its cable reaches spark2's enp1s0f0np0 (it answers), which the full-size ping does not: an MTU below 65536 on"),
    # its ARP entry confirmed long ago (traffic keeps it REACHABLE, no new ARP asked), a small ping answered now
    ({"10.0.0.2": "long_ago"}, "10.0.0.2", None,
     "its cable reaches spark2's enp1s0f0np0 (it answers), which the full-size ping does not"),
    ({}, None, None, "nothing on its cable answers ARP for any other node's rail: unplugged, or the far end's rail down"),
    ({"10.0.1.2": "long_ago"}, None, None, "nothing on its cable answers ARP"),  # another cabling's confirmation
    ({"10.0.0.2": "answered", "10.0.1.2": "answered"}, None, None,
     "its cable reaches a node that answers ARP for several rails (10.0.0.2 10.0.1.2): is HostPrep's arp_ignore"),
    ({}, None, "lldp.lo.chassis.name=spark2\nlldp.lo.port.mac=02:00:00:00:01:02\nlldp.lo.port.descr=enP2p1s0f0np0",
     "LLDP: its cable reaches spark2's enP2p1s0f0np0, expected spark2's enp1s0f0np0"),
], ids=["crossed", "drops-the-ping", "small-ping-answered", "unplugged", "stale-answer", "arp-flux", "lldp"])
def test_an_unanswered_rail_says_which_far_end_its_cable_reaches(tmp_path, neighbours, small_ping_answered_by, lldp,
                                                                  says):
    """The DF ping to the peer's rail0 address goes unanswered (a stand-in ping: a full-size one never,
    a small one only from `small_ping_answered_by`); `ip -s neigh` (a stand-in answering as the
    kernel's table would after the probe) says which rail answered ARP on this cable, or lldpd's
    neighbour says it."""
    (tmp_path / "ping").write_text('#!/bin/sh\ncase "$*" in *"-M do"*) exit 1 ;; '
                                   f'*" {small_ping_answered_by}") exit 0 ;; esac\nexit 1\n')
    table = "".join(f'  *" to {addr}") echo "{ARP[state]}" ;;\n' for addr, state in neighbours.items())
    (tmp_path / "ip").write_text(f'#!/bin/sh\ncase "$*" in\n{table}esac\n')
    if lldp:
        (tmp_path / "lldpcli").write_text(f"#!/bin/sh\nprintf '{lldp}\\n'\n")
    for tool in tmp_path.iterdir():
        tool.chmod(0o755)
    proc = subprocess.run(
        ["bash", str(LAUNCH_DIR / "fabric-check.sh"), "--node", "sparkX", "--mtu", "65536", "--speed-mbps", "200000",
         "--rail", "lo:rocep1s0f0:10.0.0.2", *FAR_ENDS],
        capture_output=True, text=True, env={**os.environ, "PATH": f"{tmp_path}:/usr/sbin:/usr/bin:/sbin:/bin"},
        timeout=60)
    assert proc.returncode == 1, proc.stdout
    line = next(line for line in proc.stdout.splitlines() if "don't-fragment ping to 10.0.0.2" in line)
    assert "FAIL rail lo: 65508-byte don't-fragment ping to 10.0.0.2 expected answered, measured no reply; " in line
    assert says in line, line


def run_remote(line, stdin=""):
    return subprocess.run(["bash", "-c", line], input=stdin, capture_output=True, text=True, timeout=60)


@pytest.fixture
def private_node(tmp_path):
    """A private mount namespace standing in for a node: the applied-state directory on a tmpfs
    and recording shims first on sudo's PATH (/usr/local/bin), as on a simulated node."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.fail("needs root and unshare (CI runs as root)")
    shims = tmp_path / "shims"
    shims.mkdir()
    calls = tmp_path / "calls"
    for tool in ("systemctl", "sysctl", "netplan", "systemd-run"):
        (shims / tool).write_text(f"#!/bin/sh\n[ -e {tmp_path}/fail-{tool} ] && {{ rm {tmp_path}/fail-{tool}; exit 3; }}\n"
                                  f"echo \"{tool} $*\" >> {calls}\n")
        (shims / tool).chmod(0o755)
    prefix = (f"mkdir -p /var/lib/twinspark && mount -t tmpfs tmpfs /var/lib/twinspark && "
              f"mount --bind {shims} /usr/local/bin && ")
    return lambda script: subprocess.run(["unshare", "--mount", "bash", "-c", prefix + script],
                                         capture_output=True, text=True, timeout=60), calls


def managed_file_lines(tmp_path, path, action="systemd", mode="0600", owner_node="spark1"):
    """install/remove command lines for one managed file, and a stdin file per content."""
    f = ManagedFile("test", str(path), "", mode, action)
    run = managed_file_script(owner_node, "hostprep", f)
    install, remove = script_command(MANAGED_FILE_SCRIPT, run.args), script_command(MANAGED_FILE_SCRIPT, run.delete_args)

    def stdin(content):
        file = tmp_path / f"stdin-{abs(hash(content))}"
        file.write_text(script_text(MANAGED_FILE_SCRIPT) + content)
        return file

    return install, remove, stdin


def test_managed_file_is_idempotent_and_reverts(tmp_path, private_node):
    run, calls = private_node
    target = tmp_path / "etc" / "managed.conf"
    install, remove, stdin = managed_file_lines(tmp_path, target)
    # three installs of the same content, one after a content change, then two removes
    script = (
        f"{install} < {stdin('a=1')}; {install} < {stdin('a=1')}; {install} < {stdin('a=2')}; "
        f"stat -c %a:%U {target}; cat {target}; echo; {remove} < {stdin('')}; {remove} < {stdin('')}; test ! -e {target}"
    )
    proc = run(script)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines == [f"installed: {target}", f"unchanged: {target}", f"installed: {target}", "600:root", "a=2",
                     f"removed: {target}"]  # the second remove found nothing to do and printed nothing
    # applied once per real change, reverted once
    assert calls.read_text().splitlines() == ["systemctl daemon-reexec"] * 3


def test_managed_service_is_restarted_on_change_and_stopped_on_remove(tmp_path, private_node):
    run, calls = private_node
    target = tmp_path / "etc" / "twinspark-test.service"
    install, remove, stdin = managed_file_lines(tmp_path, target, action="service", mode="0644")
    proc = run(f"{install} < {stdin('[Service]')}; {install} < {stdin('[Service]')}; "
               f"{install} < {stdin('[Service] ')}; {remove} < {stdin('')}")
    assert proc.returncode == 0, proc.stderr
    name = target.name
    assert calls.read_text().splitlines() == [
        "systemctl daemon-reload", f"systemctl enable --quiet {name}", f"systemctl restart {name}",  # first install
        "systemctl daemon-reload", f"systemctl enable --quiet {name}", f"systemctl restart {name}",  # changed
        f"systemctl disable --now --quiet {name}", "systemctl daemon-reload",  # removed: stopped first
    ]


def test_managed_file_reapplies_when_the_last_apply_failed(tmp_path, private_node):
    run, calls = private_node
    target = tmp_path / "f.conf"
    (tmp_path / "fail-systemctl").write_text("")
    install, _, stdin = managed_file_lines(tmp_path, target, owner_node="spark2")
    proc = run(f"{install} < {stdin('v')} || echo FAILED; {install} < {stdin('v')}")
    assert "FAILED" in proc.stdout and "managed-file spark2: step hostprep/test failed (exit 3)" in proc.stderr
    assert proc.stdout.strip().endswith(f"installed: {target}"), proc.stdout
    assert calls.read_text().splitlines() == ["systemctl daemon-reexec"]


def test_managed_file_records_reveal_nothing_and_only_root_reads_them(tmp_path, private_node):
    """A secret file's record must not let anyone test a guess (`printf 'VLLM_API_KEY=%s\\n' guess |
    sha256sum`): it names the owner only, in a directory only root opens."""
    run, _ = private_node
    target = tmp_path / "secrets.env"
    install, _, stdin = managed_file_lines(tmp_path, target, action="none")
    content = "VLLM_API_KEY=" + "k" * 48 + "\n"
    state = contract.APPLIED_STATE_DIR
    proc = run(f"{install} < {stdin(content)}; {install} < {stdin(content)}; "
               f"stat -c '%a %n' {state} {state}/*; cat {state}/*")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:2] == [f"installed: {target}", f"unchanged: {target}"]
    record = f"{state}/{str(target).lstrip('/').replace('/', '_')}.applied"
    assert lines[2:] == [f"700 {state}", f"600 {record}", "spark1-hostprep-test"]
    digests = {hashlib.new(name, content.encode()).hexdigest() for name in ("sha256", "sha1", "md5", "sha512")}
    assert not any(d in proc.stdout for d in digests)


def test_managed_file_remove_keeps_a_file_another_resource_owns(tmp_path, private_node):
    """A renamed resource: the engine creates the new one, then runs the old one's delete."""
    run, calls = private_node
    target = tmp_path / "renamed.conf"
    _, old_remove, stdin = managed_file_lines(tmp_path, target, owner_node="old")
    new_install, _, _ = managed_file_lines(tmp_path, target, owner_node="new")
    proc = run(f"{new_install} < {stdin('x')}; {old_remove} < {stdin('')}; cat {target}")
    assert proc.returncode == 0, proc.stderr
    assert f"kept: {target} (now managed by new-hostprep-test)" in proc.stdout
    assert proc.stdout.rstrip().endswith("x")


def test_scripts_refuse_a_flag_without_its_value(tmp_path):
    proc = subprocess.run(["bash", str(LAUNCH_DIR / "fetch-weights.sh"), "download", "--repo", "a/b", "--dir"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "usage error: --dir needs a value" in proc.stderr
    assert "unbound variable" not in proc.stderr


@pytest.fixture
def fake_endpoint():
    """vLLM still loading for 3 s (connections refused, as real vLLM's are), then serving CFG's model with its key."""
    behaviour = Behaviour(api_key="sk-ready-test", model=CFG.model.served_name, load_s=3)
    server = serve(behaviour)
    yield server.server_address[1], behaviour
    server.shutdown()


def readiness_command(port, timeout_s, logs=()):
    """The program's readiness arguments for a local endpoint; `logs` replace the head's log files."""
    args = ReadinessArgs(CFG.head.name, None, port, CFG.model.served_name, 1, "unused", [])
    argv = wait_ready_args(args)
    argv[argv.index("--timeout-s") + 1] = str(timeout_s)
    if logs:
        argv = [a for i, a in enumerate(argv) if a != "--log" and (i == 0 or argv[i - 1] != "--log")]
        argv += [a for log in logs for a in ("--log", str(log))]
    return script_command(WAIT_READY, argv, secret_env=["VLLM_API_KEY"])


def test_a_secret_that_looks_like_script_never_runs(tmp_path):
    """Even if validation let it through: each secret is one base64 line on stdin, decoded into
    the environment, so a newline, `$(...)` or a quote in it is data, never script."""
    secrets = {
        "FIRST": "sk-0123456789abcdef\n$(touch ran-1)\ntouch ran-2; `touch ran-3`",
        "SECOND": "'; touch ran-4 #\necho \"$(touch ran-5)\"",
    }
    probe = '{\nprintf %s "$FIRST" > first; printf %s "$SECOND" > second\nexit\n}\n'
    line = script_command("secret-probe.sh", [], secret_env=list(secrets))
    stdin = runner_stdin(list(secrets.values()), probe, payload="touch ran-6\n")
    proc = subprocess.run(["bash", "-c", line], input=stdin, cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "first").read_text() == secrets["FIRST"]
    assert (tmp_path / "second").read_text() == secrets["SECOND"]
    assert sorted(p.name for p in tmp_path.glob("ran-*")) == []
    for value in secrets.values():
        assert value not in line


def test_readiness_waits_for_health_then_an_authorized_completion(fake_endpoint):
    port, behaviour = fake_endpoint
    line = readiness_command(port, 60)
    proc = run_remote(line, stdin=encode_secret(behaviour.api_key) + script_text(WAIT_READY))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "serving: a 1-token completion succeeded" in proc.stdout
    # the polls while it loaded (3 s) were refused, one a second, and a later one answered
    assert proc.stdout.count("waiting for health") == 1
    answered_after = int(re.search(r"/health answers after (\d+) s", proc.stdout).group(1))
    assert answered_after >= 3
    assert behaviour.health_calls == 1
    last = behaviour.requests[-1]
    assert last.authorized and last.body["model"] == "ds-0731" and last.body["max_tokens"] == 1
    assert behaviour.api_key not in line


def test_readiness_times_out_with_the_log_tail(fake_endpoint, tmp_path):
    port, behaviour = fake_endpoint
    logs = [tmp_path / "boot-head.log", tmp_path / "vllm.log"]
    for log in logs:
        log.write_text("".join(f"{log.stem} line {i}\n" for i in range(100)))
    line = readiness_command(port, 14, logs)
    proc = run_remote(line, stdin=encode_secret("wrong-key") + script_text(WAIT_READY))
    assert proc.returncode == 1
    assert "not serving after 14 s" in proc.stdout
    for log in logs:  # the last 40 lines of each log, named, and nothing older
        assert f"  {log.name} | {log.stem} line 99" in proc.stdout and f"{log.stem} line 60" in proc.stdout
        assert f"{log.stem} line 59\n" not in proc.stdout
    assert behaviour.requests and not any(r.authorized for r in behaviour.requests)


def test_codex_accepts_the_generated_config_and_catalog(tmp_path):
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(render_codex_config([CFG]))
    catalog = tmp_path / "catalog.json"
    catalog.write_text(render_codex_model_catalog([CFG]))
    proc = subprocess.run(
        [agent_cli("codex"), "debug", "models", "-c", f'model_catalog_json="{catalog}"'],
        capture_output=True, text=True, timeout=120, env={**os.environ, "CODEX_HOME": str(home)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    models = json.loads(proc.stdout)["models"]
    assert [m["slug"] for m in models] == ["ds-0731"]
    assert models[0]["context_window"] == 1048576
    assert models[0]["apply_patch_tool_type"] == "freeform"


def test_nccl_check_bus_bandwidth_and_network_parsing():
    check = load_launch("nccl-allreduce-check.py")
    algbw, busbw = check.bus_bandwidth_gbps(1 << 30, 0.1, 2)
    assert algbw == pytest.approx(10.737, abs=1e-3) and busbw == algbw  # 2(n-1)/n = 1 for two nodes
    assert check.bus_bandwidth_gbps(1 << 30, 0.1, 3)[1] == pytest.approx(algbw * 4 / 3)
    info = ("spark1:123:123 [0] NCCL INFO NET/Plugin: Using internal network plugin.\n"
            "spark1:123:123 [0] NCCL INFO NET/IB : Using [0]rocep1s0f0:1/RoCE [1]roceP2p1s0f0:1/RoCE\n"
            "spark1:123:123 [0] NCCL INFO Using network IB\n")
    assert check.chosen_network(info) == "IB"
    assert check.chosen_network("NCCL INFO NET/Socket : Using [0]enP7s7\nNCCL INFO Using network Socket\n") == "Socket"
    assert check.chosen_network("") is None


def test_logrotate_accepts_the_rendered_config(tmp_path):
    conf = tmp_path / "twinspark"
    conf.write_text(host_prep.render_logrotate())
    proc = subprocess.run(["logrotate", "--debug", "--state", str(tmp_path / "state"), str(conf)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "rotating pattern: /var/log/twinspark/*.log" in proc.stderr
    assert "copytruncate" in host_prep.render_logrotate()


GIB = 1 << 30


def local_memtotal_kb():
    return next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal:"))


def run_script(tmp_path, script: str, argv: list[str], payload: str = "") -> subprocess.CompletedProcess:
    """A launch script exactly as the program sends it, with an `ssh` on the PATH that fails the test if
    called (the shape check reaches no other node)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "ssh").write_text(f"#!/bin/bash\necho \"$*\" >> {tmp_path}/ssh-calls\nexit 255\n")
    (bin_dir / "ssh").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", "-c", script_command(script, argv)], input=script_text(script) + payload,
                          capture_output=True, text=True, env=env, timeout=60)
    assert not (tmp_path / "ssh-calls").exists(), (tmp_path / "ssh-calls").read_text()
    return proc


def run_shape_check(tmp_path, config, sizes, tp, peers_kb=(), utilization=0.85, memory_fit=(), pp=1):
    """model-shape-check exactly as the program sends it, on a generated model directory, each peer's
    MemTotal as its memory step printed it."""
    model = tmp_path / "model"
    model.mkdir()
    if config is not None:
        (model / "config.json").write_text(json.dumps(config))
    (model / ".twinspark-manifest").write_text(json.dumps(
        {"revision": "0" * 40, "files": {name: {"size": size, "sha256": "0" * 64} for name, size in sizes.items()}}))
    workers = [model_weights.NodeAccess(f"spark{i + 2}", None, [CopyRail(f"10.0.0.{i + 2}", "10.0.0.1")])
               for i in range(len(peers_kb))]
    args = model_weights.ModelWeightsArgs(
        repo="org/model", dir=str(model), downloader_image="img", ssh_user="nvidia",
        head=model_weights.NodeAccess("spark1", None), workers=workers, hf_token=None,
        revision=None,
        tensor_parallel_size=tp, gpu_memory_utilization=utilization, memory_fit=memory_fit, pipeline_parallel_size=pp)
    printed = [model_weights.parse_memory_kb(f"memory-kb {w.name}={kb}\n", w.name) for w, kb in zip(workers, peers_kb)]
    return run_script(tmp_path, model_weights.SHAPE_SCRIPT, model_weights.shape_check_args(args, printed),
                      launch_file(model_weights.SHAPE_PROGRAM))


def test_a_workers_memory_step_prints_its_memtotal_for_the_shape_check(tmp_path):
    proc = run_script(tmp_path, model_weights.SHAPE_SCRIPT, ["memory", "--node", "spark2"])
    assert proc.returncode == 0, proc.stderr
    assert model_weights.parse_memory_kb(proc.stdout, "spark2") == f"spark2={local_memtotal_kb()}"
    with pytest.raises(ValueError, match="spark3: the memory step printed no 'memory-kb spark3=KB' line"):
        model_weights.parse_memory_kb(proc.stdout, "spark3")
    bad = run_script(tmp_path, model_weights.SHAPE_SCRIPT, ["memory"])
    assert bad.returncode == 2 and "--node" in bad.stderr, bad.stderr
    typo = run_script(tmp_path, model_weights.SHAPE_SCRIPT, ["--node", "spark2"])
    assert typo.returncode == 2 and "expected 'memory' or 'check' first, got '--node'" in typo.stderr, typo.stderr


SHARDS = {"model-00001-of-00002.safetensors": 3 * GIB, "model-00002-of-00002.safetensors": GIB,
          "config.json": 2000, "tokenizer.json": 9 * GIB}  # only safetensors count as weights


def test_shape_check_passes_a_model_that_splits_and_fits(tmp_path):
    big = 64 << 20  # kB: 64 GiB on the peer
    proc = run_shape_check(tmp_path, {"num_attention_heads": 64, "num_key_value_heads": 8}, SHARDS, tp=2,
                           peers_kb=[big])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "model-shape-check spark1: ok   attention heads: 64 over TP 2, 32 per node" in out, out
    assert "ok   KV heads: 8 over TP 2, 4 per node" in out, out
    assert "ok   weights: 4.0 GiB of safetensors, 2.0 GiB per node over TP 2" in out, out
    assert "within 0.85 × MemTotal on every node (spark1 " in out and ", spark2 64.0 GiB)" in out, out


def test_shape_check_fails_a_third_node_the_heads_cannot_split_over(tmp_path):
    proc = run_shape_check(tmp_path, {"num_attention_heads": 64, "num_key_value_heads": 8}, SHARDS, tp=3,
                              peers_kb=[64 << 20, 64 << 20])
    assert proc.returncode == 1, proc.stdout
    assert "FAIL attention heads: 64 not divisible by TP 3 (the node count)" in proc.stdout, proc.stdout
    assert "FAIL KV heads: 8 neither divisible by TP 3 nor a divisor of it" in proc.stdout, proc.stdout
    assert "cannot run over these 3 nodes at TP 3 × PP 1" in proc.stderr, proc.stderr
    assert "FAIL layout: TP 3 does not split this model; with 3 nodes set serving.pipelineParallel: 3 (TP=1)" \
        in proc.stdout, proc.stdout


# DeepSeek-V4-Flash's config.json as far as the shape check reads it (recipes/: shape)
SEED_SHAPE = {"num_attention_heads": 64, "num_key_value_heads": 1, "num_hidden_layers": 43}


def test_shape_check_splits_the_layers_over_pp_stages_and_the_heads_over_tp_only(tmp_path):
    proc = run_shape_check(tmp_path, SEED_SHAPE, SHARDS, tp=1, pp=3, peers_kb=[64 << 20] * 2)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "ok   attention heads: 64 over TP 1, 64 per node" in out, out
    assert "ok   hidden layers: 43 over PP 3, 14/15/14 per stage (uneven, as vLLM's get_pp_indices splits them)" \
        in out, out
    assert "ok   weights: 4.0 GiB of safetensors, 1.3 GiB per node over TP 1 × PP 3" in out, out


def test_shape_check_refuses_more_pp_stages_than_layers_and_says_no_layout_works(tmp_path):
    proc = run_shape_check(tmp_path, {"num_attention_heads": 8, "num_hidden_layers": 2}, SHARDS, tp=1, pp=3,
                              peers_kb=[64 << 20] * 2)
    assert proc.returncode == 1, proc.stdout
    assert "FAIL hidden layers: 2 fewer than PP 3 stages" in proc.stdout, proc.stdout
    assert "nor does any TP × PP of 3 nodes" in proc.stdout, proc.stdout
    assert "cannot run over these 3 nodes at TP 1 × PP 3" in proc.stderr, proc.stderr


@pytest.mark.parametrize("layers, pp, split", [(43, 3, [14, 15, 14]), (10, 4, [2, 3, 3, 2]), (7, 4, [2, 2, 2, 1]),
                                               (61, 1, [61]), (8, 2, [4, 4])])
def test_layers_split_as_vllms_get_pp_indices_does(layers, pp, split):
    """vllm/distributed/utils.py get_pp_indices @ 5a6541db: layers // pp each, the remainder one each to
    the stages before the last, counted from the last back."""
    from test_memory_fit import shape_check

    assert shape_check.pp_partition(layers, pp) == split


@pytest.mark.parametrize("config, tp, line", [
    ({"num_attention_heads": 48, "num_key_value_heads": 1}, 3, "ok   KV heads: 1, each replicated on 3 nodes"),
    ({"num_attention_heads": 32, "num_key_value_heads": 2}, 4, "ok   KV heads: 2, each replicated on 2 nodes"),
    ({"num_attention_heads": 24}, 3, "ok   KV heads: 24 over TP 3, 8 per node"),  # absent: one per attention head
    ({"num_attention_heads": 64, "num_key_value_heads": 64, "kv_lora_rank": 512}, 2,
     "ok   KV heads: latent (MLA, kv_lora_rank 512), the same on every node"),
    ({"text_config": {"num_attention_heads": 40, "num_key_value_heads": 8}}, 2, "ok   attention heads: 40 over TP 2"),
])
def test_shape_check_follows_vllms_head_rules(tmp_path, config, tp, line):
    proc = run_shape_check(tmp_path, config, SHARDS, tp=tp, peers_kb=[64 << 20] * (tp - 1))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert line in proc.stdout, proc.stdout


def test_shape_check_fails_weights_beyond_the_smallest_nodes_memory(tmp_path):
    small = 2 << 20  # kB: 2 GiB on the peer, 1.7 GiB of it for vLLM at 0.85
    sizes = {"model-00001.safetensors": 5 * GIB, "model-00002.safetensors": GIB}  # 3 GiB per node at TP 2
    proc = run_shape_check(tmp_path, {"num_attention_heads": 64}, sizes, tp=2, peers_kb=[small])
    assert proc.returncode == 1, proc.stdout
    assert ("FAIL weights: 6.0 GiB of safetensors need 3.0 GiB per node over TP 2, but 0.85 × spark2's "
            "MemTotal 2.0 GiB leaves 1.7 GiB") in proc.stdout, proc.stdout


def test_shape_check_without_heads_in_config_checks_memory_and_says_so(tmp_path):
    proc = run_shape_check(tmp_path, {"architectures": ["Custom"]}, SHARDS, tp=2, peers_kb=[64 << 20])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "skip attention heads: config.json names no num_attention_heads" in proc.stdout, proc.stdout
    assert "ok   weights:" in proc.stdout


def test_shape_check_fails_without_config_json(tmp_path):
    proc = run_shape_check(tmp_path, None, SHARDS, tp=1)
    assert proc.returncode == 1
    assert "FAIL config.json: missing" in proc.stdout, proc.stdout


FORCED = ["python3", f"{contract.SYNC_KEY_COMMAND_DIR}/sync-key-command.py", "--node", "spark4"]


def test_a_login_beside_an_authorization_always_finds_the_users_own_key(tmp_path):
    """sshd reads authorized_keys at every login, the docker provider's among them, while `pulumi
    up` authorizes a sync key on the same node: the file is never seen without the user's key
    (a ring's first up failed on `Permission denied (publickey)` while it was rewritten in place)."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    keys = home / ".ssh" / "authorized_keys"
    keys.write_text("ssh-ed25519 AAAAuser me@laptop\n")
    line = remote.render_authorized_key_line("10.0.0.1", f"ssh-ed25519 AAAAhead {contract.SYNC_KEY_COMMENT}@node",
                                                    FORCED)
    done, reads, missing = threading.Event(), [0], []

    def login():  # what sshd does: open and read the file
        while not done.is_set():
            text = keys.read_text()
            reads[0] += 1
            if "AAAAuser" not in text:
                missing.append(text)

    reader = threading.Thread(target=login)
    reader.start()
    try:
        for verb in ("add", "remove") * 15:
            proc = subprocess.run(["bash", str(LAUNCH_DIR / "authorize-key.sh"), verb, "--comment", contract.SYNC_KEY_COMMENT,
                                   "--owner", "spark2-weights-authorize"], input=line,
                                  env={**os.environ, "HOME": str(home)}, capture_output=True, text=True, timeout=30)
            assert proc.returncode == 0, proc.stderr
    finally:
        done.set()
        reader.join()
    assert reads[0] > 100, reads  # the reader really ran beside the rewrites
    assert missing == [], f"{len(missing)} of {reads[0]} reads lacked the user's key, e.g. {missing[0]!r}"
    # no temporary left (the lock that orders the edits stays, empty)
    assert sorted(p.name for p in keys.parent.iterdir()) == ["authorized_keys", "authorized_keys.lock"]
    assert oct(keys.stat().st_mode & 0o777) == "0o600"


def test_two_keys_authorized_at_once_on_one_node_both_stay(tmp_path):
    """The weight copy's key and the guard's re-qualification key are authorized by steps that run at
    once on a worker (the rehearsal of cdf6d94 lost the sync key's line on the four-node switch: the
    relay could not ship the image). Twelve adds at once, six sources of each key: every line stays."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    keys = home / ".ssh" / "authorized_keys"
    keys.write_text("ssh-ed25519 AAAAuser me@laptop\n")
    adds = []
    for i in range(6):
        for comment in (contract.SYNC_KEY_COMMENT, contract.REQUALIFY_KEY_COMMENT):
            line = remote.render_authorized_key_line(f"10.0.0.{i + 1}", f"ssh-ed25519 AAAA{comment[10:]}{i} {comment}@node",
                                                     FORCED)
            adds.append(subprocess.Popen(["bash", str(LAUNCH_DIR / "authorize-key.sh"), "add", "--comment", comment,
                                          "--owner", f"node-{comment}-{i}"], stdin=subprocess.PIPE, text=True,
                                         env={**os.environ, "HOME": str(home)}))
            adds[-1].stdin.write(line)
            adds[-1].stdin.close()
    assert [proc.wait(timeout=60) for proc in adds] == [0] * 12
    held = sorted(row.split()[-2] for row in keys.read_text().splitlines())
    assert held == sorted(["AAAAuser", *(f"AAAA{c[10:]}{i}" for i in range(6)
                                         for c in (contract.SYNC_KEY_COMMENT, contract.REQUALIFY_KEY_COMMENT))]), held


def test_each_source_of_a_copy_has_its_own_authorization_which_a_new_key_replaces_and_remove_takes_alone(tmp_path):
    """A worker on a switch of four admits the head's sync key and its relay's, each from its rail
    address: a reinstalled relay's new key replaces only the relay's line; removing the relay's
    authorization leaves the head's (and the user's own keys) in place."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    keys = home / ".ssh" / "authorized_keys"
    keys.write_text("ssh-ed25519 AAAAuser me@laptop\n")

    def authorize(verb, source_ip, key, owner):
        line = remote.render_authorized_key_line(source_ip, f"ssh-ed25519 {key} {contract.SYNC_KEY_COMMENT}@node",
                                                        FORCED)
        proc = subprocess.run(["bash", str(LAUNCH_DIR / "authorize-key.sh"), verb, "--comment", contract.SYNC_KEY_COMMENT,
                               "--owner", owner], input=line, env={**os.environ, "HOME": str(home)},
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
        return [row.split()[-2] for row in keys.read_text().splitlines()]

    assert authorize("add", "10.0.0.1", "AAAAhead", "spark4-weights-authorize") == ["AAAAuser", "AAAAhead"]
    assert authorize("add", "10.0.0.2", "AAAArelay", "spark4-weights-relay-authorize") == [
        "AAAAuser", "AAAAhead", "AAAArelay"]
    assert authorize("add", "10.0.0.2", "AAAArelay", "spark4-weights-relay-authorize") == [
        "AAAAuser", "AAAAhead", "AAAArelay"]  # twice: unchanged
    assert authorize("add", "10.0.0.2", "AAAAreinstalled", "spark4-weights-relay-authorize") == [
        "AAAAuser", "AAAAhead", "AAAAreinstalled"]
    # the relay's steps done: its key revoked (the authorization keeps its owner, and opens again)
    assert authorize("revoke", "10.0.0.2", "AAAAreinstalled", "spark4-weights-relay-authorize") == [
        "AAAAuser", "AAAAhead"]
    assert authorize("revoke", "10.0.0.2", "AAAAreinstalled", "spark4-weights-relay-authorize") == [
        "AAAAuser", "AAAAhead"]  # twice: unchanged
    assert authorize("add", "10.0.0.2", "AAAAreinstalled", "spark4-weights-relay-authorize") == [
        "AAAAuser", "AAAAhead", "AAAAreinstalled"]
    assert authorize("remove", "10.0.0.2", "AAAAreinstalled", "spark4-weights-relay-authorize") == [
        "AAAAuser", "AAAAhead"]
    assert authorize("remove", "10.0.0.1", "AAAAhead", "spark4-weights-authorize") == ["AAAAuser"]


def test_each_opening_prints_anew_so_the_revoke_that_follows_it_runs_again(tmp_path):
    """The revoke's triggers hold the authorization's output: an `up` that opens the key again (a failed
    step's settings reverted) changes it even where the key was already admitted."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    line = remote.render_authorized_key_line("10.0.0.1", f"ssh-ed25519 AAAAhead {contract.SYNC_KEY_COMMENT}@node",
                                             FORCED)

    def add() -> str:
        proc = subprocess.run(["bash", str(LAUNCH_DIR / "authorize-key.sh"), "add", "--comment", contract.SYNC_KEY_COMMENT,
                               "--owner", "spark2-weights-authorize"], input=line, env={**os.environ, "HOME": str(home)},
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    first, again = add(), add()
    assert re.fullmatch(r"authorized: weights key from 10\.0\.0\.1 \(opened [0-9T:.-]+Z\)\n", first), first
    assert re.fullmatch(r"unchanged: weights key from 10\.0\.0\.1 authorized \(checked [0-9T:.-]+Z\)\n", again), again
    assert again.split("(")[1] != first.split("(")[1]


def test_an_authorization_without_its_forced_command_is_refused(tmp_path):
    """The line authorize-key.sh takes names the source and the forced command: a bare key (a login) is refused."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    bare = f'from="10.0.0.1",restrict ssh-ed25519 AAAAhead {contract.SYNC_KEY_COMMENT}@node\n'
    proc = subprocess.run(["bash", str(LAUNCH_DIR / "authorize-key.sh"), "add", "--comment", contract.SYNC_KEY_COMMENT,
                           "--owner", "spark2-weights-authorize"], input=bare, env={**os.environ, "HOME": str(home)},
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0 and 'command=\"...\"' in proc.stderr, proc.stderr
    assert not (home / ".ssh" / "authorized_keys").exists()
