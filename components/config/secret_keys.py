"""The twinspark secrets (apiKey, hfToken, grafanaAdminPassword and the alert receivers' URLs and password): read from the
stack, checked without ever showing a value, and wrapped as Pulumi secrets at once.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from typing import Mapping, Optional

import pulumi
from pulumi.runtime import config as runtime_config

from .errors import NAMESPACE, config_error
from .values import DEFAULT_HUB_ENDPOINT

# A secret lands in a shell's environment, a curl config line, an env file and an HTTP
# header. RFC 6750's bearer-token characters are plain in all of them, so a valid value
# cannot end a line, close a quote or expand.
SECRET_CHARACTERS = frozenset(string.ascii_letters + string.digits + "-._~+/=")
SECRET_CHARACTERS_IN_WORDS = "a letter, digit or one of - . _ ~ + / ="
# A URL's characters (RFC 3986) but quotes and backslashes: it only lands in a YAML file.
URL_CHARACTERS = frozenset(string.ascii_letters + string.digits + "-._~:/?#[]@!$&()*+,;=%")
URL_CHARACTERS_IN_WORDS = "a letter, digit or one of - . _ ~ : / ? # [ ] @ ! $ & ( ) * + , ; = %"


@dataclass(frozen=True)
class SecretKey:
    meaning: str
    min_length: int
    max_length: int = 256
    characters: frozenset = SECRET_CHARACTERS
    characters_in_words: str = SECRET_CHARACTERS_IN_WORDS
    shape: Optional[str] = None  # a regular expression the whole value must match
    shape_in_words: str = ""


SECRET_KEYS = {
    # shorter keys can be guessed; the generated one has 48 characters
    "apiKey": SecretKey(
        "the API key clients send; generated once when unset (`pulumi config set --secret apiKey ...`)",
        min_length=16),
    "hfToken": SecretKey("Hugging Face token, for gated models", min_length=8),
    "grafanaAdminPassword": SecretKey("Grafana's `admin` password; generated once when unset", min_length=12),
    "alertWebhookUrl": SecretKey(
        "where alerts are sent (an Alertmanager webhook receiver: JSON POST); unset: they show in Grafana and "
        "Prometheus only", min_length=10, characters=URL_CHARACTERS, characters_in_words=URL_CHARACTERS_IN_WORDS,
        shape=r"https?://[^/]+(/.*)?", shape_in_words="an http(s) URL of a receiver for Alertmanager's webhook POSTs"),
    "alertSlackWebhookUrl": SecretKey(
        "a Slack incoming webhook (`https://hooks.slack.com/services/...`): every alert and its resolution posted to "
        "its channel", min_length=20, characters=URL_CHARACTERS, characters_in_words=URL_CHARACTERS_IN_WORDS,
        shape=r"https://[^/]+/.+", shape_in_words="an https URL of a Slack incoming webhook"),
    "alertNtfyUrl": SecretKey(
        "an ntfy topic (`https://ntfy.sh/YOUR-TOPIC`, or your own server's): alerts as push notifications, through "
        "ntfy's alertmanager template; the topic's name is its password, so make it unguessable", min_length=10,
        characters=URL_CHARACTERS, characters_in_words=URL_CHARACTERS_IN_WORDS,
        shape=r"https?://[^/?#]+/[^/?#]+", shape_in_words="an http(s) URL of an ntfy topic, with no query"),
    "alertEmailPassword": SecretKey(
        "the SMTP password of `observability.alertEmail.username`", min_length=1, characters=URL_CHARACTERS,
        characters_in_words=URL_CHARACTERS_IN_WORDS),
}
_CHARACTER_NAMES = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab", " ": "a space"}


def secret_problem(key: str, value: str) -> Optional[str]:
    """Why `value` cannot be the secret `key`, in words that never show the value; None if it can."""
    spec = SECRET_KEYS[key]
    expected = f"expected {spec.min_length} to {spec.max_length} characters, each {spec.characters_in_words}"
    if not value:
        return f"the value (a secret, not shown) is empty — {expected}"
    outside = sorted({c for c in value if c not in spec.characters})
    if outside:
        names = ", ".join(_CHARACTER_NAMES.get(c, repr(c)) for c in outside)
        return f"the value (a secret, not shown) holds {names} — {expected}"
    if not spec.min_length <= len(value) <= spec.max_length:
        return f"the value (a secret, not shown) has {len(value)} characters — {expected}"
    if spec.shape and not re.fullmatch(spec.shape, value):
        return f"the value (a secret, not shown) is not {spec.shape_in_words.split(' of ')[0]} — expected {spec.shape_in_words}"
    return None


def load_secrets(config: Optional[pulumi.Config] = None,
                 hub_endpoints: Optional[Mapping[str, str]] = None) -> dict[str, Optional[pulumi.Output[str]]]:
    """Every secret key, validated and wrapped as a secret at once; None where unset.
    `hub_endpoints` (each lane's model.hubEndpoint, by its key): where the HF token goes, which must be https."""
    values = _checked_secrets(config or pulumi.Config(NAMESPACE), hub_endpoints)
    return {key: None if value is None else pulumi.Output.secret(value) for key, value in values.items()}


def _checked_secrets(config: pulumi.Config, hub_endpoints: Optional[Mapping[str, str]] = None) -> dict[str, Optional[str]]:
    """The plain values, for load_secrets only: refused unless valid, warned about if stored plain."""
    values, problems = {}, []
    endpoints = hub_endpoints or {"model.hubEndpoint": DEFAULT_HUB_ENDPOINT}
    for key, hub_endpoint in endpoints.items():
        if config.get("hfToken") is not None and not hub_endpoint.startswith("https://"):
            # huggingface_hub sends it as a header on every request to the endpoint
            problems.append(f"{NAMESPACE}:hfToken: set, and {NAMESPACE}:{key} is {hub_endpoint}: the token "
                            f"would cross the network in the clear — expected an https:// {key} (or no "
                            "hfToken, for a mirror that needs none)")
    for key in SECRET_KEYS:
        values[key] = value = config.get(key)
        if value is not None and (problem := secret_problem(key, value)):
            problems.append(f"{NAMESPACE}:{key}: {problem}")
        elif value is not None and not runtime_config.is_config_secret(config.full_key(key)):
            pulumi.log.warn(f"{NAMESPACE}:{key} is stored in plain text in the stack file: "
                            f"`pulumi config set --secret {key} ...` encrypts it")
    if problems:
        raise config_error(problems)
    return values
