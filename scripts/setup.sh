#!/usr/bin/env bash
# scripts/setup.sh — what the tests and the simulator need on this machine (Debian/Ubuntu, as
# root), installed only where missing; sourced by scripts/test.sh and scripts/sim.sh.
#
# Debian tools the tests run for real (shellcheck, netplan, sshd, rsync, ping, sudo, iproute2,
# nftables, nginx, Prometheus with promtool, the node exporter, Alertmanager with amtool; docker's
# daemon, its registry and debootstrap for the simulated nodes and their images, openssl for the
# registry's certificate, gcc for the nodes' memlock stand-in, busybox-static for the docker
# provider test's base image), a virtualenv with requirements-dev.txt in .venv, and the Codex and
# Claude Code CLIs from npm in build/codex and build/claude.

CODEX_VERSION=0.171.0
CLAUDE_CODE_VERSION=2.1.197
UV_VERSION=0.13.9
DEBIAN_PACKAGES=(shellcheck graphviz netplan.io logrotate prometheus prometheus-node-exporter prometheus-alertmanager openssh-server openssh-client rsync iputils-ping sudo iproute2 util-linux procps curl python3-venv npm nftables nginx docker.io docker-registry debootstrap busybox-static openssl gcc libc6-dev)

log() { printf '%s %s: %s\n' "$(date -u +%H:%M:%S)" "$(basename "$0")" "$*"; }

missing_debian_packages() {
  local pkg
  for pkg in "${DEBIAN_PACKAGES[@]}"; do
    if [ "$pkg" = npm ] && command -v npm >/dev/null; then continue; fi
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || echo "$pkg"
  done
}

install_debian_packages() {
  local missing
  mapfile -t missing < <(missing_debian_packages)
  [ "${#missing[@]}" -eq 0 ] && return 0
  log "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  # no service may start here (nginx's package would listen on port 80): the tests run the
  # daemons themselves
  local policy=/usr/sbin/policy-rc.d had_policy=yes
  [ -e "$policy" ] || { had_policy=no; printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod 755 "$policy"; }
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
  [ "$had_policy" = yes ] || rm -f "$policy"
}

# The serving image's group for vLLM's socket (launch/serving-image/Dockerfile): the gateway
# tests and the simulated nodes run nginx and vLLM's stand-in on this machine's own root.
ensure_api_socket_group() {
  local name gid
  read -r name gid < <(python3 -c 'from core import contract as c; print(c.API_SOCKET_GROUP, c.API_SOCKET_GID)')
  getent group "$name" >/dev/null || groupadd --gid "$gid" "$name"
}

install_python_env() {
  if [ ! -x .venv/bin/python ]; then
    log "creating .venv"
    python3 -m venv .venv
  fi
  if ! cmp -s requirements-dev.txt .venv/.installed-requirements 2>/dev/null \
     || ! cmp -s requirements.lock .venv/.installed-lock 2>/dev/null; then
    log "installing requirements-dev.txt into .venv (uv $UV_VERSION)"
    # uv rather than pip: from its cache (~/.cache/uv) a fresh clone's .venv fills in seconds,
    # where pip took 45 s unpacking the same wheels (ray's most of all) on every CI run.
    # --compile-bytecode, as pip does: uv writes no .pyc by default, and where PYTHONDONTWRITEBYTECODE
    # is set (this CI machine) no process writes one either, so every process that imports Ray or
    # Pulumi compiled them again (`import ray, pulumi, grpc`: 1.4 s without, 0.5 s with; the unit
    # stage ~90 s slower on a fresh clone than in a pip-made .venv)
    .venv/bin/pip install -q --disable-pip-version-check "uv==$UV_VERSION"
    # -c requirements.lock: the operator's packages at the versions an owner's venv gets (README step 1)
    .venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python -r requirements-dev.txt -c requirements.lock
    cp requirements-dev.txt .venv/.installed-requirements
    cp requirements.lock .venv/.installed-lock
  fi
  # `.venv/bin/twinspark`: this checkout's tools as they are edited (scripts/sim.sh env puts it on PATH).
  # Written here, not `pip install -e .`: hatchling copies force-included trees into an editable wheel
  # too, which would leave a stale second copy of ops/, core/... in site-packages
  printf '#!/bin/sh\nexec "%s/.venv/bin/python" -c "import sys; sys.path.insert(0, sys.argv.pop(1)); from twinspark.cli import main; sys.exit(main())" "%s" "$@"\n' \
    "$PWD" "$PWD" >.venv/bin/twinspark
  chmod 755 .venv/bin/twinspark
}

# install_npm_cli PACKAGE VERSION DIR BIN: an agent's CLI from npm into build/DIR, once
install_npm_cli() {
  [ -x "build/$3/node_modules/.bin/$4" ] && return 0
  log "installing $1@$2 into build/$3"
  mkdir -p "build/$3"
  npm install --silent --no-audit --no-fund --prefix "build/$3" "$1@$2" >/dev/null
}

# the agents the tests run for real against the stand-in endpoint
install_agent_clis() {
  install_npm_cli @openai/codex "$CODEX_VERSION" codex codex
  install_npm_cli @anthropic-ai/claude-code "$CLAUDE_CODE_VERSION" claude claude
}

setup_machine() {
  install_debian_packages
  ensure_api_socket_group
  install_python_env
  install_agent_clis
}
