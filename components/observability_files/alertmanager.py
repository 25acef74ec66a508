"""Alertmanager's route: every alert to the webhook, the heartbeat re-sent often (only with alertWebhookUrl)."""

from __future__ import annotations

from core import contract

from .alerts import WATCHDOG
from .plan import yaml_text

ALERTMANAGER_GROUP_WAIT = "30s"
HEARTBEAT_INTERVAL_AND_REPEAT = ("1m", "5m")  # docs/observability.md's dead man's switch counts on the 5 min
ALERTMANAGER_HOST_DIR = f"{contract.OBSERVABILITY_CONFIG_DIR}/alertmanager"
ALERTMANAGER_CONFIG = "alertmanager.yml"


def render_alertmanager_config(webhook_url: str, group_wait: str = ALERTMANAGER_GROUP_WAIT,
                               heartbeat: tuple[str, str] = HEARTBEAT_INTERVAL_AND_REPEAT) -> str:
    """Every alert to one webhook (Alertmanager's JSON POST), resolved ones too. Holds a secret.
    `heartbeat`: how often the watchdog's group is looked at and re-sent (shorter in tests)."""
    interval, repeat = heartbeat
    return "# alertmanager.yml — rendered by twinspark: alerts go to twinspark:alertWebhookUrl\n" + yaml_text({
        "route": {"receiver": "webhook", "group_by": ["alertname", "node"], "group_wait": group_wait,
                  "group_interval": "5m", "repeat_interval": "4h",
                  # the heartbeat, re-sent often enough that its absence is news within minutes
                  "routes": [{"receiver": "webhook", "matchers": [f'alertname="{WATCHDOG}"'], "group_wait": "0s",
                              "group_interval": interval, "repeat_interval": repeat}]},
        "receivers": [{"name": "webhook", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}],
    })
