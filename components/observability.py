"""Observability: metrics, dashboards and alerts on the cluster (twinspark:observability).

Creates, through each node's own docker daemon (the ServingImage providers) and SSH:
- on every node: `{node}-observability-dirs` (launch/observability-dirs.sh: the data
  directories, owned by the containers' users), a pull per exporter by the digest its tag had
  when first resolved on the head (`observability-<capability>-image-pin`, as serving.image's
  pin: one image on every node, never a tag that moves), and two
  containers with host networking and restart `unless-stopped`:
    twinspark-node-exporter  host metrics plus the `infiniband` (RoCE port counters and state)
                             and `netclass` (link up, MTU, speed) collectors, the host's / read-only
                             at /host, and the textfile collector (where the guard writes);
                             bound to the node's first-rail address: scrapes cross the cable
    twinspark-gpu-exporter   nvidia_gpu_exporter: nvidia-smi's fields (temperature, power,
                             clocks, throttle reasons, utilization) on the first-rail address.
                             Not DCGM: on GB10 it leaves fields unregistered or at zero, while
                             nvidia-smi works (ops status reads it too). GB10's memory is unified:
                             memory comes from /proc/meminfo through the node exporter.
- on the head: the rendered files (observability_files/) as managed files, the Grafana admin
  password among them (mode 0640 root:root; Grafana runs as uid 472 in group root and reads it
  through GF_SECURITY_ADMIN_PASSWORD__FILE, so it is in no argument, environment or label), and
    twinspark-prometheus     on 127.0.0.1 (no auth), retention by days and size
    twinspark-grafana        on every interface, anonymous access off, datasource and
                             dashboards provisioned read-only
    twinspark-alertmanager   only with an alert receiver: 127.0.0.1, routes to the receivers
  plus `{head}-observability-grafana-admin` (launch/grafana-admin-password.sh), which sets the
  password in Grafana's database: Grafana applies the __FILE password only when it creates it.
Prometheus, Grafana and Alertmanager carry the hash of their files in a label, so a changed
rule or dashboard replaces the container and a no-op changes nothing. Destroying the
component keeps the data directories (metrics, Grafana's database), like the weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

import pulumi
import pulumi_docker as docker

from core import contract

from .config import NAMESPACE, config_error
from .config import Observability as ObservabilityConfig

from .observability_files import (
    ALERTMANAGER_CONFIG,
    ALERTMANAGER_HOST_DIR,
    AlertReceivers,
    GRAFANA_HOST_DIR,
    HOME_DASHBOARD,
    PROMETHEUS_HOST_DIR,
    ObservabilityPlan,
    ObservedNode,
    RenderedFile,
    grafana_files,
    prometheus_files,
    render_alertmanager_config,
)
from .remote import ManagedFile, NodeHandle, NodeScript, files_hash, managed_file_commands, node_command

CAPABILITY = "observability"
DIRS_SCRIPT = "observability-dirs.sh"
PASSWORD_SCRIPT = "grafana-admin-password.sh"
GRAFANA_ADMIN_USER = "admin"
GRAFANA_HEALTH_TIMEOUT_S = 180
STOP_GRACE_SECONDS = 30  # Prometheus flushes its head block, Grafana closes its database


@dataclass(frozen=True)
class ObservedAccess(NodeHandle):
    """How the component reaches one node."""

    docker_provider: pulumi.ProviderResource  # that node's own docker daemon
    installation: pulumi.Resource  # the node as installed (remote.node_installation): a reinstall pulls again


@dataclass(frozen=True)
class ObservabilityArgs:
    plan: ObservabilityPlan  # everything the rendered files and commands depend on
    access: dict[str, ObservedAccess]  # node name -> access
    grafana_admin_password: pulumi.Input[str]  # a secret
    alert_receivers: Optional[pulumi.Output[AlertReceivers]]  # secrets; None: alerts stay in Grafana/Prometheus
    label_key: pulumi.Input[str]  # keys the hash of a config holding secrets (the receivers')
    # (capability, image) -> that image by the digest its tag had when first resolved on the head,
    # the same on every node (__main__ wires serving_image.BaseImagePin: one resolve per image used)
    pin_image: Callable[[str, str], pulumi.Output[str]]


RECEIVER_SECRETS = ("alertWebhookUrl", "alertSlackWebhookUrl", "alertNtfyUrl", "alertEmailPassword")


def alert_receivers(settings: ObservabilityConfig, secrets: Mapping[str, Optional[pulumi.Output[str]]]
                    ) -> Optional[pulumi.Output[AlertReceivers]]:
    """The receivers the stack names (None: none, and no Alertmanager); a login without its password,
    or a password nothing uses, is refused before anything is touched."""
    email, password = settings.alert_email, secrets["alertEmailPassword"]
    if email is not None and email.username and password is None:
        raise config_error([f"{NAMESPACE}:alertEmailPassword: not set — expected the SMTP password of "
                            f"observability.alertEmail.username ({email.username}), set with `pulumi config set "
                            "--secret alertEmailPassword`"])
    if password is not None and not (email is not None and email.username):
        raise config_error([f"{NAMESPACE}:alertEmailPassword: set, but nothing logs in with it — expected "
                            "observability.alertEmail with a username, or remove the password"])
    if email is None and all(secrets[key] is None for key in RECEIVER_SECRETS):
        return None
    values = [secrets[key] or "" for key in RECEIVER_SECRETS]
    return pulumi.Output.all(*values).apply(lambda v: AlertReceivers(
        webhook_url=v[0] or None, slack_url=v[1] or None, ntfy_url=v[2] or None, email=email,
        email_password=v[3] or None))


# ---- pure pieces: what each container and script is started with ---------------------------
def dirs_args(node: ObservedNode) -> list[str]:
    """PATH:UID:GID:MODE for launch/observability-dirs.sh; the servers' data on the head only."""
    dirs = [f"{contract.OBSERVABILITY_DIR}:0:0:0755", f"{contract.TEXTFILE_DIR}:0:0:0755"]
    if node.role == "head":
        dirs += [
            f"{contract.PROMETHEUS_DATA_DIR}:{contract.PROMETHEUS_UID}:{contract.PROMETHEUS_UID}:0750",
            f"{contract.GRAFANA_DATA_DIR}:{contract.GRAFANA_UID}:{contract.GRAFANA_GID}:0750",
            f"{contract.ALERTMANAGER_DATA_DIR}:{contract.ALERTMANAGER_UID}:{contract.ALERTMANAGER_UID}:0750",
        ]
    return ["--node", node.name] + [a for spec in dirs for a in ("--dir", spec)]


def node_exporter_command(node: ObservedNode, port: int = contract.NODE_EXPORTER_PORT) -> list[str]:
    virtual = "^(veth.*|docker.*|br-.*|lo)$"
    return [
        f"--path.rootfs={contract.NODE_EXPORTER_HOST_ROOT}",
        f"--web.listen-address={node.rail_ip}:{port}",
        "--collector.infiniband",  # /sys/class/infiniband: RoCE port counters and state
        "--collector.netclass",  # /sys/class/net: link up, MTU, speed
        f"--collector.netclass.ignored-devices={virtual}",
        f"--collector.netdev.device-exclude={virtual}",
        "--collector.filesystem.mount-points-exclude=^/(dev|proc|run|sys|var/lib/docker/.+|var/lib/containers/.+)($|/)",
        "--collector.textfile",
        f"--collector.textfile.directory={contract.NODE_EXPORTER_HOST_ROOT}{contract.TEXTFILE_DIR}",
    ]


def gpu_exporter_command(node: ObservedNode) -> list[str]:
    return [f"--web.listen-address={node.rail_ip}:{contract.GPU_EXPORTER_PORT}", "--query-field-names=AUTO"]


def prometheus_command(plan: ObservabilityPlan) -> list[str]:
    s = plan.settings
    return [
        f"--config.file={contract.PROMETHEUS_CONTAINER_CONFIG_DIR}/prometheus.yml",
        f"--storage.tsdb.path={contract.PROMETHEUS_CONTAINER_DATA_DIR}",
        f"--storage.tsdb.retention.time={s.retention_days}d",
        f"--storage.tsdb.retention.size={s.retention_size}",
        f"--web.listen-address=127.0.0.1:{contract.PROMETHEUS_PORT}",
    ]


def alertmanager_command() -> list[str]:
    return [
        f"--config.file={contract.ALERTMANAGER_CONTAINER_CONFIG_DIR}/{ALERTMANAGER_CONFIG}",
        f"--storage.path={contract.ALERTMANAGER_CONTAINER_DATA_DIR}",
        f"--web.listen-address=127.0.0.1:{contract.ALERTMANAGER_PORT}",
        "--cluster.listen-address=",  # one Alertmanager: no gossip port
    ]


def grafana_env(plan: ObservabilityPlan) -> list[str]:
    env = {
        "GF_SERVER_HTTP_PORT": str(plan.settings.grafana_port),
        "GF_SECURITY_ADMIN_USER": GRAFANA_ADMIN_USER,
        "GF_SECURITY_ADMIN_PASSWORD__FILE": contract.GRAFANA_CONTAINER_PASSWORD_FILE,
        "GF_AUTH_ANONYMOUS_ENABLED": "false",
        "GF_USERS_ALLOW_SIGN_UP": "false",
        "GF_ANALYTICS_REPORTING_ENABLED": "false",
        "GF_ANALYTICS_CHECK_FOR_UPDATES": "false",
        "GF_ANALYTICS_CHECK_FOR_PLUGIN_UPDATES": "false",
        "GF_PLUGINS_PREINSTALL_DISABLED": "true",
        "GF_NEWS_NEWS_FEED_ENABLED": "false",
        "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH": f"{contract.GRAFANA_CONTAINER_DASHBOARDS_DIR}/{HOME_DASHBOARD}",
    }
    return [f"{k}={v}" for k, v in env.items()]


def grafana_admin_args(plan: ObservabilityPlan) -> list[str]:
    return ["--node", plan.head.name, "--container", contract.observability_container_name("grafana"),
            "--url", f"http://127.0.0.1:{plan.settings.grafana_port}", "--timeout-s", str(GRAFANA_HEALTH_TIMEOUT_S)]


def _managed(files: Sequence[RenderedFile]) -> list[ManagedFile]:
    return [ManagedFile(f.step, f.path, f.content) for f in files]


def _bind(source: str, target: str, read_only: bool = False) -> docker.ContainerMountArgs:
    return docker.ContainerMountArgs(type="bind", source=source, target=target, read_only=read_only)


# ---- the component -------------------------------------------------------------------------
class Observability(pulumi.ComponentResource):
    def __init__(self, name: str, args: ObservabilityArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("twinspark:observability:Observability", name, None, opts)
        self._args = args
        self._pins: dict[str, pulumi.Output[str]] = {}  # by capability: each image resolved once
        plan, head = args.plan, args.plan.head
        images = plan.settings.images

        dirs = {}
        self.node_exporters, self.gpu_exporters = {}, {}
        for node in plan.nodes:
            dirs[node.name] = node_command(
                f"{node.name}-{CAPABILITY}-dirs", args.access[node.name].connection,
                NodeScript(DIRS_SCRIPT, dirs_args(node)), parent=self,
            )
            self.node_exporters[node.name] = self._container(
                node, "node-exporter", images.node_exporter, [dirs[node.name]],
                command=node_exporter_command(node),
                pid_mode="host",
                mounts=[docker.ContainerMountArgs(
                    type="bind", source="/", target=contract.NODE_EXPORTER_HOST_ROOT, read_only=True,
                    bind_options=docker.ContainerMountBindOptionsArgs(propagation="rslave"))],
            )
            self.gpu_exporters[node.name] = self._container(
                node, "gpu-exporter", images.gpu_exporter, [dirs[node.name]],
                command=gpu_exporter_command(node), gpus="all", envs=["NVIDIA_DRIVER_CAPABILITIES=utility"],
            )

        conn = args.access[head.name].connection
        prom_files = _managed(prometheus_files(plan))
        self.prometheus = self._container(
            head, "prometheus", images.prometheus,
            [dirs[head.name], *managed_file_commands(head.name, CAPABILITY, conn, prom_files, parent=self)],
            config_hash=files_hash(prom_files),
            command=prometheus_command(plan),
            mounts=[_bind(PROMETHEUS_HOST_DIR, contract.PROMETHEUS_CONTAINER_CONFIG_DIR, read_only=True),
                    _bind(contract.PROMETHEUS_DATA_DIR, contract.PROMETHEUS_CONTAINER_DATA_DIR)],
        )

        password = pulumi.Output.secret(args.grafana_admin_password)
        graf_files = _managed(grafana_files(plan))
        # no trailing newline: Grafana reads the file verbatim
        password_file = ManagedFile("grafana-password", contract.GRAFANA_PASSWORD_FILE, password, mode="0640")
        self.grafana = self._container(
            head, "grafana", images.grafana,
            [dirs[head.name], *managed_file_commands(head.name, CAPABILITY, conn, [*graf_files, password_file],
                                                     parent=self)],
            config_hash=files_hash(graf_files),
            envs=grafana_env(plan),
            mounts=[
                _bind(f"{GRAFANA_HOST_DIR}/provisioning", contract.GRAFANA_CONTAINER_PROVISIONING_DIR, read_only=True),
                _bind(f"{GRAFANA_HOST_DIR}/dashboards", contract.GRAFANA_CONTAINER_DASHBOARDS_DIR, read_only=True),
                _bind(contract.GRAFANA_DATA_DIR, contract.GRAFANA_CONTAINER_DATA_DIR),
                _bind(contract.GRAFANA_PASSWORD_FILE, contract.GRAFANA_CONTAINER_PASSWORD_FILE, read_only=True),
            ],
        )
        # a new Grafana container or a new password (stdin changes): set it again
        self.grafana_admin = node_command(
            f"{head.name}-{CAPABILITY}-grafana-admin", conn,
            NodeScript(PASSWORD_SCRIPT, grafana_admin_args(plan), secrets={"GRAFANA_ADMIN_PASSWORD": password}),
            parent=self, triggers=[self.grafana.id], depends_on=[self.grafana],
        )

        self.alertmanager = None
        if args.alert_receivers is not None:
            config_text: pulumi.Input[str] = args.alert_receivers.apply(render_alertmanager_config)
            rendered = pulumi.Output.secret(config_text)
            # mode 0640 root:root and the container in group root: the URLs hold tokens, the file a password
            am_files = [ManagedFile("alertmanager-config", f"{ALERTMANAGER_HOST_DIR}/{ALERTMANAGER_CONFIG}", rendered,
                                    mode="0640")]
            self.alertmanager = self._container(
                head, "alertmanager", images.alertmanager,
                [dirs[head.name], *managed_file_commands(head.name, CAPABILITY, conn, am_files, parent=self)],
                config_hash=files_hash(am_files, key=args.label_key),
                command=alertmanager_command(),
                user=f"{contract.ALERTMANAGER_UID}:0",
                mounts=[_bind(ALERTMANAGER_HOST_DIR, contract.ALERTMANAGER_CONTAINER_CONFIG_DIR, read_only=True),
                        _bind(contract.ALERTMANAGER_DATA_DIR, contract.ALERTMANAGER_CONTAINER_DATA_DIR)],
            )
        self.register_outputs({})

    def _pinned(self, capability: str, image: str) -> pulumi.Output[str]:
        """The image by digest (a tag pulled on each node could name another image on each, and move)."""
        if capability not in self._pins:
            self._pins[capability] = self._args.pin_image(capability, image)
        return self._pins[capability]

    def _container(self, node: ObservedNode, capability: str, image: str, after: Sequence[pulumi.Resource],
                   config_hash: Optional[pulumi.Input[str]] = None, **container_args) -> docker.Container:
        provider = self._args.access[node.name].docker_provider
        reinstalled = [self._args.access[node.name].installation]
        pulled = docker.RemoteImage(
            f"{node.name}-{CAPABILITY}-{capability}-image",
            name=self._pinned(capability, image),
            platform=self._args.plan.platform,  # the provider would pull the operator's arch
            keep_locally=True,  # like the serving image: destroy keeps images
            opts=pulumi.ResourceOptions(parent=self, provider=provider, replace_with=reinstalled),
        )
        labels = [docker.ContainerLabelArgs(label=contract.OBSERVABILITY_CONFIG_LABEL, value=config_hash)] \
            if config_hash is not None else None
        return docker.Container(
            f"{node.name}-{CAPABILITY}-{capability}",
            name=contract.observability_container_name(capability),
            image=pulled.image_id,  # the pulled image's id, never the tag (a tag would replace forever)
            network_mode=contract.NETWORK_MODE,
            restart="unless-stopped",
            destroy_grace_seconds=STOP_GRACE_SECONDS,
            log_driver="json-file",
            log_opts=contract.DOCKER_LOG_OPTIONS,
            labels=labels,
            wait=False,
            **container_args,
            opts=pulumi.ResourceOptions(parent=self, provider=provider, depends_on=list(after),
                                        delete_before_replace=True,  # the container name is fixed
                                        replace_with=reinstalled),
        )
