# boot-common.sh — sourced by boot-head.sh and boot-worker.sh: environment, logging, Ray.
# shellcheck shell=bash

TWINSPARK_BUNDLE_DIR="${TWINSPARK_BUNDLE_DIR:-/twinspark}"
set -a
# shellcheck source=/dev/null
. "$TWINSPARK_BUNDLE_DIR/twinspark.env"
set +a
mkdir -p "$TWINSPARK_LOG_DIR"

log() { printf '%s %s %s: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$TWINSPARK_NODE_NAME" "$(basename "$0")" "$*"; }

membership() { python3 "$TWINSPARK_BUNDLE_DIR/ray-membership.py" "$@"; }

# A restarted container (or a supervisor in the sim) must not inherit a stale raylet.
stop_ray() { ray stop --force >/dev/null 2>&1 || true; }

# Every node declares one GPU: a GB10 Spark has exactly one, and TP spans the nodes.
# Bounded: `ray start` can hang on an unreachable GCS.
ray_start() { timeout 90 ray start --node-ip-address="$TWINSPARK_NODE_IP" --num-gpus=1 --disable-usage-stats "$@"; }
