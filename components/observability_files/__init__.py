"""The observability component's files, rendered from the config (pure: no Pulumi, no resources),
one module per job; this package re-exports what observability.py, __main__.py and the tests import.

- `plan`          ObservabilityPlan (what every file depends on, `plan_from_config`), RenderedFile
- `metrics`       the Prometheus jobs, the guard's metrics, the selectors alerts and dashboards share
- `alerts`        the alert rules (serving, heartbeat, guard, fabric, nodes, GPU)
- `alertmanager`  Alertmanager's routes to the alert receivers (only with one set)
- `prometheus`    prometheus.yml; `prometheus_files`: it and the alert rules as managed files
- `dashboards`    the three dashboards as JSON, built with grafana-foundation-sdk
- `grafana`       Grafana's provisioning; `grafana_files`: it and the dashboards as managed files

Inside, each module imports only those listed before it.
"""

from .alertmanager import ALERTMANAGER_CONFIG, ALERTMANAGER_HOST_DIR, AlertReceivers, render_alertmanager_config
from .alerts import WATCHDOG, alert_groups, render_alert_rules
from .dashboards import render_dashboards
from .grafana import GRAFANA_HOST_DIR, HOME_DASHBOARD, grafana_files, panel_list
from .metrics import FABRIC_METRICS, GUARD_METRICS, POWER_WATCH_METRICS, ROCE_ERROR_COUNTERS
from .plan import (ObservabilityPlan, ObservedEngine, ObservedNode, ObservedRail, RenderedFile, plan_from_config,
                   scraped_over_the_rail)
from .prometheus import PROMETHEUS_HOST_DIR, RULES_FILE, prometheus_files, render_prometheus_config

__all__ = [
    "ALERTMANAGER_CONFIG", "ALERTMANAGER_HOST_DIR", "AlertReceivers", "FABRIC_METRICS", "GRAFANA_HOST_DIR", "GUARD_METRICS",
    "POWER_WATCH_METRICS",
    "HOME_DASHBOARD", "panel_list",
    "PROMETHEUS_HOST_DIR", "ROCE_ERROR_COUNTERS", "RULES_FILE", "WATCHDOG", "ObservabilityPlan", "ObservedEngine",
    "ObservedNode", "ObservedRail", "RenderedFile", "alert_groups", "grafana_files", "plan_from_config", "prometheus_files",
    "render_alert_rules", "render_alertmanager_config", "render_dashboards", "render_prometheus_config",
    "scraped_over_the_rail",
]
