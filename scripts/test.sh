#!/usr/bin/env bash
# scripts/test.sh — install what the tests need (Debian/Ubuntu, as root) and run them.
#
#   sudo ./scripts/test.sh                   # everything: the rest in 4 processes, then the simulator
#   sudo ./scripts/test.sh -k fabric         # extra arguments go to pytest (both runs)
#   sudo ./scripts/test.sh tests/sim_engine -k renamed # a path: just that, in one process
#
# Installs only what is missing (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/setup.sh
. scripts/setup.sh

main() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "run as root (sudo): the tests install Debian packages and build network namespaces" >&2
    exit 2
  fi
  setup_machine
  # the Pulumi engine the engine tests and the engine-driven simulator run (scripts/engine.sh:
  # built once into a cache outside the repository, tens of minutes cold, seconds warm)
  log "building the Pulumi engine where missing (scripts/engine.sh)"
  ./scripts/engine.sh build >/dev/null
  local arg
  for arg in "$@"; do  # a path given: run just that, as asked
    if [ -e "${arg%%::*}" ]; then
      log "running pytest $*"
      exec .venv/bin/python -m pytest "$@"
    fi
  done
  # Everything: the tests outside the simulator in 4 processes (they mostly wait on
  # subprocesses; a file's tests stay in one process, so a file's fixed ports and namespaces
  # never meet their own twins), then the simulator alone — one at a time on a machine, and
  # its timings are figures.
  log "running pytest: everything but the simulator (4 processes)"
  run_pytest tests --ignore=tests/sim_engine -n 4 --dist loadfile "$@"
  log "running pytest: the simulator under the real engine (pulumi up --stack sim)"
  run_pytest tests/sim_engine --durations=20 "$@"  # the slowest scenarios, for the CI time
}

# pytest, where "no test selected" (exit 5: a -k that only matches in the other run) is no failure
run_pytest() {
  local rc=0
  .venv/bin/python -m pytest "$@" || rc=$?
  [ "$rc" -eq 5 ] && rc=0
  return "$rc"
}

main "$@"
