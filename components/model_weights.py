"""ModelWeights: the model on every node, downloaded once and copied over the cable.

Creates:
- on the head: `fetch` (launch/fetch-weights.sh: resumable download inside the serving base
  image, HF token on stdin) and `sync-key` (a dedicated ed25519 key for the copy);
- per worker: `authorize` (that key, restricted to the head's rail address, in the
  worker's authorized_keys) and `sync` (launch/sync-weights.sh on the head: rsync to the
  worker's first-rail address, then verify file list and sizes).
No step does anything when its part is already complete.
"""

from __future__ import annotations

from typing import Optional

import pulumi
from pulumi_command import remote

from .config import Node, StackConfig
from .remote import bash, connection, script_command, script_stdin

SYNC_KEY = "~/.ssh/twinspark_weights"
SYNC_KEY_COMMENT = "twinspark-weights"
FETCH_SCRIPT = "fetch-weights.sh"
SYNC_SCRIPT = "sync-weights.sh"


def fetch_args(cfg: StackConfig) -> list[str]:
    return ["--repo", cfg.model.repo, "--dir", cfg.model.dir, "--image", cfg.serving.image]


def sync_args(cfg: StackConfig, worker: Node) -> list[str]:
    return ["--dir", cfg.model.dir, "--to", f"{cfg.ssh.user}@{worker.rails[0].ip}", "--key", SYNC_KEY]


def render_sync_key_command() -> str:
    return bash(
        f"""set -euo pipefail
key={SYNC_KEY}
install -d -m 700 ~/.ssh
[ -f "$key" ] || ssh-keygen -q -t ed25519 -N '' -C "{SYNC_KEY_COMMENT}@$(hostname)" -f "$key"
cat "$key.pub"
"""
    )


def render_authorized_key_line(head: Node, public_key: str) -> str:
    """Only from the head's rail address, and nothing but commands (no pty, no forwarding)."""
    return f'from="{head.ray_ip}",restrict {public_key.strip()}\n'


def render_authorize_command() -> str:
    return bash(
        """set -euo pipefail
IFS= read -r line
install -d -m 700 ~/.ssh
touch ~/.ssh/authorized_keys && chmod 600 ~/.ssh/authorized_keys
if grep -qxF "$line" ~/.ssh/authorized_keys; then echo "unchanged: sync key authorized"; exit 0; fi
echo "$line" >> ~/.ssh/authorized_keys
echo "authorized: sync key"
"""
    )


def render_unauthorize_command() -> str:
    return bash(
        f"""set -euo pipefail
[ -f ~/.ssh/authorized_keys ] || exit 0
grep -v ' {SYNC_KEY_COMMENT}@' ~/.ssh/authorized_keys > ~/.ssh/authorized_keys.twinspark || true
cat ~/.ssh/authorized_keys.twinspark > ~/.ssh/authorized_keys && rm -f ~/.ssh/authorized_keys.twinspark
"""
    )


class ModelWeights(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        cfg: StackConfig,
        hf_token: Optional[pulumi.Input[str]],
        opts: Optional[pulumi.ResourceOptions] = None,
    ):
        super().__init__("twinspark:model_weights:ModelWeights", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        head = cfg.head
        head_conn = connection(cfg.ssh, head)
        self.fetch = remote.Command(
            f"{name}-fetch-{head.name}",
            connection=head_conn,
            create=script_command(FETCH_SCRIPT, fetch_args(cfg), secret_env=["HF_TOKEN"]),
            stdin=script_stdin(FETCH_SCRIPT, [pulumi.Output.secret(hf_token or "")]),
            add_previous_output_in_env=False,
            opts=child,
        )
        self.syncs: list[remote.Command] = []
        if not cfg.workers:
            self.register_outputs({})
            return
        sync_key = remote.Command(
            f"{name}-sync-key-{head.name}",
            connection=head_conn,
            create=render_sync_key_command(),
            delete=bash(f"rm -f {SYNC_KEY} {SYNC_KEY}.pub"),
            add_previous_output_in_env=False,
            opts=child,
        )
        for worker in cfg.workers:
            authorize = remote.Command(
                f"{name}-authorize-{worker.name}",
                connection=connection(cfg.ssh, worker),
                create=render_authorize_command(),
                delete=render_unauthorize_command(),
                stdin=sync_key.stdout.apply(lambda key: render_authorized_key_line(head, key)),
                add_previous_output_in_env=False,
                opts=child,
            )
            self.syncs.append(
                remote.Command(
                    f"{name}-sync-{worker.name}",
                    connection=head_conn,
                    create=script_command(SYNC_SCRIPT, sync_args(cfg, worker)),
                    stdin=script_stdin(SYNC_SCRIPT),
                    triggers=[cfg.model.repo],
                    add_previous_output_in_env=False,
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[self.fetch, authorize]),
                )
            )
        self.register_outputs({})
