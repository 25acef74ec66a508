"""Alertmanager's routes and receivers: every alert to the receivers the stack names (a webhook, Slack,
ntfy, email), the heartbeat re-sent often to the webhook alone (only with at least one receiver)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from core import contract

from ..config import AlertEmail
from .alerts import WATCHDOG
from .plan import yaml_text

ALERTMANAGER_GROUP_WAIT = "30s"
HEARTBEAT_INTERVAL_AND_REPEAT = ("1m", "5m")  # docs/observability.md's dead man's switch counts on the 5 min
ALERTMANAGER_HOST_DIR = f"{contract.OBSERVABILITY_CONFIG_DIR}/alertmanager"
ALERTMANAGER_CONFIG = "alertmanager.yml"
ALERTS_RECEIVER, HEARTBEAT_RECEIVER = "alerts", "heartbeat"
# ntfy renders Alertmanager's webhook JSON into a notification with its own predefined template
NTFY_ALERTMANAGER_TEMPLATE = "template=alertmanager"
SLACK_TITLE = ("[{{ .Status | toUpper }}] {{ .CommonLabels.alertname }}"
               "{{ if .CommonLabels.node }} on {{ .CommonLabels.node }}{{ end }}")
SLACK_TEXT = "{{ range .Alerts }}{{ .Annotations.summary }}\n{{ .Annotations.description }}\n{{ end }}"


@dataclass(frozen=True)
class AlertReceivers:
    """Where alerts go; every URL and the password are secrets (the rendered file holds them)."""

    webhook_url: Optional[str] = None  # alertWebhookUrl: Alertmanager's JSON POST; it alone gets the heartbeat
    slack_url: Optional[str] = None  # alertSlackWebhookUrl
    ntfy_url: Optional[str] = None  # alertNtfyUrl: a topic's URL
    email: Optional[AlertEmail] = None  # observability.alertEmail
    email_password: Optional[str] = None  # alertEmailPassword


def receiver_configs(receivers: AlertReceivers) -> dict:
    """The alerts receiver's configs, resolved alerts sent too."""
    configs: dict = {}
    webhooks = [receivers.webhook_url] if receivers.webhook_url else []
    if receivers.ntfy_url:
        webhooks.append(f"{receivers.ntfy_url}?{NTFY_ALERTMANAGER_TEMPLATE}")
    if webhooks:
        configs["webhook_configs"] = [{"url": url, "send_resolved": True} for url in webhooks]
    if receivers.slack_url:
        configs["slack_configs"] = [{"api_url": receivers.slack_url, "send_resolved": True, "title": SLACK_TITLE,
                                     "text": SLACK_TEXT}]
    if receivers.email:
        email = receivers.email
        config = {"to": email.to, "from": email.from_, "smarthost": email.smarthost, "require_tls": email.require_tls,
                  "send_resolved": True}
        if email.username:
            config.update(auth_username=email.username, auth_password=receivers.email_password or "")
        configs["email_configs"] = [config]
    return configs


def render_alertmanager_config(receivers: AlertReceivers, group_wait: str = ALERTMANAGER_GROUP_WAIT,
                               heartbeat: tuple[str, str] = HEARTBEAT_INTERVAL_AND_REPEAT) -> str:
    """Every alert to every receiver named; the heartbeat (the watchdog) only to the webhook, the
    dead man's switch's relay, never to a person's Slack, phone or inbox. Holds secrets.
    `heartbeat`: how often the watchdog's group is looked at and re-sent (shorter in tests)."""
    interval, repeat = heartbeat
    heartbeat_configs = ({"webhook_configs": [{"url": receivers.webhook_url, "send_resolved": True}]}
                         if receivers.webhook_url else {})  # none: the heartbeat goes nowhere
    return "# alertmanager.yml — rendered by twinspark: the stack's alert receivers (twinspark:alert*)\n" + yaml_text({
        "route": {"receiver": ALERTS_RECEIVER, "group_by": ["alertname", "node"], "group_wait": group_wait,
                  "group_interval": "5m", "repeat_interval": "4h",
                  # the heartbeat, re-sent often enough that its absence is news within minutes
                  "routes": [{"receiver": HEARTBEAT_RECEIVER, "matchers": [f'alertname="{WATCHDOG}"'],
                              "group_wait": "0s", "group_interval": interval, "repeat_interval": repeat}]},
        "receivers": [{"name": ALERTS_RECEIVER, **receiver_configs(receivers)},
                      {"name": HEARTBEAT_RECEIVER, **heartbeat_configs}],
    })
