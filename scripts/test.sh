#!/usr/bin/env bash
# scripts/test.sh — install what the tests need (Debian/Ubuntu, as root) and run them.
#
#   sudo ./scripts/test.sh                   # everything (what CI runs): stages below, a time table at the end
#   sudo ./scripts/test.sh -k fabric         # extra arguments go to pytest (every run)
#   sudo ./scripts/test.sh tests/sim_engine -k renamed # a path: just that, in one process
#   ./scripts/test.sh --quick                # a contributor's loop: no root, no namespaces, no engine
#
# The stages of a whole run (docs/testing.md, "CI"):
#   engine     the Pulumi engine from Go modules (scripts/engine.sh; tens of minutes cold, seconds
#              cached), started first, in the background, niced: it needs only Go
#   setup      Debian packages, .venv, the Codex CLI (scripts/setup.sh), beside the engine
#   unit       cold: every test that needs neither the engine, a quiet machine nor the simulator, 4
#              processes, beside the engine
#   engine-tests  cold: the engine's own tests (tests/test_engine_*.py) and the quiet ones, once it is built
#   unit-before  warm (the engine built when setup ends): what needs root, the engine or a quiet machine
#   simulator  tests/sim_engine, two clusters side by side (two workers, each a site of its own)
#   unit-beside  warm: the rest of the unit tests beside the simulator: the paced ones in a process, the
#              others in 2 yielding to it
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/setup.sh
. scripts/setup.sh

# mypy's incremental cache beside the engine's, not in the checkout: in a fresh clone
# tests/test_lint.py checked its 94 files cold (~30 CPU-s; ~1 from the kept cache). mypy reuses an
# entry only where the file's hash still matches, so another commit's cache is safe.
export MYPY_CACHE_DIR=${MYPY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/twinspark-mypy}
# Python's bytecode cache in the checkout (__pycache__, ignored by git) whatever the caller's
# environment says: with PYTHONDONTWRITEBYTECODE set, each of a run's ~13 pytest processes rewrote
# and compiled every test module again (a collection of the unit tests: 10.3 CPU-s, 3.6 from the
# cache) and each run of the program compiled the project's modules again.
unset PYTHONDONTWRITEBYTECODE

ENGINE_LOG=build/engine-build.log
ENGINE_DONE=build/engine-build.done
UNIT_BESIDE_LOG=build/unit-beside-simulator.log
PACED_BESIDE_LOG=build/paced-beside-simulator.log
QUIET_LOG=build/quiet-tests.log
# tests/conftest.py's markers: what a cold run holds back for the engine, what a warm run runs before
# the simulator (the quiet tests go with them, beside them: with_the_quiet_tests); everything else is
# run beside the one or the other
AFTER_THE_ENGINE="engine"
BEFORE_THE_SIMULATOR="root or engine"
STAGES=()  # "name seconds" per stage, printed at the end
PACE_AT_START=""  # dev/pace.py's line before a root run's first stage
CPU_MARK=build/cpu-at-start  # /proc/stat then: the cores' busy and stolen shares over the run

# name command...: run a stage, timed
stage() {
  local name=$1 start rc=0
  shift
  start=$(date +%s)
  "$@" || rc=$?
  STAGES+=("$name $(($(date +%s) - start))")
  return "$rc"
}

# the stages' seconds, one line each, and the whole run's: the figures docs/testing.md's CI table keeps
stage_table() {
  local line name seconds
  [ "${#STAGES[@]}" -gt 0 ] || return 0
  printf '\n%-14s %8s\n' stage seconds
  for line in "${STAGES[@]}"; do
    read -r name seconds <<<"$line"
    printf '%-14s %8s\n' "$name" "$seconds"
  done
  printf '%-14s %8s\n' total $(($(date +%s) - RUN_STARTED))
  # the machine's pace at the start and now (dev/pace.py): minutes compare only beside it
  [ -z "$PACE_AT_START" ] || printf '%s (start)\n%s (end)\n%s\n' "$PACE_AT_START" "$(python3 dev/pace.py build)" \
    "$(python3 dev/pace.py --cpu-since "$CPU_MARK")"
}

# COMMAND...: at the lowest priority, in a session of its own. The kernel shares the cores between
# sessions (autogroups) before it looks at nice, so a plain `nice` in this script's session would
# yield only to this session's processes, not to the simulated nodes' daemons and containers.
yielding() {
  setsid -w bash -c 'echo 19 >/proc/self/autogroup 2>/dev/null || true; exec nice -n 19 "$@"' yielding "$@"
}

# COMMAND...: ahead of everything else, in a session of its own (as root; otherwise at the run's own
# priority): the quiet tests, whose figures are the machine's pace, mostly sleep, and when they wake
# take the cores before the tests beside them (the bench gate's identical runs were 17 % apart at
# c=2 when they waited their turn behind four busy processes on a slow box: b2ae1ea's rehearsal).
ahead() {
  setsid -w bash -c 'echo -10 >/proc/self/autogroup 2>/dev/null || true; exec nice -n -10 "$@"' ahead "$@"
}

# [--yielding|--ahead] pytest args...: pytest, where "no test selected" (exit 5: a -k that only matches
# in the other run) is no failure
run_pytest() {
  local rc=0 runner=()
  if [ "${1:-}" = --yielding ]; then
    shift
    runner=(yielding)
  elif [ "${1:-}" = --ahead ]; then
    shift
    runner=(ahead)
  fi
  "${runner[@]}" .venv/bin/python -m pytest "$@" || rc=$?
  [ "$rc" -eq 5 ] && rc=0
  return "$rc"
}

# the engine's build in the background; wait_for_engine reaps it and shows its log's tail on failure
ENGINE_PID=
start_engine_build() {
  mkdir -p build
  log "building the Pulumi engine where missing (scripts/engine.sh, log: $ENGINE_LOG)"
  # its own process group (setsid), so that a run that stops early stops its go builds too
  # its end time in a file: the stage's own seconds, not the time the run waited for it
  rm -f "$ENGINE_DONE"
  # shellcheck disable=SC2016 # $1 and $rc are the inner shell's
  setsid bash -c './scripts/engine.sh build; rc=$?; date +%s >"$1"; exit "$rc"' engine "$ENGINE_DONE" \
    >"$ENGINE_LOG" 2>&1 &
  ENGINE_PID=$!
  ENGINE_STARTED=$(date +%s)
}

wait_for_engine() {
  local rc=0
  wait "$ENGINE_PID" || rc=$?
  STAGES+=("engine $(($(cat "$ENGINE_DONE" 2>/dev/null || date +%s) - ENGINE_STARTED))")
  ENGINE_PID=
  if [ "$rc" -ne 0 ]; then
    log "the engine's build failed (rc=$rc); the end of $ENGINE_LOG:"
    tail -40 "$ENGINE_LOG" >&2
    return "$rc"
  fi
}

quick() {
  # everything that needs no root, no network namespace, no engine and no simulator; the
  # markers are tests/conftest.py's (a file that needs root is listed there)
  install_python_env  # and the Codex CLI, which two tests run: neither needs root
  install_agent_clis
  log "running pytest: the quick loop (no root, no namespaces, no engine), 2 processes"
  stage quick run_pytest tests -m "not root and not engine and not simulator" -n 2 --dist loadfile "$@"
}

# on any exit: an engine build still running goes with the run (a failed stage stops everything)
on_exit() {
  if [ -n "$ENGINE_PID" ] && kill -0 "$ENGINE_PID" 2>/dev/null; then
    kill -- "-$ENGINE_PID" 2>/dev/null || true
  fi
  stage_table
}

main() {
  RUN_STARTED=$(date +%s)
  trap on_exit EXIT
  if [ "${1:-}" = --quick ]; then
    shift
    quick "$@"
    return
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "run as root (sudo): the tests install Debian packages and build network namespaces" >&2
    echo "(./scripts/test.sh --quick runs the tests that need neither, as any user)" >&2
    exit 2
  fi
  mkdir -p build
  PACE_AT_START=$(python3 dev/pace.py build)
  python3 dev/pace.py --cpu-mark "$CPU_MARK"
  start_engine_build
  stage setup setup_machine
  local arg
  for arg in "$@"; do  # a path given: run just that, as asked
    if [ -e "${arg%%::*}" ]; then
      wait_for_engine
      log "running pytest $*"
      stage pytest run_pytest "$@"
      return
    fi
  done
  # Beside the engine's build: the tests outside the simulator that do not need the engine, in 4
  # processes (they mostly wait on subprocesses; a file's tests stay in one process, so a file's
  # fixed ports and namespaces never meet their own twins). More are no faster: 6 took 303 s
  # against 4's 312, the cores 96 % busy (docs/testing.md, "Session of 2026-12-04, evening").
  local rc=0
  if [ ! -e "$ENGINE_DONE" ]; then
    log "running pytest: everything but the engine's tests, the quiet ones and the simulator (4 processes), beside the engine's build"
    stage unit run_pytest tests --ignore=tests/sim_engine -m "not ($AFTER_THE_ENGINE or quiet)" -n 4 --dist loadfile \
      --durations=20 "$@" || return  # at once: the engine's build goes with the run (on_exit)
    wait_for_engine
    log "running pytest: the engine's own tests (3 processes), the quiet ones beside them"
    stage engine-tests with_the_quiet_tests "$AFTER_THE_ENGINE" 3 "$@" || return
    simulator "$@"
    return
  fi
  # An engine already built when setup ends (a warm run: seconds): nothing to hide the unit stage
  # behind but the simulator, whose two clusters leave ~20 % of the cores idle (waits on boots,
  # guard rounds, Ray). Before it, what may not run beside it (tests/conftest.py's `root`:
  # namespaces, nft, daemons, the sim's images; `quiet`: figures of the machine's pace) and the
  # engine's own tests; beside it, the rest: the `paced` ones (they wait on the clock) in a process
  # at normal priority (ahead of it, their bursts starved the simulator's own 6 s grace: the
  # rehearsal of b74b45b), the others in 2 yielding to it, filling the cores it leaves idle: the
  # simulator's two clusters are the run's critical path.
  wait_for_engine
  log "running pytest: what needs root or the engine (4 processes), the quiet tests beside them, before the simulator"
  stage unit-before with_the_quiet_tests "$BEFORE_THE_SIMULATOR" 4 "$@" || return
  log "running pytest: the rest outside the simulator beside it, logs: $PACED_BESIDE_LOG, $UNIT_BESIDE_LOG"
  local paced_pid unit_pid unit_started
  unit_started=$(date +%s)
  run_pytest tests --ignore=tests/sim_engine -m "paced and not ($BEFORE_THE_SIMULATOR or quiet)" --durations=10 "$@" \
    >"$PACED_BESIDE_LOG" 2>&1 &
  paced_pid=$!
  run_pytest --yielding tests --ignore=tests/sim_engine -m "not ($BEFORE_THE_SIMULATOR or quiet or paced)" -n 2 \
    --dist loadfile --durations=10 "$@" >"$UNIT_BESIDE_LOG" 2>&1 &
  unit_pid=$!
  simulator "$@" || rc=$?
  local paced_rc=0 unit_rc=0
  wait "$paced_pid" || paced_rc=$?
  wait "$unit_pid" || unit_rc=$?
  STAGES+=("unit-beside $(($(date +%s) - unit_started))")
  log "the paced tests beside the simulator (rc=$paced_rc), the end of $PACED_BESIDE_LOG:"
  tail -15 "$PACED_BESIDE_LOG"
  log "the tests yielding to it (rc=$unit_rc), the end of $UNIT_BESIDE_LOG:"
  tail -15 "$UNIT_BESIDE_LOG"
  [ "$rc" -eq 0 ] || return "$rc"
  [ "$paced_rc" -eq 0 ] || return "$paced_rc"
  return "$unit_rc"
}

# MARKS PROCESSES [pytest args...]: the tests outside the simulator marked MARKS, and beside them the
# quiet ones (tests/conftest.py) in a pytest of their own, a process a test. In one pytest they
# started last (xdist hands out the files with the most selected tests first): the bench gate's
# 200 s began at the 90th second. They mostly sleep at a Spark's pace, so 3 or 4 busy processes
# beside them leave it; the simulator or the engine's Go build did not.
with_the_quiet_tests() {
  local marks=$1 processes=$2 quiet_pid rc=0 quiet_rc=0
  shift 2
  run_pytest --ahead tests --ignore=tests/sim_engine -m quiet -n 6 --dist load --durations=8 "$@" >"$QUIET_LOG" 2>&1 &
  quiet_pid=$!
  run_pytest tests --ignore=tests/sim_engine -m "($marks) and not quiet" -n "$processes" --dist loadfile --durations=10 "$@" ||
    rc=$?
  wait "$quiet_pid" || quiet_rc=$?
  log "the quiet tests beside them (rc=$quiet_rc), the end of $QUIET_LOG:"
  tail -8 "$QUIET_LOG"
  [ "$rc" -eq 0 ] || return "$rc"
  return "$quiet_rc"
}

# the simulator as two clusters side by side (tests/sim_engine/conftest.py: each worker its own
# site, the files split by cluster): nothing that builds namespaces or daemons beside them
simulator() {
  log "running pytest: the simulator under the real engine (pulumi up --stack sim), two clusters"
  stage simulator run_pytest tests/sim_engine -n 2 --dist loadscope --durations=20 "$@"  # the slowest, for the CI time
}

main "$@"
