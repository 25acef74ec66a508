"""PID 1 of a simulated node: make it a login-able Spark stand-in, run sshd (and dockerd), reap orphans.

Inside the node's overlay root (its disk, node-root.sh): the login user with passwordless
sudo and the harness's public key, sshd host keys, the recording shims for calls that would
reconfigure the real machine (tests/sim/shims), and `vllm` (the stand-in) on PATH.

The node runs Debian's dockerd as a Spark runs its docker.service: the login user is in the
`docker` group (DGX OS's default), the daemon's default runtime is runc behind
tests/sim/standins/twinspark-sim-runc (the one thing the sandbox cannot grant, memlock, clamped
and recorded), `nvidia-container-runtime-hook` is the recording stand-in for `--gpus`, and the
sim's registry is the one it pulls from. Its processes see the memlock pam_limits would give a
login (tests/sim/standins/memlock-granted.c).
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path


STANDINS = Path("/usr/local/lib/twinspark-sim")
DOCKERD_LOG = Path("/var/log/twinspark-sim/dockerd.log")
SIM_KEX = "curve25519-sha256,curve25519-sha256@libssh.org"  # the sim nodes' sshd (main)


def dockerd_config() -> dict:
    """What a Spark's daemon has that matters here, and what this sandbox forces."""
    return {
        "default-runtime": "twinspark-sim", "runtimes": {"twinspark-sim": {"path": str(STANDINS / "twinspark-sim-runc")}},
        "iptables": False, "ip6tables": False,  # no NAT: the node's containers reach nothing outside it
        "storage-driver": "overlay2",
    }


def add_host(address: str, name: str) -> None:
    """One /etc/hosts line, once: the node's disk keeps it across reboots."""
    hosts = Path("/etc/hosts")
    line = f"{address} {name}"
    if line not in hosts.read_text().splitlines():
        with hosts.open("a") as f:
            f.write(line + "\n")


def prepare_docker(user: str, sim_dir: Path, registry: str, registry_address: str, registry_ca: str) -> None:
    if registry and registry_address:  # the sim's registry, on this machine, at the node's gateway
        add_host(registry_address, registry.rsplit(":", 1)[0])
    if registry and registry_ca:  # its certificate's CA, as docker trusts a private registry's
        certs = Path("/etc/docker/certs.d") / registry
        certs.mkdir(parents=True, exist_ok=True)
        shutil.copy(registry_ca, certs / "ca.crt")
    if subprocess.run(["getent", "group", "docker"], capture_output=True).returncode != 0:
        subprocess.run(["groupadd", "--system", "docker"], check=True)
    subprocess.run(["usermod", "-aG", "docker", user], check=True)
    STANDINS.mkdir(parents=True, exist_ok=True)
    for standin in (sim_dir / "standins").iterdir():
        shutil.copy(standin, STANDINS / standin.name)
        (STANDINS / standin.name).chmod(0o755)
    # every process of the node sees the memlock a login would get on a Spark (memlock-granted.c)
    preload = STANDINS / "memlock-granted.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(preload), str(STANDINS / "memlock-granted.c")],
                   check=True, capture_output=True)
    Path("/etc/ld.so.preload").write_text(f"{preload}\n")
    hook = Path("/usr/local/bin/nvidia-container-runtime-hook")  # dockerd looks it up on its PATH
    hook.unlink(missing_ok=True)
    hook.symlink_to(STANDINS / hook.name)
    Path("/etc/docker").mkdir(exist_ok=True)
    Path("/etc/docker/daemon.json").write_text(json.dumps(dockerd_config(), indent=2) + "\n")


def start_dockerd() -> subprocess.Popen:
    return subprocess.Popen(["/usr/sbin/dockerd"], stdout=open(DOCKERD_LOG, "a"), stderr=subprocess.STDOUT)


def prepare(name: str, user: str, sim_dir: Path) -> None:
    if subprocess.run(["id", user], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", user], check=True)
    Path("/etc/sudoers.d/twinspark-sim").write_text(f"{user} ALL=(ALL) NOPASSWD:ALL\n")
    os.chmod("/etc/sudoers.d/twinspark-sim", 0o440)
    ssh_dir = Path(f"/home/{user}/.ssh")
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    # the operator's key, added once: what else the program authorized (the head's sync key)
    # outlives a reboot, as on a Spark's disk
    operator_key, authorized = Path("/tmp/authorized_key.pub").read_text(), ssh_dir / "authorized_keys"
    held = authorized.read_text() if authorized.exists() else ""
    if operator_key.strip() not in held.splitlines():
        authorized.write_text(held + ("" if not held or held.endswith("\n") else "\n") + operator_key)
    (ssh_dir / "authorized_keys").chmod(0o600)
    shutil.chown(ssh_dir, user, user)
    shutil.chown(ssh_dir / "authorized_keys", user, user)
    for shim in (sim_dir / "shims").iterdir():
        target = Path("/usr/local/bin") / shim.name  # on the login PATH and first in sudo's secure_path
        shutil.copy(shim, target)
        target.chmod(0o755)
    # a link, not a copy: the stand-in imports tests/openai_standin.py relative to its real path
    vllm = Path("/usr/local/bin/vllm")
    vllm.unlink(missing_ok=True)
    vllm.symlink_to(sim_dir.resolve() / "bin" / "vllm")
    # sudo would otherwise log "unable to resolve host"
    add_host("127.0.1.1", name)
    own_host_keys(Path("/etc/ssh"))
    Path("/run/sshd").mkdir(exist_ok=True)
    sim_log = Path("/var/log/twinspark-sim")
    sim_log.mkdir(parents=True, exist_ok=True)
    sim_log.chmod(0o1777)
    shims_log = sim_log / "shims.log"
    shims_log.touch()
    shims_log.chmod(0o666)  # shims run as root (through sudo) and as the login user


def own_host_keys(etc_ssh: Path) -> None:
    """Host keys of this node's own, made on its disk's first boot and kept across reboots: the
    overlay's lower layer is this machine's root, whose keys every node would otherwise show.
    A reinstalled node (its disk wiped) gets new ones, as a reinstalled Spark does."""
    made = etc_ssh / ".twinspark-sim-host-keys"
    if not made.exists():
        for key in etc_ssh.glob("ssh_host_*"):
            key.unlink()
        made.touch()
    subprocess.run(["ssh-keygen", "-A"], check=True, capture_output=True)


ENABLED_UNITS = Path("/var/lib/twinspark-sim/enabled")  # tests/sim/shims/systemctl's record of `enable`


def start_enabled_units(before_docker: bool) -> None:
    """The enabled units ordered Before=docker.service (the node recorder), or the rest."""
    for unit in sorted(ENABLED_UNITS.glob("*")) if ENABLED_UNITS.is_dir() else []:
        unit_file = Path("/etc/systemd/system") / unit.name
        ordered_before = unit_file.exists() and "Before=docker.service" in unit_file.read_text()
        if ordered_before == before_docker:
            subprocess.run(["systemctl", "start", unit.name], check=False, capture_output=True)


def new_kernel_log() -> None:
    """The previous boot's kernel lines become journald's `-b -1` (tests/sim/shims/journalctl)."""
    log = Path("/var/log/twinspark-sim/kernel.log")
    if log.exists():
        log.replace(log.with_name("kernel.prev"))


PLUG_NAME = "plug.twinspark-sim"  # the host of sim2's power.url in Pulumi.sim.yaml (tests/sim/plug_standin.py)


def name_hub(hub: str, gateway: str) -> None:
    """The stack's hub name (model.hubEndpoint's host) is the stand-in on this machine, at the
    node's gateway (scripts/sim.sh and the engine sim's `hub` fixture serve it there); so is the plug's."""
    if hub:
        add_host(gateway, hub.rsplit(":", 1)[0])
    if gateway:
        add_host(gateway, PLUG_NAME)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--sim-dir", required=True, type=Path)
    parser.add_argument("--registry", default="", help="host:port the node's dockerd may pull from over HTTP")
    parser.add_argument("--registry-address", default="",
                        help="this machine on the node's link: the registry's and the hub's address")
    parser.add_argument("--registry-ca", default="", help="the CA of the registry's TLS certificate")
    parser.add_argument("--hub", default="", help="host:port of the stack's model.hubEndpoint")
    # read by nothing here: it tells this node's PID 1 from another site's node of the same name (cluster.py)
    parser.add_argument("--cluster", required=True, help="the prefix of the cluster's names (cluster.site_prefix)")
    args = parser.parse_args()
    prepare(args.name, args.user, args.sim_dir)
    name_hub(args.hub, args.registry_address)
    prepare_docker(args.user, args.sim_dir, args.registry, args.registry_address, args.registry_ca)
    sshd_log = open("/var/log/twinspark-sim/sshd.log", "a")
    # curve25519 alone: OpenSSH 9.2's default sntrup761x25519 cost each client ~120 ms of CPU to
    # connect (17 with curve25519), and a CI run's clients (the tests' polls, the docker provider's
    # ssh://, the nodes' image ships and weight copies) connect hundreds of times on 2 cores.
    # Nothing of twinspark chooses or sees the key exchange (docs/testing.md, "Session of 2026-12-04, late").
    # Otherwise OpenSSH's defaults, as a DGX OS node's sshd has them (MaxStartups 10:30:100,
    # MaxSessions 10, LoginGraceTime 120): every `up` meets the throttle a Spark would.
    sshd = subprocess.Popen(
        ["/usr/sbin/sshd", "-D", "-e", "-o", "PasswordAuthentication=no", "-o", "UsePAM=yes",
         "-o", f"KexAlgorithms={SIM_KEX}"],
        stdout=sshd_log, stderr=subprocess.STDOUT,
    )
    new_kernel_log()
    start_enabled_units(before_docker=True)  # as systemd orders them: the node recorder's boot step first
    dockerd = start_dockerd()
    start_enabled_units(before_docker=False)  # then the rest the program enabled (the serving guard)
    Path("/run/node-ready").write_text(str(os.getpid()))

    def stop(*_):
        sshd.terminate()
        dockerd.terminate()  # as systemd stops docker.service: dockerd stops its containers
        dockerd.wait(timeout=60)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    while True:  # PID 1 reaps every orphan of the node
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
