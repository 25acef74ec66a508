"""PID 1 of a simulated node: make it a login-able Spark stand-in, run sshd, reap orphans.

Inside the node's overlay root (changes vanish with the node): the login user with
passwordless sudo and the harness's public key, sshd host keys, the recording shims for
calls that would reconfigure the real machine, and `vllm` (the stand-in) on PATH.
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path


def prepare(name: str, user: str, sim_dir: Path) -> None:
    if subprocess.run(["id", user], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", user], check=True)
    Path("/etc/sudoers.d/twinspark-sim").write_text(f"{user} ALL=(ALL) NOPASSWD:ALL\n")
    os.chmod("/etc/sudoers.d/twinspark-sim", 0o440)
    ssh_dir = Path(f"/home/{user}/.ssh")
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(Path("/tmp/authorized_key.pub").read_text())
    (ssh_dir / "authorized_keys").chmod(0o600)
    shutil.chown(ssh_dir, user, user)
    shutil.chown(ssh_dir / "authorized_keys", user, user)
    for shim in (sim_dir / "shims").iterdir():
        target = Path("/usr/local/bin") / shim.name  # on the login PATH and first in sudo's secure_path
        shutil.copy(shim, target)
        target.chmod(0o755)
    # the docker shim's stand-in huggingface_hub (its default path)
    shutil.copytree(sim_dir / "fake_hub", "/usr/local/lib/twinspark-sim/fake_hub", dirs_exist_ok=True)
    # a link, not a copy: the stand-in imports tests/openai_standin.py relative to its real path
    vllm = Path("/usr/local/bin/vllm")
    vllm.unlink(missing_ok=True)
    vllm.symlink_to(sim_dir.resolve() / "bin" / "vllm")
    # sudo would otherwise log "unable to resolve host"
    with open("/etc/hosts", "a") as hosts:
        hosts.write(f"127.0.1.1 {name}\n")
    subprocess.run(["ssh-keygen", "-A"], check=True, capture_output=True)
    Path("/run/sshd").mkdir(exist_ok=True)
    sim_log = Path("/var/log/twinspark-sim")
    sim_log.mkdir(parents=True, exist_ok=True)
    sim_log.chmod(0o1777)
    shims_log = sim_log / "shims.log"
    shims_log.touch()
    shims_log.chmod(0o666)  # shims run as root (through sudo) and as the login user


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--sim-dir", required=True, type=Path)
    args = parser.parse_args()
    prepare(args.name, args.user, args.sim_dir)
    sshd_log = open("/var/log/twinspark-sim/sshd.log", "a")
    sshd = subprocess.Popen(
        ["/usr/sbin/sshd", "-D", "-e", "-o", "PasswordAuthentication=no", "-o", "UsePAM=yes",
         "-o", "MaxStartups=100", "-o", "MaxSessions=100"],
        stdout=sshd_log, stderr=subprocess.STDOUT,
    )
    Path("/run/node-ready").write_text(str(os.getpid()))

    def stop(*_):
        sshd.terminate()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    while True:  # PID 1 reaps every orphan of the node
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
