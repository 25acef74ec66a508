#!/usr/bin/env bash
# scripts/sim.sh — twinspark on simulated Sparks on this Linux box, through the real engine.
#
#   sudo -i                                 # as root: the nodes are namespaces and mounts
#   scripts/sim.sh up [--nodes N] [--topology switch|ring]
#                                           # N simulated nodes (default: Pulumi.sim.yaml's 2) cabled as
#                                           # a switch (the stack's) or a ring (--nodes 3), then
#                                           # `pulumi up --stack sim` of this program onto them
#   eval "$(scripts/sim.sh env)"            # this shell: the engine, the sim stack's backend and passphrase
#   pulumi stack output --stack sim         # then curl, `twinspark status`, `twinspark bench`, README step 6
#   scripts/sim.sh down                     # the nodes go, with everything on them; nothing is left
#
# Each node is a network namespace with its own sshd and dockerd (tests/sim/cluster.py), the
# cables a bridge per rail subnet, the LAN a bridge of the nodes' management links and this box;
# the images come from a registry on this machine, built from Debian's packages
# (dev/sim_images.py). What the box cannot be — a GPU, RDMA, unlimited memlock — is stood
# in for at the seam where the real part sits (docs/testing.md: "Try it without Sparks").
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# the modules tests/sim/cluster.py and the rest import, as pytest.ini's pythonpath gives them to the tests
export PYTHONPATH="$ROOT:$ROOT/tests:$ROOT/tests/sim:$ROOT/dev${PYTHONPATH:+:$PYTHONPATH}"
# shellcheck source=scripts/setup.sh
. scripts/setup.sh

# Pulumi.sim.yaml names the operator's key under this folder (~/.cache/twinspark-sim)
SIM_HOME=$HOME/.cache/twinspark-sim
STACK=sim
# the sim stack's secrets are encrypted with this (Pulumi.sim.yaml's encryptionsalt): they guard nothing
PASSPHRASE=twinspark-sim

die() { log "$*"; exit 1; }

print_env() {
  "$ROOT/scripts/engine.sh" env
  cat <<EOF
export PULUMI_BACKEND_URL='file://$SIM_HOME/state'
export PULUMI_CONFIG_PASSPHRASE='$PASSPHRASE'
export TWINSPARK_KNOWN_HOSTS_DIR='$SIM_HOME/known_hosts.d'
# twinspark (the checkout, editable in .venv) and the agents scripts/setup.sh installed from npm
export PATH='$ROOT/.venv/bin:$ROOT/build/claude/node_modules/.bin:$ROOT/build/codex/node_modules/.bin':"\$PATH"
EOF
}

images() { .venv/bin/python dev/sim_images.py "$@"; }

# the registry serves while the nodes live: started by up, stopped by down
start_registry() {
  stop_registry
  .venv/bin/python dev/sim_images.py serve >>"$SIM_HOME/registry.log" 2>&1 &  # it execs the registry: $! is its pid
  echo $! >"$SIM_HOME/registry.pid"
}
stop_registry() {
  [ -f "$SIM_HOME/registry.pid" ] || return 0
  kill "$(cat "$SIM_HOME/registry.pid")" 2>/dev/null || true
  rm -f "$SIM_HOME/registry.pid"
}

# the hub stand-in (tests/hub_standin.py) on the port of Pulumi.sim.yaml's model.hubEndpoint, the
# LFS files' "CDN" on the next, over https with the sim CA's certificate for the endpoint's name;
# the nodes reach it at their gateway. Repos: $SIM_HOME/hub/ORG/NAME
stack_value() {  # KEY FIELD: a value of Pulumi.sim.yaml
  .venv/bin/python -c 'import sys, yaml
print(yaml.safe_load(open("Pulumi.sim.yaml"))["config"][sys.argv[1]][sys.argv[2]])' "$1" "$2"
}
hub_port() {
  .venv/bin/python -c 'import sys, urllib.parse; print(urllib.parse.urlsplit(sys.argv[1]).port)' \
    "$(stack_value twinspark:model hubEndpoint)"
}
hub_tls() {  # the certificate and key files for the endpoint's name
  .venv/bin/python -c 'import sys, urllib.parse; from sim_registry import sim_certificate
print(*sim_certificate(urllib.parse.urlsplit(sys.argv[1]).hostname))' "$(stack_value twinspark:model hubEndpoint)"
}
start_hub() {
  stop_hub
  mkdir -p "$SIM_HOME/hub"
  .venv/bin/python tests/sim/sim_model.py "$SIM_HOME/hub" "$(stack_value twinspark:model repo)"
  local tls
  read -ra tls <<<"$(hub_tls)"
  python3 tests/hub_standin.py --root "$SIM_HOME/hub" --listen "0.0.0.0:$(hub_port)" --tls "${tls[@]}" \
    >>"$SIM_HOME/hub.log" 2>&1 &
  echo $! >"$SIM_HOME/hub.pid"
}
stop_hub() {
  [ -f "$SIM_HOME/hub.pid" ] || return 0
  kill "$(cat "$SIM_HOME/hub.pid")" 2>/dev/null || true
  rm -f "$SIM_HOME/hub.pid"
}

cmd_up() {
  local nodes=0 topology=""
  while [ $# -gt 0 ]; do
    case $1 in
      --nodes) [ $# -ge 2 ] || die "--nodes needs a number"; nodes=$2; shift 2 ;;
      --topology) [ $# -ge 2 ] || die "--topology needs switch or ring"; topology=$2; shift 2 ;;
      *) die "unknown argument: $1 (expected: up [--nodes N] [--topology switch|ring])" ;;
    esac
  done
  if ! [[ $nodes =~ ^[0-9]$ ]] || [ "$nodes" -eq 1 ]; then
    die "--nodes $nodes: expected a number of nodes from 2 to 9 (the sim's address plan)"
  fi
  case $topology in
    ""|switch) ;;
    ring) [ "$nodes" -eq 3 ] || die "--topology ring needs --nodes 3: a ring is three Sparks" ;;
    *) die "--topology $topology: expected switch or ring" ;;
  esac
  [ "$(id -u)" -eq 0 ] || die "run as root: the simulated nodes are network namespaces, mounts and daemons"
  setup_machine
  "$ROOT/scripts/engine.sh" build || die "the engine is not complete (scripts/engine.sh status says what is missing)"
  mkdir -p "$SIM_HOME/state"
  log "building the sim's images where their inputs changed (dev/sim_images.py)"
  images build
  start_registry
  start_hub
  local config_args=() config_out=() shape=(--nodes "$nodes")
  [ -z "$topology" ] || shape+=(--topology "$topology")
  if [ "$nodes" -ne 0 ]; then
    config_out=(--config-out "$SIM_HOME/Pulumi.sim-$nodes${topology:+-$topology}.yaml")
    config_args=(--config-file "$SIM_HOME/Pulumi.sim-$nodes${topology:+-$topology}.yaml")
  fi
  # down takes the same nodes down (a third node is not in the stack file)
  echo "${shape[*]}" >"$SIM_HOME/shape"
  log "booting the simulated nodes"
  .venv/bin/python tests/sim/cluster.py up --workdir "$SIM_HOME" "${shape[@]}" "${config_out[@]}"
  eval "$(print_env)"
  pulumi stack select --create "$STACK" --non-interactive
  log "pulumi up --stack $STACK"
  local started=$SECONDS
  pulumi up --yes --non-interactive --stack "$STACK" "${config_args[@]}"
  log "serving after $((SECONDS - started)) s of pulumi up; the endpoint and its key:"
  log "  eval \"\$(scripts/sim.sh env)\"; pulumi stack output --stack $STACK endpoint"
  log "  pulumi stack output --stack $STACK --show-secrets apiKey"
  log "then, in that shell, the README's step 6: twinspark client-setup, and ask Claude Code and Codex"
}

cmd_down() {
  [ "$(id -u)" -eq 0 ] || die "run as root"
  local shape=()
  [ ! -f "$SIM_HOME/shape" ] || read -r -a shape <"$SIM_HOME/shape"
  .venv/bin/python tests/sim/cluster.py down --workdir "$SIM_HOME" "${shape[@]}"
  rm -f "$SIM_HOME/shape"
  # the stack described nodes that are gone with everything on them: its state goes too
  if [ -d "$SIM_HOME/state" ]; then
    (eval "$(print_env)"; pulumi stack rm --yes --force --preserve-config "$STACK" --non-interactive >/dev/null 2>&1 || true)
    rm -rf "$SIM_HOME/state" "$SIM_HOME"/Pulumi.sim-*.yaml "$SIM_HOME/known_hosts.d"
  fi
  stop_registry
  stop_hub
}

case ${1:-} in
  up) shift; cmd_up "$@" ;;
  down) cmd_down ;;
  env) print_env ;;
  *) die "usage: $0 up [--nodes N] [--topology switch|ring] | env | down" ;;
esac
