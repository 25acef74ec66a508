# prelude.sh — what every twinspark script shares: logging, errors, flags, cleanup, payloads.
# The script runner sends it ahead of each script; a script run by hand sources it from its
# own directory; the boot scripts source it from the bundle.
# shellcheck shell=bash

# shellcheck disable=SC2034  # read by the scripts, to source this file only once
TWINSPARK_PRELUDE=1
script_name=${TWINSPARK_SCRIPT:-$(basename "$0")}
script_name=${script_name%.sh}
log_node=""  # set by a script once it knows the node it speaks for
log_step=""  # and the step of `pulumi up` it is, where that differs from the script

log() { printf '%s %s%s: %s\n' "$(date -u +%H:%M:%S)" "$script_name" "${log_node:+ $log_node}" "$*"; }
# A failure of the step: exit 1 with the reason on stderr.
die() { log "ERROR: $*" >&2; exit 1; }
# A mistake in how the script was called: exit 2.
usage_error() { log "usage error: $*" >&2; exit 2; }
# Any other failing command names the step that failed (pulumi-command adds the output tail).
set -E
trap 'log "step ${log_step:-$script_name} failed (exit $?)" >&2; trap - ERR' ERR

# ---- cleanup: paths registered here are removed on exit, whatever the exit ------------------
cleanup_paths=()
cleanup_hooks=()
run_cleanup() {
  local hook
  for hook in "${cleanup_hooks[@]}"; do "$hook" || true; done
  if [ "${#cleanup_paths[@]}" -gt 0 ]; then rm -rf -- "${cleanup_paths[@]}"; fi
}
trap run_cleanup EXIT
# make_temp VAR: a private temporary file, removed on exit, its path in VAR
make_temp() {
  local path
  path=$(mktemp)
  cleanup_paths+=("$path")
  printf -v "$1" '%s' "$path"
}
on_exit() { cleanup_hooks+=("$1"); }
# read_payload VAR WHAT: the rest of stdin (a file the runner sends after the script) into a
# private temporary file, its path in VAR
read_payload() {
  make_temp "$1"
  cat >"${!1}"
  [ -s "${!1}" ] || usage_error "$2 must follow the script on stdin"
}

# ---- flags: parse_flags --flag=var [--many=var[]] ... -- "$@" --------------------------------
# Every flag takes one value; a var ending in [] collects repeated flags into an array.
declare -A flag_vars=()
parse_flags() {
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    flag_vars[${1%%=*}]=${1#*=}
    shift
  done
  [ $# -gt 0 ] && shift
  local flag var
  while [ $# -gt 0 ]; do
    flag=$1
    var=${flag_vars[$flag]:-}
    [ -n "$var" ] || usage_error "unknown argument '$flag' (expected: ${!flag_vars[*]})"
    [ $# -ge 2 ] || usage_error "$flag needs a value"
    if [[ $var == *'[]' ]]; then
      eval "${var%[]}+=(\"\$2\")"
    else
      printf -v "$var" '%s' "$2"
    fi
    shift 2
  done
}
# require_flags --flag...: each named flag was given a non-empty value
require_flags() {
  local flag var
  for flag; do
    var=${flag_vars[$flag]%[]}
    if [[ ${flag_vars[$flag]} == *'[]' ]]; then
      eval "[ \${#${var}[@]} -gt 0 ]" || usage_error "$flag is required"
    else
      [ -n "${!var:-}" ] || usage_error "$flag is required"
    fi
  done
}
