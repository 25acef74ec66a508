"""The doors on a node, with the real tools: the host firewall under nft in network namespaces,
and the API gateway under nginx in front of a recording upstream (issue 9)."""

import contextlib
import json
import os
import random
import shutil
import socket
import string
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from program_harness import ROOT, config_blocks
from test_node_artifacts import managed_file_lines, private_node  # noqa: F401 (fixture)

from core import contract
from components import firewall, host_prep, launch_bundle
from components.config import Topology, parse_stack_config, resolve_node_addresses
from components.remote import LAUNCH_DIR
from toolbox import free_port, sh, wait_for

CFG = parse_stack_config(config_blocks())
HEAD, WORKER = CFG.nodes
API_KEY = "sk-gateway-test-0123456789"
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))  # the upstream uses the stand-in's Unix server (PYTHONPATH)


TOPOLOGY = Topology(CFG, resolve_node_addresses(CFG.nodes))


def firewall_text(node=HEAD, topology=TOPOLOGY):
    return firewall.render_firewall(node, firewall.firewall_policy(node, topology))


# ---- firewall ---------------------------------------------------------------------------------
def test_firewall_loads_and_a_reload_changes_nothing(tmp_path):
    rules = tmp_path / "fw.nft"
    rules.write_text(firewall_text())
    script = f"nft -f {rules} && nft list ruleset > {tmp_path}/a && nft -f {rules} && nft list ruleset > {tmp_path}/b"
    proc = sh("unshare", "--net", "bash", "-c", script, check=False)
    assert proc.returncode == 0, proc.stderr
    first = (tmp_path / "a").read_text()
    assert first == (tmp_path / "b").read_text()
    assert "policy drop" in first and 'iifname "enp1s0f0np0" ip saddr 10.0.0.2 tcp dport 6379 accept' in first


STRANGER_LAN, STRANGER_RAIL = "192.168.1.50", "10.0.0.99"  # a laptop on the LAN, a device on a rail switch
PROBED_PORTS = [22, 8000, 3000, contract.RAY_PORT, contract.WEIGHTS_SYNC_PORT, contract.NODE_EXPORTER_PORT, 10005,
                contract.MP_MASTER_PORT, contract.NCCL_RENDEZVOUS_PORT, 40000]


def reachable_ports(tmp_path, node, rules_text, after_load=""):
    """`node`'s rules loaded in a netns of its own with its LAN and first-rail interfaces, every
    PROBED_PORT listening (IPv4 and IPv6); each source (a stranger and every other node, on the LAN
    and on the rail) tries each port: {source address: [ports it reached]}. `after_load`: an nft
    command run in the node's netns once the table is loaded."""
    tag = f"tsfw{os.getpid() % 100000}"  # concurrent runs must not share namespaces
    ns_node, ns_lan, ns_rail = f"{tag}-node", f"{tag}-lan", f"{tag}-rail"
    others = [m for m in CFG.nodes if m.name != node.name]
    lan_sources = [STRANGER_LAN, *(m.host for m in others)]
    rail_sources = [STRANGER_RAIL, *(m.rails[0].ip for m in others)]
    try:
        for ns in (ns_node, ns_lan, ns_rail):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        rail_iface = node.rails[0].iface[:15]
        sh("ip", "link", "add", "tsfw-m0", "netns", ns_node, "type", "veth", "peer", "name", "tsfw-m1", "netns", ns_lan)
        sh("ip", "link", "add", rail_iface, "netns", ns_node, "type", "veth", "peer", "name", "tsfw-r1", "netns", ns_rail)
        sh("ip", "-n", ns_node, "addr", "add", f"{node.host}/24", "dev", "tsfw-m0")
        sh("ip", "-n", ns_node, "addr", "add", "fd00:ab::1/64", "dev", "tsfw-m0", "nodad")
        sh("ip", "-n", ns_node, "addr", "add", node.rails[0].address, "dev", rail_iface)
        for address in lan_sources:
            sh("ip", "-n", ns_lan, "addr", "add", f"{address}/24", "dev", "tsfw-m1")
        sh("ip", "-n", ns_lan, "addr", "add", "fd00:ab::50/64", "dev", "tsfw-m1", "nodad")
        for address in rail_sources:
            sh("ip", "-n", ns_rail, "addr", "add", f"{address}/24", "dev", "tsfw-r1")
        for ns, iface in ((ns_node, "tsfw-m0"), (ns_lan, "tsfw-m1"), (ns_node, rail_iface), (ns_rail, "tsfw-r1")):
            sh("ip", "-n", ns, "link", "set", iface, "up")
        rules = tmp_path / "fw.nft"
        rules.write_text(rules_text)
        sh("ip", "netns", "exec", ns_node, "nft", "-f", rules)
        if after_load:
            sh("ip", "netns", "exec", ns_node, "sh", "-c", after_load)
        listener = ("import socket, sys, time\nsocks = []\nfor p in sys.argv[1:]:\n"
                    "    s = socket.socket(socket.AF_INET6); s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)\n"
                    "    s.bind(('::', int(p))); s.listen(); socks.append(s)\nprint('listening', flush=True)\n"
                    "time.sleep(60)\n")
        server = subprocess.Popen(["ip", "netns", "exec", ns_node, "python3", "-c", listener, *map(str, PROBED_PORTS)],
                                  stdout=subprocess.PIPE, text=True)
        # every (source, port) at once: a dropped port costs its timeout
        prober = ("import json, socket, sys\nfrom concurrent.futures import ThreadPoolExecutor\n"
                  "target, sources, ports = sys.argv[1], sys.argv[2].split(','), [int(p) for p in sys.argv[3:]]\n"
                  "def reach(job):\n    source, port = job\n"
                  "    family = socket.AF_INET6 if ':' in target else socket.AF_INET\n"
                  "    with socket.socket(family) as s:\n        s.settimeout(1.5)\n"
                  "        s.bind((source, 0))\n        return s.connect_ex((target, port)) == 0\n"
                  "jobs = [(s, p) for s in sources for p in ports]\n"
                  "with ThreadPoolExecutor(len(jobs)) as pool:\n    ok = list(pool.map(reach, jobs))\n"
                  "print(json.dumps({s: [p for (t, p), y in zip(jobs, ok) if t == s and y] for s in sources}))\n")
        try:
            # a fixed pause was a pace: on a busy box the first sources probed before the binds
            assert server.stdout.readline() == "listening\n", "the listener in the node's netns did not start"
            found = {}
            for ns, target, sources in ((ns_lan, node.host, lan_sources), (ns_rail, node.rails[0].ip, rail_sources),
                                        (ns_lan, "fd00:ab::1", ["fd00:ab::50"])):
                found.update(json.loads(sh("ip", "netns", "exec", ns, "python3", "-c", prober, target,
                                           ",".join(sources), *map(str, PROBED_PORTS)).stdout))
            return found
        finally:
            server.kill()
    finally:
        for ns in (ns_node, ns_lan, ns_rail):
            sh("ip", "netns", "del", ns, check=False)


def with_executor(executor):
    raw = config_blocks()
    raw["serving"] = {**raw.get("serving", {}), "executor": executor}
    cfg = parse_stack_config(raw)
    return Topology(cfg, resolve_node_addresses(cfg.nodes))


PUBLIC = [22, 8000, 3000]  # SSH, the API, Grafana: from anywhere, on the head


def test_the_head_admits_each_flow_from_its_peer_alone(tmp_path):
    """Issue 37: the rails and the other nodes got every port. Now a stranger on the LAN or on a
    rail switch reaches SSH and the head's public ports only; the peer's rail address Ray's GCS
    and workers, NcclCheck's rendezvous and the random range; its LAN address the bootstrap's
    random range alone. Nothing reaches the copy's port or an exporter on the head."""
    found = reachable_ports(tmp_path, HEAD, firewall_text())
    assert found == {
        STRANGER_LAN: PUBLIC, STRANGER_RAIL: PUBLIC, "fd00:ab::50": PUBLIC,
        WORKER.host: [*PUBLIC, 40000],
        WORKER.rails[0].ip: [*PUBLIC, contract.RAY_PORT, 10005, contract.NCCL_RENDEZVOUS_PORT, 40000],
    }, found


def test_mps_unauthenticated_master_port_admits_the_rail_peer_only(tmp_path):
    """serving.executor mp: torch's TCPStore (no authentication) on the master port, from the
    worker's rail address alone — not its LAN address, not a stranger on the rail; no Ray port."""
    found = reachable_ports(tmp_path, HEAD, firewall_text(HEAD, with_executor("mp")))
    assert found == {
        STRANGER_LAN: PUBLIC, STRANGER_RAIL: PUBLIC, "fd00:ab::50": PUBLIC,
        WORKER.host: [*PUBLIC, 40000],
        WORKER.rails[0].ip: [*PUBLIC, contract.MP_MASTER_PORT, contract.NCCL_RENDEZVOUS_PORT, 40000],
    }, found


def test_a_workers_copy_port_opens_for_its_copys_source_alone(tmp_path):
    """A worker: SSH from anywhere, the head's scrapes, Ray's workers and the random range from the
    head's rail address; the copy's port shut until sync-weights.sh puts the copy's (source,
    destination) pair in the set, then open to that source only."""
    shut = reachable_ports(tmp_path, WORKER, firewall_text(WORKER))
    from_head = [22, contract.NODE_EXPORTER_PORT, 10005, contract.NCCL_RENDEZVOUS_PORT, 40000]
    assert shut == {STRANGER_LAN: [22], STRANGER_RAIL: [22], "fd00:ab::50": [22], HEAD.host: [22, 40000],
                    HEAD.rails[0].ip: from_head}, shut
    pair = f"{HEAD.rails[0].ip} . {WORKER.rails[0].ip}"
    opened = reachable_ports(tmp_path, WORKER, firewall_text(WORKER), after_load=(
        f"nft add element inet {contract.FIREWALL_TABLE} {contract.WEIGHT_COPY_SET} '{{ {pair} }}'"))
    assert opened == {**shut, HEAD.rails[0].ip: sorted([*from_head, contract.WEIGHTS_SYNC_PORT])}, opened


def test_managed_firewall_applies_once_and_remove_deletes_the_table(tmp_path, private_node):  # noqa: F811
    run, calls = private_node
    rules = tmp_path / "etc" / "firewall.nft"
    install, remove, stdin = managed_file_lines(tmp_path, rules, action="nftables")
    install += " --undo 'inet twinspark'"
    remove += " --undo 'inet twinspark'"
    text = stdin(firewall_text())
    inner = tmp_path / "inner.sh"
    inner.write_text(f"{install} < {text}; {install} < {text}; nft list tables; "
                     f"{remove} < {stdin('')}; echo after:; nft list tables\n")
    proc = run(f"unshare --net bash {inner}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"installed: {rules}", f"unchanged: {rules}", "table inet twinspark",
                                        f"removed: {rules}", "after:"]


def test_managed_firewall_refuses_rules_nft_rejects_and_changes_nothing(tmp_path, private_node):  # noqa: F811
    run, _ = private_node
    rules = tmp_path / "etc" / "firewall.nft"
    install, _, stdin = managed_file_lines(tmp_path, rules, action="nftables")
    bad = stdin("table inet twinspark { chain input { type filter hook input priority filter; policy dropp; } }\n")
    inner = tmp_path / "inner.sh"
    inner.write_text(f"{install} --undo 'inet twinspark' < {bad}; echo rc=$?; nft list tables\n")
    proc = run(f"unshare --net bash {inner}")
    assert "nft refused" in proc.stderr and "rc=1" in proc.stdout
    assert "table inet twinspark" not in proc.stdout


def render_with_hosts_file(tmp_path, hosts, node_hosts):
    """The head's firewall as `pulumi up` renders it on an operator's machine whose resolver knows
    `hosts` ((name, address) pairs: its own /etc/hosts in a private mount namespace), for nodes whose
    `host` is `node_hosts`."""
    table = tmp_path / "operator-hosts"
    table.write_text("127.0.0.1 localhost\n" + "".join(f"{ip} {name}\n" for name, ip in hosts))
    raw = config_blocks()
    for node, host in zip(raw["nodes"], node_hosts):
        node["host"] = host
    (tmp_path / "config.json").write_text(json.dumps(raw))
    render = ("import json\n"
              "from components import firewall\n"
              "from components.config import Topology, parse_stack_config, resolve_node_addresses\n"
              f"cfg = parse_stack_config(json.load(open({str(tmp_path / 'config.json')!r})))\n"
              "topology = Topology(cfg, resolve_node_addresses(cfg.nodes))\n"
              "print(firewall.render_firewall(cfg.head, firewall.firewall_policy(cfg.head, topology)), end='')\n")
    proc = sh("unshare", "--mount", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$1" -c "$2"', table,
              sys.executable, render, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def load_at_boot(tmp_path, text):
    """`nft -f` as twinspark-firewall.service runs it at boot: before the network, so no resolver
    answers (no interface up, an empty resolv.conf) and /etc/hosts is the node's own."""
    rules, empty = tmp_path / "boot.nft", tmp_path / "resolv.conf"
    rules.write_text(text)
    empty.write_text("")
    return sh("unshare", "--net", "--mount", "sh", "-c",
              f'mount --bind "$0" /etc/resolv.conf && {firewall_exec_start(rules)} && nft list table inet twinspark',
              empty, check=False)


def firewall_exec_start(rules):
    """The unit's ExecStart line, on `rules`: what runs at boot, as the unit says it."""
    unit = host_prep.render_firewall_unit()
    (line,) = [ln.split("=", 1)[1] for ln in unit.splitlines() if ln.startswith("ExecStart=")]
    return line.replace(contract.FIREWALL_RULES_PATH, str(rules))


def test_firewall_with_host_names_loads_at_boot_without_dns(tmp_path):
    """`host` may be a DNS name (spark-2.local); at boot no name resolves, and a table that named
    one would not load at all (issue 19): the rendered table holds the address the name had when
    `pulumi up` ran."""
    text = render_with_hosts_file(tmp_path, [("spark1.test-lan", HEAD.host), ("spark2.test-lan", WORKER.host)],
                                  ["spark1.test-lan", "spark2.test-lan"])
    boot = load_at_boot(tmp_path, text)
    assert boot.returncode == 0, boot.stderr
    assert "test-lan" not in text, text
    assert f"ip saddr {WORKER.host} tcp dport 32768-60999 accept" in boot.stdout, boot.stdout


def test_firewall_admits_every_address_of_a_peer_name(tmp_path):
    text = render_with_hosts_file(tmp_path, [("spark2.test-lan", WORKER.host), ("spark2.test-lan", "192.168.1.77")],
                                  [HEAD.host, "spark2.test-lan"])
    boot = load_at_boot(tmp_path, text)
    assert boot.returncode == 0, boot.stderr
    assert f"ip saddr {{ {WORKER.host}, 192.168.1.77 }} tcp dport 32768-60999 accept" in boot.stdout, boot.stdout


def test_the_firewall_unit_fails_when_its_table_does_not_load(tmp_path):
    """A table that does not load at boot leaves the node without a firewall: the unit must end
    failed (`systemctl --failed`, `is-system-running` degraded), not pass quietly. Its ExecStart
    runs unprefixed (no '-', which would count a failure as success), as a oneshot with no other
    success status, so nft's exit status is the unit's."""
    unit = host_prep.render_firewall_unit()
    service = unit.split("[Service]", 1)[1].split("\n[", 1)[0]
    settings = dict(ln.split("=", 1) for ln in service.splitlines() if "=" in ln and not ln.startswith("#"))
    assert settings["Type"] == "oneshot" and "SuccessExitStatus" not in settings, settings
    assert settings["ExecStart"][0] not in "-@:+!", settings["ExecStart"]
    (tmp_path / contract.FIREWALL_UNIT).write_text(unit)
    verify = sh("systemd-analyze", "verify", tmp_path / contract.FIREWALL_UNIT, check=False)
    assert verify.returncode == 0 and verify.stderr == "", verify.stderr
    naming_a_peer = firewall_text().replace(f"saddr {WORKER.host} ", "saddr spark2.test-lan ")  # as it was
    assert naming_a_peer != firewall_text()
    failed = load_at_boot(tmp_path, naming_a_peer)
    assert failed.returncode != 0 and "Could not resolve" in failed.stderr, (failed.returncode, failed.stderr)
    assert load_at_boot(tmp_path, firewall_text()).returncode == 0


def test_firewall_renders_addresses_only():
    policy = firewall.FirewallPolicy((firewall.Admit("nccl-bootstrap", ((40000, 40000),), ("spark2.local",)),))
    with pytest.raises(ValueError, match="spark2.local"):
        firewall.render_firewall(HEAD, policy)


# ---- API gateway -----------------------------------------------------------------------------
# vLLM's stand-in here: answers 200 on every path over the real socket path, as the head's
# serving container would after boot-common.sh's prepare_vllm_socket, and records each raw
# request line's path (what vLLM's router would see) in a file.
RECORDING_UPSTREAM = r"""
import http.server, sys
from openai_standin import UnixServer
class Upstream(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass
    def answer(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with open(sys.argv[2], "a") as seen:
            seen.write(self.path + "\n")
        body = b'{"upstream": true}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = answer
UnixServer(sys.argv[1], Upstream).serve_forever()
"""


def gateway_bundle(tmp_path, api_key, port, drain_file=contract.DRAIN_FILE):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    for name in (contract.PRELUDE, contract.BOOT_COMMON, contract.API_GATEWAY_SCRIPT):
        shutil.copy(LAUNCH_DIR / name, bundle / name)
    vllm = launch_bundle.VllmServe(CFG.serving, CFG.model, len(CFG.nodes))
    fabric = Topology(CFG, resolve_node_addresses(CFG.nodes)).node_fabric(HEAD)
    args = launch_bundle.LaunchBundleArgs(HEAD, None, vllm, fabric, "token", "label-key", api_key)
    (bundle / contract.ENV_FILE).write_text(launch_bundle.render_env_file(args))
    (bundle / contract.SECRETS_FILE).write_text(launch_bundle.render_secrets_env(api_key))
    role = launch_bundle.GatewayRole(drain_file=str(drain_file))
    (bundle / contract.API_GATEWAY_CONF).write_text(launch_bundle.render_api_gateway_conf(port, role))
    (bundle / "upstream.py").write_text(RECORDING_UPSTREAM)
    return bundle


class Gateway:
    def __init__(self, proc, port, seen_file):
        self.proc, self.port, self.seen_file = proc, port, seen_file

    @property
    def seen(self) -> list[str]:
        return self.seen_file.read_text().splitlines() if self.seen_file.exists() else []


def port_open(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def running_gateway(tmp_path, api_key=API_KEY, drain_file=contract.DRAIN_FILE):
    """The real api-gateway.sh under nginx in front of a recording upstream on vLLM's socket,
    which boot-common.sh's prepare_vllm_socket made (directory, group, umask) as on the head."""
    if shutil.which("nginx") is None:
        pytest.fail("needs nginx (scripts/test.sh installs it)")
    if subprocess.run(["getent", "group", contract.API_SOCKET_GROUP], capture_output=True).returncode:
        pytest.fail(f"needs the serving image's group {contract.API_SOCKET_GROUP} (scripts/test.sh adds it)")
    port = free_port()
    bundle = gateway_bundle(tmp_path, api_key, port, drain_file)
    seen = tmp_path / "seen"
    upstream = subprocess.Popen(["bash", "-c", f". {bundle}/{contract.BOOT_COMMON} && prepare_vllm_socket && "
                                 f"PYTHONPATH={TESTS_DIR} exec python3 {bundle}/upstream.py {contract.VLLM_SOCKET} {seen}"])
    proc = subprocess.Popen(["bash", str(bundle / contract.API_GATEWAY_SCRIPT)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        yield Gateway(proc, port, seen)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        upstream.kill()
        upstream.wait(timeout=10)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(contract.VLLM_SOCKET)


@contextlib.contextmanager
def serving_gateway(tmp_path, api_key=API_KEY, drain_file=contract.DRAIN_FILE):
    with running_gateway(tmp_path, api_key, drain_file) as gw:
        wait_for(lambda: port_open(gw.port) and os.path.exists(contract.VLLM_SOCKET), "the gateway listening",
                 process=gw.proc)
        yield gw


def call(port, path, key=None, body=None, scheme="Bearer"):
    headers = {"Authorization": f"{scheme} {key}"} if key else {}
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def raw_status(port, request_target, key=None, host="127.0.0.1"):
    """A request line sent as written (curl --path-as-is): no client normalises it first."""
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"GET {request_target} HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n".encode())
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    return int(reply.split(b" ", 2)[1])


# every path vLLM 0.25 serves that runs the model or says something about it
MODEL_PATHS = ["/v1/completions", "/v1/chat/completions", "/v1/models", "/invocations", "/generative_scoring",
               "/tokenize", "/detokenize", "/metrics", "/version", "/ping", "/load", "/docs", "/openapi.json",
               "/v2/models", "/inference/v1/generate", "/pooling", "/score", "/rerank", "/unknown/path"]


def generated_key(length):
    """What the program generates (RandomPassword, special=False): letters and digits."""
    return "".join(random.SystemRandom().choice(string.ascii_letters + string.digits) for _ in range(length))


def near_misses(key):
    flipped = next(i for i, c in enumerate(key) if c.isalpha())
    return [None, "wrong-key-0123456789", key + "x", key[:-1], "x" + key, key.lower(), key.upper(),
            key[:flipped] + key[flipped].swapcase() + key[flipped + 1:], f"{key} {key}", f"{key}\t"]


def test_a_drain_answers_503_with_retry_after_to_the_keyed_and_health_and_ends_with_its_file(tmp_path):
    """The serving guard's drain (contract.DRAIN_FILE, here in tmp_path): while the file exists a
    request with the key and /health get nginx's 503 with Retry-After and nothing reaches vLLM; a
    request without the key is still refused as before; the file gone, requests pass again."""
    # where nginx's workers (nobody) can look, as in /run/twinspark-drain (root's, 0755)
    drain = Path(tempfile.mkdtemp(prefix="twinspark-drain-")) / "draining"
    drain.parent.chmod(0o755)
    with serving_gateway(tmp_path, drain_file=drain) as gw:
        assert call(gw.port, "/v1/models", API_KEY) == 200
        drain.write_text("fabric: rail enp1s0f0np0: link down\n")
        req = urllib.request.Request(f"http://127.0.0.1:{gw.port}/v1/chat/completions", data=b"{}",
                                     headers={"Authorization": f"Bearer {API_KEY}"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=5)
        assert refused.value.code == 503
        assert refused.value.headers["Retry-After"] == str(launch_bundle.DRAIN_RETRY_AFTER_S)
        assert "draining" in json.loads(refused.value.read())["error"]
        assert call(gw.port, "/health") == 503
        assert call(gw.port, "/v1/models", "wrong-key-0123456789") == 401
        seen_while_draining = list(gw.seen)
        drain.unlink()
        assert call(gw.port, "/v1/models", API_KEY) == 200
        assert gw.seen == seen_while_draining + ["/v1/models"], "nothing reached vLLM while draining"
    shutil.rmtree(drain.parent)


@pytest.mark.parametrize("length", [48, 128, 256])
def test_gateway_starts_with_a_generated_key_and_admits_it_exactly(tmp_path, length):
    """The program's default (48 characters, RandomPassword) and the longest keys the config
    accepts: nginx starts, and only the key itself, case and all, gets through."""
    key = generated_key(length)
    with serving_gateway(tmp_path, key) as gw:
        assert call(gw.port, "/health") == 200
        for path in MODEL_PATHS:
            for wrong in near_misses(key):  # 401, or 429 once the wrong keys' rate limit holds
                assert call(gw.port, path, wrong, body={}) in (401, 429), (path, wrong)
        assert gw.seen == ["/health"], "nothing without the key may reach vLLM"
        for path in MODEL_PATHS:
            assert call(gw.port, path, key, body={}) == 200, path
        assert call(gw.port, "/v1/models", key, scheme="bearer") == 200, "the scheme in any case (RFC 7235)"
        assert gw.seen[1:] == MODEL_PATHS + ["/v1/models"]


def test_a_key_with_every_allowed_character_is_matched_literally(tmp_path):
    """. and + in a key are literal: a key that a regex would take for a pattern admits only itself."""
    key = "sk.a+b~c/d=e-f_0123456789"
    with serving_gateway(tmp_path, key) as gw:
        assert call(gw.port, "/v1/models", key) == 200
        for wrong in ("skXa+b~c/d=e-f_0123456789", "sk.aab~c/d=e-f_0123456789", "sk.aaab~c/d=e-f_0123456789"):
            assert call(gw.port, "/v1/models", wrong) == 401, wrong


# Requests that nginx would check on one path while vLLM routes another (its /metrics mount
# catches /metrics/...): each must be refused before anything reaches vLLM.
BYPASS_REQUESTS = ["/metrics/../health", "/metrics/%2e%2e/health", "/metrics%2F..%2Fhealth", "/metricsX/../health",
                   "/metrics/..%2fhealth", "/v1/../health", "/./health", "//health", "/health/", "/health/.",
                   "/%68ealth", "/metrics/./../health", "/metrics;/../health"]


def test_no_request_reaches_vllm_on_a_path_other_than_the_one_checked(tmp_path):
    with serving_gateway(tmp_path) as gw:
        refused = {target: raw_status(gw.port, target) for target in BYPASS_REQUESTS}
        absolute = f"http://127.0.0.1:{gw.port}/metrics/../health"
        refused[absolute] = raw_status(gw.port, absolute)
        assert all(status in (401, 404) for status in refused.values()), refused
        assert gw.seen == [], "none of them may reach vLLM"
        assert raw_status(gw.port, "/health?probe=1") == 200
        assert raw_status(gw.port, f"http://127.0.0.1:{gw.port}/health") == 200
        assert gw.seen == ["/health?probe=1", "/health"]
        # with the key too, vLLM gets the path that was checked, or nothing
        assert raw_status(gw.port, "/metrics/../v1/models", API_KEY) == 404
        assert raw_status(gw.port, "/v1/models?x=1", API_KEY) == 200
        assert gw.seen[2:] == ["/v1/models?x=1"]


def test_only_the_gateway_reaches_vllm_on_the_head(tmp_path):
    """A co-tenant session (any local user) and every host-network container but the gateway:
    vLLM's socket is closed to them, and on loopback there is vLLM's /metrics alone."""
    with serving_gateway(tmp_path) as gw:
        socket_mode = os.stat(contract.VLLM_SOCKET).st_mode & 0o777
        assert socket_mode == 0o770, oct(socket_mode)
        metrics = contract.METRICS_LOOPBACK_PORT
        probe = ("import socket, sys, urllib.request, urllib.error\n"
                 "s = socket.socket(socket.AF_UNIX)\n"
                 "try:\n    s.connect(sys.argv[1]); print('socket: open')\n"
                 "except OSError as err:\n    print('socket:', type(err).__name__)\n"
                 "for path in sys.argv[2:]:\n"
                 "    try:\n        code = urllib.request.urlopen('http://127.0.0.1:%d' % int(sys.argv[2]) + path).status\n"
                 "    except urllib.error.HTTPError as err:\n        code = err.code\n"
                 "    print(path, code)\n")
        paths = ["/v1/models", "/v1/completions", "/invocations", "/health", "/metrics/../v1/models"]
        cotenant = sh("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c",
                      probe.replace("sys.argv[2:]", "sys.argv[3:]"), contract.VLLM_SOCKET, metrics, *paths, "/metrics")
        lines = cotenant.stdout.splitlines()
        assert lines[0] in ("socket: PermissionError",), lines[0]
        assert lines[1:] == [f"{p} 404" for p in paths] + ["/metrics 200"]
        assert gw.seen == ["/metrics"], "loopback reaches vLLM's /metrics, nothing else"


@pytest.mark.parametrize("key", ['sk-has-"quote"-0123456789', "sk-short", "", "sk-new\nline-0123456789",
                                 "sk-has-$dollar-0123456789", "sk-(group)-0123456789"])
def test_gateway_refuses_a_key_that_could_break_its_config(tmp_path, key):
    with running_gateway(tmp_path, api_key=key) as gw:
        out, _ = gw.proc.communicate(timeout=10)
    assert gw.proc.returncode == 1
    assert "the API key in secrets.env is empty, shorter than 16 or has characters other than" in out


def test_a_body_larger_than_the_workers_buffer_reaches_vllm(tmp_path):
    """nginx spills a body over its 16 KB buffer to a temp file its workers (nobody) must write
    where it buffers the request (/health) or the upstream is slower than the client: in the
    root-only run dir a 20 KB POST got a 500 (issue 37)."""
    with serving_gateway(tmp_path) as gw:
        for path in ("/health", "/v1/completions"):
            for size in (20_000, 2_000_000):
                assert call(gw.port, path, API_KEY, body={"prompt": "x" * size}) == 200, (path, size)
        assert gw.seen == ["/health"] * 2 + ["/v1/completions"] * 2
        run_dir = os.stat(contract.API_GATEWAY_RUN_DIR)
        key_map = os.stat(f"{contract.API_GATEWAY_RUN_DIR}/{contract.API_GATEWAY_KEY_MAP}")
        assert (run_dir.st_mode & 0o777, key_map.st_mode & 0o777, key_map.st_uid) == (0o700, 0o600, 0)


def test_wrong_keys_are_answered_at_a_limited_rate_per_address_and_the_key_still_passes(tmp_path):
    """A burst of wrong keys gets 401s, then 429s (Retry-After) instead of an answer per guess;
    the right key from the same address is never held back, and the limit refills."""
    with serving_gateway(tmp_path) as gw:
        statuses = [call(gw.port, "/v1/models", f"wrong-key-{i:010d}") for i in range(60)]
        assert statuses[:launch_bundle.WRONG_KEY_BURST] == [401] * launch_bundle.WRONG_KEY_BURST, statuses
        assert statuses.count(429) >= 60 - launch_bundle.WRONG_KEY_BURST - 5, statuses
        assert call(gw.port, "/v1/models", API_KEY) == 200
        # no key at all counts as a wrong one: a burst of them meets the limit too (a burst, as one
        # request alone may come after the 200 ms that refill a guess on a loaded machine)
        keyless = []
        for _ in range(30):
            with pytest.raises(urllib.error.HTTPError) as answer:
                urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{gw.port}/v1/models"), timeout=5)
            keyless.append((answer.value.code, answer.value.headers["Retry-After"]))
        assert (429, "1") in keyless and {code for code, _ in keyless} <= {401, 429}, keyless
        time.sleep(1.5)
        assert call(gw.port, "/v1/models", "wrong-key-again") == 401
        assert gw.seen == ["/v1/models"]


def half_sent_request(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: spark\r\n")  # never the blank line
    return s


def test_half_sent_requests_from_one_address_leave_the_gateway_answering(tmp_path):
    """2,100 requests whose header never ends, from one address (issue 37: with 1,024 connections
    per worker they held the gateway for nginx's 60 s header timeout): /health and the API still
    answer, and each is dropped at the header timeout."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    with serving_gateway(tmp_path) as gw:
        held = [half_sent_request(gw.port) for _ in range(2100)]
        try:
            assert call(gw.port, "/health") == 200
            assert call(gw.port, "/v1/models", API_KEY) == 200
            # closed by the gateway at its header timeout (nginx's default would hold it 60 s;
            # a socket.timeout here fails the test)
            held[0].settimeout(launch_bundle.CLIENT_HEADER_TIMEOUT_S + 20)
            while held[0].recv(1024):
                pass
        finally:
            for s in held:
                s.close()
