"""The on-node contract: every path, port, name and option that the program, the scripts on
the nodes, the day-2 tools and the tests share. Each fact is spelled here once.

A leaf module: it imports nothing of the project and no Pulumi, so `ops` stays light and the
tests can read the contract without running the program. Scripts on the nodes learn these
values from their arguments or from twinspark.env (rendered from here), never by hard-coding —
but for the names marked "spelled in launch/ too" below: a script needs the first two to read
anything else, and the third is the one place host steps keep state in the login's home. Each
spelling in launch/ is held to this module by tests/test_contract_spellings.py.
"""

from __future__ import annotations

# ---- directories -------------------------------------------------------------------------
BUNDLE_DIR = "/opt/twinspark"  # on the host: everything the serving containers run
CONTAINER_BUNDLE_DIR = "/twinspark"  # the same files inside the containers (read-only)
LOG_DIR = "/var/log/twinspark"  # host and container (bind mount); rotated by logrotate
# host and serving containers (bind mount): compile and kernel caches outlive a replaced
# container, so its successor does not recompile from scratch
CACHE_DIR = "/var/cache/twinspark"
# Under the login's $HOME on each node (the host steps run as ssh.user): what a step keeps
# between runs — the model revision asked and resolved (fetch-weights.sh), who owns the sync key
# and its authorization (the prelude's owner records), the weight copy's daemons on a worker
# (sync-weights.sh). Spelled in launch/ too: as an argument it would change those steps' inputs.
USER_STATE_DIR = ".local/state/twinspark"
# Per managed file: the content hash whose apply last succeeded and the resource owning it.
APPLIED_STATE_DIR = "/var/lib/twinspark/applied"
# tmpfs, host and serving containers (volume): state that a reboot must clear — the guard's
# verdicts, its restart count and hold, the memory check before load
RUN_DIR = "/run/twinspark"

# ---- bundle files --------------------------------------------------------------------------
# spelled in launch/ too: the boot scripts and the API gateway's entrypoint source them from
# their own directory (the bundle), before they can know anything else
ENV_FILE = "twinspark.env"
SECRETS_FILE = "secrets.env"
LAUNCH_VLLM = "launch-vllm.sh"
PRELUDE = "prelude.sh"  # shared shell helpers: logging, die, flags, cleanup
STEP_PRELUDE = "step-prelude.sh"  # for the steps that reach a peer or keep owner records; sent where sourced
MEMBERSHIP_SCRIPT = "ray-membership.py"
MP_MEMBERSHIP_SCRIPT = "mp-membership.py"  # serving.executor mp: the rank watch in place of Ray's
BOOT_COMMON = "boot-common.sh"
RAY_TOKEN_FILE = "ray-token"  # every node, mode 600: Ray's token authentication
API_GATEWAY_SCRIPT = "api-gateway.sh"  # head: entrypoint of the API gateway container
API_GATEWAY_CONF = "api-gateway.conf"  # head: nginx config (the key itself is added at start)
# Several lanes (issue 41): the head's front gateway (nginx, the key) on serving.port hands every
# request to the router on the head's loopback, which passes it to the gateway of the lane serving
# its `model`: each lane's head runs the lane's own gateway (the key checked again) on this port.
LANE_ROUTER_SCRIPT = "lane-router.py"
API_FRONT_CONF = "api-front.conf"  # the head's front gateway's nginx config (several lanes)
API_FRONT_LOG = "api-front.log"
LANE_GATEWAY_PORT = 8101  # every lane head's gateway, when the stack serves several lanes
LANE_ROUTER_PORT = 8102  # the router, on the head's loopback
# inside the gateway container, a tmpfs of its own (mode 700): nginx's pid and the key map
# (api-key.conf, mode 600), so the key never lands on a disk
API_GATEWAY_RUN_DIR = "/run/twinspark-api-gateway"
API_GATEWAY_KEY_MAP = "api-key.conf"
API_GATEWAY_RUN_DIR_TMPFS = "mode=0700,size=1m,noexec,nosuid,nodev"
# inside the gateway container (its own layer): where nginx's workers (user nobody) spill request
# bodies larger than their memory buffer, and responses; the workers own it, mode 700
API_GATEWAY_TEMP_DIR = "/var/cache/twinspark-api-gateway"
# vLLM's API listens on a Unix socket (`vllm serve --uds`), never on a TCP port: only the
# containers that mount this directory (the head's serving container and the API gateway) can
# reach it, and inside them only root and the group below. Host and containers, same path; a
# tmpfs on the host, so a reboot leaves no stale socket.
VLLM_SOCKET_DIR = "/run/twinspark-vllm"
VLLM_SOCKET = f"{VLLM_SOCKET_DIR}/vllm.sock"
# The group the socket belongs to (the directory is setgid) and nginx's workers run in: created
# in the serving image (launch/serving-image/Dockerfile), a gid no DGX OS account uses.
API_SOCKET_GROUP, API_SOCKET_GID = "twinspark-api", 64180


# ---- the serving guard (head host, systemd): canary, wedge and crash-loop guard ------------
SERVING_GUARD_SCRIPT = "serving-guard.py"
SERVING_GUARD_DIR = "/usr/local/lib/twinspark"  # on the host, outside the containers' bundle
SERVING_GUARD_UNIT = "twinspark-serving-guard.service"
SERVING_GUARD_LOG = "serving-guard.log"
SERVING_GUARD_STATUS = f"{RUN_DIR}/serving-guard/status.json"  # its last verdict, for ops
# present while serving is held (restart loop): why, and what to do; a reboot clears it
SERVING_HOLD = f"{RUN_DIR}/serving-hold"
# persistent: the guard set the serving container's restart policy to "no" (to put it back
# after the reboot that cleared the hold)
SERVING_GUARD_HELD_MARK = "/var/lib/twinspark/serving-guard/held-container"
# persistent: the serving restarts in the window (a panic loop's reboots among them) and
# whether serving was held, so the reboot the hold asks for clears the count
SERVING_GUARD_RESTARTS = "/var/lib/twinspark/serving-guard/restarts.json"
SERVING_RESTART_POLICY = "unless-stopped"
# The fabric while serving (launch/fabric_watch.py, imported by the guard): NCCL's INFO lines of
# the INIT and NET subsystems (a few dozen a start) go to a file per host and process here, so the
# guard reads which network NCCL chose in vLLM's last start ("Using network IB" or "Socket").
NCCL_DEBUG_DIR = f"{LOG_DIR}/nccl"
NCCL_DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET",
                  "NCCL_DEBUG_FILE": f"{NCCL_DEBUG_DIR}/nccl.%h.%p.log"}
FABRIC_WATCH_MODULE = "fabric_watch.py"
# The head's drain: while this file exists the API gateway answers 503 with Retry-After (new
# requests wait elsewhere, streams in flight finish); the guard writes it before it stops serving
# to re-qualify the fabric. The folder, a tmpfs on the host, is the gateway's read-only.
DRAIN_DIR = "/run/twinspark-drain"
DRAIN_FILE = f"{DRAIN_DIR}/draining"
# The re-qualification (launch/requalify.py, beside the guard): each node's fabric check and NCCL
# rank as `pulumi up` ran them, its plan (their flags) rendered per node; the head reaches the
# workers' halves with a key of its own that may run only them (REQUALIFY_KEY's forced command).
REQUALIFY_SCRIPT = "requalify.py"
REQUALIFY_DIR = f"{SERVING_GUARD_DIR}/requalify"  # the plan and the checks' scripts, root-owned
REQUALIFY_PLAN = f"{REQUALIFY_DIR}/plan.json"
REQUALIFY_KEY = "~/.ssh/twinspark_requalify"
REQUALIFY_KEY_COMMENT = "twinspark-requalify"
REQUALIFY_KNOWN_HOSTS = "~/.ssh/twinspark_requalify_known_hosts"

# ---- a box that stops answering (components/box_recovery.py) ------------------------------
# Every node's recorder (launch/node-recorder.py, a systemd service ordered before docker): at
# boot it tells a clean shutdown (its own stop wrote the mark) from a freeze or power loss and, after
# one, keeps the previous boot's kernel log, pstore, GPU Xid lines and its last memory picture in a
# report; while running it writes that picture to disk every RECORDER_INTERVAL_S.
NODE_RECORDER_SCRIPT = "node-recorder.py"
NODE_RECORDER = f"{SERVING_GUARD_DIR}/{NODE_RECORDER_SCRIPT}"  # on every node: the unit, the tools and the release run it
NODE_RECORDER_UNIT = "twinspark-node-recorder.service"
FORENSICS_DIR = "/var/lib/twinspark/forensics"  # root-only: the reports, the last memory picture, the marks
RECORDER_INTERVAL_S = 15
# After an unclean boot, until the fabric and NCCL checks pass again (the head's guard re-qualifies
# and then releases it on every node): the boot scripts wait while the hold exists (it is in
# RUN_DIR, which the serving containers mount); the pending record on disk puts it back after a
# clean reboot that comes first.
UNCLEAN_BOOT_HOLD = f"{RUN_DIR}/unclean-boot"
UNCLEAN_BOOT_PENDING = f"{FORENSICS_DIR}/pending-requalification"
# The power watch (launch/power-watch.py, on the node that watches another, only where that one has
# a `power` plug): the plug's URL, a secret, root-only.
POWER_WATCH_SCRIPT = "power-watch.py"
POWER_WATCH_UNIT = "twinspark-power-watch.service"
POWER_WATCH_DIR = "/var/lib/twinspark/power-watch"  # per watched node: its plug's URL (0600), its cycles
POWER_WATCH_PLAN = f"{POWER_WATCH_DIR}/plan.json"
POWER_WATCH_STATUS = f"{RUN_DIR}/power-watch.json"  # the watch's state, for `twinspark status`
NODE_RECORDER_LOG = "node-recorder.log"
POWER_WATCH_LOG = "power-watch.log"

# ---- memory before load (every node, in the boot scripts) -------------------------------------
MEMORY_CHECK_SCRIPT = "memory-check.py"
# NCCL_IB_GID_INDEX read from the HCAs' GID tables at every start (boot-common.sh export_gid_index)
ROCE_GID_SCRIPT = "roce-gid.py"
MEMORY_CHECK_STATUS = f"{RUN_DIR}/memory-check.json"
# The host's cgroup tree inside the serving containers (read-only): the check reads what each
# slice holds there (a container's own /sys/fs/cgroup is its own cgroup only).
HOST_CGROUP_DIR = "/host/sys/fs/cgroup"

# ---- the KV tier (serving.kvTier, core/kv_tier.py): its blocks under the cache (mounted), root-only ----------
KV_TIER_DIR = f"{CACHE_DIR}/kv-tier"  # one folder a lane
KV_TIER_BOUND_SCRIPT = "kv-tier-bound.py"  # beside vLLM: the tier's files held under kvTier.diskGiB
KV_TIER_BOUND_LOG = "kv-tier-bound.log"
KV_TIER_SEED_FILE = "kv-tier-hash-seed"  # mode 600: the stack's PYTHONHASHSEED, which names the tier's blocks

# ---- co-tenants: sessions and services are capped; the serving containers live apart -------
CONTAINER_SLICE = "twinspark.slice"  # cgroup parent of the serving containers
COTENANT_SLICES = ("user.slice", "system.slice")




def boot_script(role: str, executor: str = "ray") -> str:
    """The serving container's entrypoint: Ray's boot scripts, or mp's (no Ray at all)."""
    return f"boot-{role}.sh" if executor == "ray" else f"boot-{role}-{executor}.sh"


# ---- logs (one file per stream, under LOG_DIR) ---------------------------------------------
def boot_log(role: str) -> str:
    return f"boot-{role}.log"


VLLM_LOG = "vllm.log"
API_GATEWAY_LOG = "api-gateway.log"
LOGROTATE_PATH = "/etc/logrotate.d/twinspark"
# docker's own json-file log of each container: only what a boot script prints before it
# reaches its log file, but capped all the same
DOCKER_LOG_OPTIONS = {"max-size": "20m", "max-file": "3"}

# ---- ports -------------------------------------------------------------------------------
SSH_PORT = 22
RAY_PORT = 6379
# the head starts no dashboard (launch/boot-head.sh); its port stays reserved, as Ray's default
# for one an owner starts by hand
RAY_DASHBOARD_PORT = 8265
NCCL_RENDEZVOUS_PORT = 29555
# serving.executor mp: torch.distributed's TCPStore on the head's rank 0, which every node rank
# joins (`--master-port`; vLLM's own default, vllm/config/parallel.py ParallelConfig.master_port)
MP_MASTER_PORT = 29501
# The API gateway (nginx) listens on serving.port on every interface and checks the key on
# every path but /health. On the head's loopback it also serves vLLM's /metrics alone, on this
# port, for Prometheus (which itself answers every local process without a key).
# Below Ray's worker ports (10002-19999) and the kernel's ephemeral range, where Ray's own
# processes could hold it first.
METRICS_LOOPBACK_PORT = 8100
# several lanes: a lane gateway's, apart from the one-lane gateway's it replaces; on loopback, and on a worker
# that heads a lane also on its Ray address, for the head's Prometheus alone (the firewall's `lane-metrics`)
LANE_METRICS_PORT = 8103


def metrics_loopback_port(gateway_port: int) -> int:
    """Where the gateway on `gateway_port` serves vLLM's /metrics on loopback (the guard and Prometheus read it)."""
    return LANE_METRICS_PORT if gateway_port == LANE_GATEWAY_PORT else METRICS_LOOPBACK_PORT

# Ray's defaults for the ports the boot scripts leave unset (`ray start --help`)
RAY_CLIENT_PORT = 10001
RAY_WORKER_PORTS = (10002, 19999)
# Linux's default net.ipv4.ip_local_port_range: Ray, NCCL and vLLM take their random ports here
EPHEMERAL_PORTS = (32768, 60999)


# ---- Ray token authentication (Ray >= 2.52): every ray process and client needs both ---------
def ray_auth_env() -> dict[str, str]:
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": f"{CONTAINER_BUNDLE_DIR}/{RAY_TOKEN_FILE}"}


# ---- compile caches (under CACHE_DIR): where each library keeps what it compiled -------------
def compile_cache_env() -> dict[str, str]:
    return {
        "VLLM_CACHE_ROOT": f"{CACHE_DIR}/vllm",  # vLLM's torch.compile artefacts
        "TORCHINDUCTOR_CACHE_DIR": f"{CACHE_DIR}/torchinductor",  # Inductor's kernels (default: /tmp)
        "TRITON_CACHE_DIR": f"{CACHE_DIR}/triton",
        "FLASHINFER_WORKSPACE_BASE": f"{CACHE_DIR}/flashinfer",  # FlashInfer's JIT (+ .cache/flashinfer)
    }


# ---- host firewall (nftables), applied by HostPrep -------------------------------------------
FIREWALL_TABLE = "twinspark"  # `table inet twinspark`: IPv4 and IPv6, ours alone
FIREWALL_RULES_PATH = "/etc/twinspark/firewall.nft"
FIREWALL_UNIT = "twinspark-firewall.service"
# the weight copy's (source, destination) address pairs, each open only while its copy runs
# (components/firewall.py makes the set, launch/sync-weights.sh fills and empties it)
WEIGHT_COPY_SET = "weight_copy_flows"

# ---- containers ----------------------------------------------------------------------------
# The serving image is tagged per build input (`twinspark-vllm:ray-<hash>`, serving_image.py):
# an upgrade's new build does not take the previous one's tag, so the previous image stays
# tagged on the node (not dangling, kept by `docker image prune`) for a rollback.
SERVING_IMAGE_REPOSITORY = "twinspark-vllm"
NCCL_CHECK_CONTAINER = "twinspark-nccl-check"
# One name on every node whatever its role: a role change replaces the node's container in
# place (the old one stops first) instead of starting a second one beside it.
SERVING_CONTAINER = "twinspark-serving"
API_GATEWAY_CONTAINER = "twinspark-api-gateway"  # head only: on serving.port (several lanes: the router's front)
LANE_GATEWAY_CONTAINER = "twinspark-lane-gateway"  # several lanes: every lane head's own, on LANE_GATEWAY_PORT
LANE_ROUTER_CONTAINER = "twinspark-lane-router"  # several lanes: on the head


# The recipe's docker options (§4), for the serving containers and NcclCheck's `docker run`.
NETWORK_MODE = IPC_MODE = "host"
GPUS = "all"
ULIMITS = {"memlock": -1, "stack": 67108864}
CAPABILITIES = ["IPC_LOCK"]
DEVICES = ["/dev/infiniband"]
# What the container runs: a keyed hash (HMAC with a per-stack secret) over its bundle, so a
# change restarts it while the label reveals nothing that a weak key could be guessed from.
BUNDLE_LABEL = "twinspark.bundle-hmac"


def docker_run_flags() -> list[str]:
    """The same options as `docker run` flags."""
    flags = ["--network", NETWORK_MODE, "--ipc", IPC_MODE, "--gpus", GPUS]
    flags += [a for name, limit in ULIMITS.items() for a in ("--ulimit", f"{name}={limit}")]
    flags += [a for cap in CAPABILITIES for a in ("--cap-add", cap)]
    flags += [a for dev in DEVICES for a in ("--device", dev)]
    flags += ["--cgroup-parent", CONTAINER_SLICE]  # beside serving, outside the capped slices
    return flags

# ---- weights -------------------------------------------------------------------------------
# DIR/WEIGHTS_MANIFEST: the revision and each file's size and sha256, as checked against the
# hub (JSON, launch/weights.py `pin`): written on the head by fetch-weights.sh, sent to each
# worker by sync-weights.sh. DIR/WEIGHTS_RECORD, on every node: what was verified there
# (stat and sha256 per file, and the revision once complete): unchanged files are not re-read.
WEIGHTS_MANIFEST = ".twinspark-manifest"
WEIGHTS_RECORD = ".twinspark-verified"
# The copy's rsync daemons on each worker, one per rail address, only while a copy runs, and
# at most this long: a daemon a killed copy left stops by itself then, its firewall pairs too.
WEIGHTS_SYNC_PORT = 8873
WEIGHTS_SYNC_HOURS = 8
SYNC_KEY = "~/.ssh/twinspark_weights"
SYNC_KEY_COMMENT = "twinspark-weights"
SYNC_KNOWN_HOSTS = "~/.ssh/twinspark_known_hosts"
# On a node that admits a sync key: the key's forced command (launch/sync-key-command.py) and
# the weights.py it runs, root-owned: what the key may do, whoever holds it
SYNC_KEY_COMMAND_DIR = "/usr/local/lib/twinspark/sync-key"

# ---- observability (components/observability.py) ------------------------------------------
# Everything the monitoring containers keep on the host; `pulumi destroy` keeps it (metrics and
# Grafana's database), like the weights.
OBSERVABILITY_DIR = "/var/lib/twinspark/observability"
OBSERVABILITY_CONFIG_DIR = f"{OBSERVABILITY_DIR}/config"  # the rendered files, per container
PROMETHEUS_DATA_DIR = f"{OBSERVABILITY_DIR}/prometheus"  # the TSDB (head)
GRAFANA_DATA_DIR = f"{OBSERVABILITY_DIR}/grafana"  # Grafana's database (head)
ALERTMANAGER_DATA_DIR = f"{OBSERVABILITY_DIR}/alertmanager"  # silences, notification log (head)
# The node exporter's textfile collector reads DIR/*.prom: where the guard writes its metrics.
TEXTFILE_DIR = f"{OBSERVABILITY_DIR}/textfile"
SERVING_GUARD_TEXTFILE = f"{TEXTFILE_DIR}/twinspark-guard.prom"  # the guard's twinspark_guard_* series
POWER_WATCH_TEXTFILE = f"{TEXTFILE_DIR}/twinspark-power-watch.prom"  # the watcher's twinspark_power_*
GRAFANA_PASSWORD_FILE = f"{OBSERVABILITY_DIR}/secrets/grafana-admin-password"
# The images' own users: Prometheus and Alertmanager run as nobody, Grafana as 472 in group root.
PROMETHEUS_UID = ALERTMANAGER_UID = 65534
GRAFANA_UID, GRAFANA_GID = 472, 0
# Ports. Prometheus and Alertmanager listen on the head's loopback only (no authentication);
# the exporters on each node's first-rail address, so scrapes cross the cable, not the LAN.
PROMETHEUS_PORT = 9090
ALERTMANAGER_PORT = 9093
NODE_EXPORTER_PORT = 9100
GPU_EXPORTER_PORT = 9835
OBSERVABILITY_PORTS = {"Prometheus": PROMETHEUS_PORT, "Alertmanager": ALERTMANAGER_PORT,
                       "the node exporter": NODE_EXPORTER_PORT, "the GPU exporter": GPU_EXPORTER_PORT}
OBSERVABILITY_CONFIG_LABEL = "twinspark.config-sha256"
# Inside the containers (bind mounts of the directories above).
PROMETHEUS_CONTAINER_CONFIG_DIR = "/etc/prometheus"  # <- OBSERVABILITY_CONFIG_DIR/prometheus
PROMETHEUS_CONTAINER_DATA_DIR = "/prometheus"
GRAFANA_CONTAINER_PROVISIONING_DIR = "/etc/grafana/provisioning"  # <- OBSERVABILITY_CONFIG_DIR/grafana/provisioning
GRAFANA_CONTAINER_DASHBOARDS_DIR = "/etc/grafana/dashboards"  # <- OBSERVABILITY_CONFIG_DIR/grafana/dashboards
GRAFANA_CONTAINER_DATA_DIR = "/var/lib/grafana"
GRAFANA_CONTAINER_PASSWORD_FILE = "/run/secrets/grafana-admin-password"
ALERTMANAGER_CONTAINER_CONFIG_DIR = "/etc/alertmanager"  # <- OBSERVABILITY_CONFIG_DIR/alertmanager
ALERTMANAGER_CONTAINER_DATA_DIR = "/alertmanager"
NODE_EXPORTER_HOST_ROOT = "/host"  # the host's / inside the node exporter, read-only


def observability_container_name(capability: str) -> str:
    """twinspark-prometheus, -grafana, -alertmanager, -node-exporter, -gpu-exporter."""
    return f"twinspark-{capability}"
