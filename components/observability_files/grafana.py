"""Grafana's provisioning (the Prometheus datasource, the dashboard provider) and, with the dashboards,
the files the Grafana container reads."""

from __future__ import annotations

import json

from core import contract

from .dashboards import DATASOURCE_UID, render_dashboards
from .plan import ObservabilityPlan, RenderedFile, yaml_text

DASHBOARD_FOLDER = "twinspark"
HOME_DASHBOARD = "twinspark-overview.json"
GRAFANA_HOST_DIR = f"{contract.OBSERVABILITY_CONFIG_DIR}/grafana"


def render_grafana_datasource(plan: ObservabilityPlan) -> str:
    return yaml_text(
        {
            "apiVersion": 1,
            "datasources": [
                {
                    "name": "Prometheus (twinspark)",
                    "uid": DATASOURCE_UID,
                    "type": "prometheus",
                    "access": "proxy",
                    "url": f"http://127.0.0.1:{plan.prometheus_port}",
                    "isDefault": True,
                    "editable": False,
                    "jsonData": {"timeInterval": f"{plan.settings.scrape_interval_seconds}s", "httpMethod": "POST"},
                }
            ],
        }
    )


def render_grafana_dashboard_provider() -> str:
    return yaml_text(
        {
            "apiVersion": 1,
            "providers": [
                {
                    "name": "twinspark",
                    "folder": DASHBOARD_FOLDER,
                    "type": "file",
                    "disableDeletion": True,
                    "allowUiUpdates": False,
                    "updateIntervalSeconds": 60,
                    "options": {"path": contract.GRAFANA_CONTAINER_DASHBOARDS_DIR, "foldersFromFilesStructure": False},
                }
            ],
        }
    )


def grafana_files(plan: ObservabilityPlan) -> list[RenderedFile]:
    """Grafana's provisioning and the dashboards it provisions."""
    files = [
        RenderedFile("grafana-datasource", f"{GRAFANA_HOST_DIR}/provisioning/datasources/twinspark.yaml",
                     render_grafana_datasource(plan)),
        RenderedFile("grafana-dashboards", f"{GRAFANA_HOST_DIR}/provisioning/dashboards/twinspark.yaml",
                     render_grafana_dashboard_provider()),
    ]
    files += [RenderedFile("dashboard-" + name.removeprefix("twinspark-").removesuffix(".json"),
                           f"{GRAFANA_HOST_DIR}/dashboards/{name}", text)
              for name, text in render_dashboards(plan).items()]
    return files


def panel_list(plan: ObservabilityPlan) -> str:
    """docs/observability.md's list of the dashboards' panels (Grafana cannot run there, so no
    screenshots): one line per dashboard, its panels in order, rows left out."""
    lines = []
    for name, text in render_dashboards(plan).items():
        model = json.loads(text)
        titles = [p["title"] for top in model["panels"] for p in [top, *top.get("panels", [])] if p["type"] != "row"]
        home = " (Grafana's home page)" if name == HOME_DASHBOARD else ""
        lines.append(f"- *{model['title']}*{home}: " + " · ".join(titles))
    return "\n".join(lines) + "\n"
