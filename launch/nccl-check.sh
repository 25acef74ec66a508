#!/usr/bin/env bash
# nccl-check.sh — run this node's rank of the NCCL all-reduce check in a throwaway container
# of the serving image, with the serving containers' docker options and environment.
#
#   nccl-check.sh --node spark1 --image sha256:... --env-file /opt/twinspark/twinspark.env \
#       --container twinspark-nccl-check --timeout-s 1200 --docker-flag --network --docker-flag host ... \
#       --check-arg --rank --check-arg 0 ...   < nccl-allreduce-check.py
#
# The check program arrives on stdin (after this script, from the runner) and goes on to
# `python3 -` inside the container.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=prelude.sh
[ -n "${TWINSPARK_PRELUDE:-}" ] || . "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"

node="" image="" env_file="" container="" timeout_s=""
docker_flags=()
check_args=()

main() {
  parse_flags --node=node --image=image --env-file=env_file --container=container --timeout-s=timeout_s \
    --docker-flag=docker_flags[] --check-arg=check_args[] -- "$@"
  require_flags --node --image --env-file --container --timeout-s
  log_node=$node
  docker rm -f "$container" >/dev/null 2>&1 || true
  timeout "$timeout_s" docker run --rm -i --name "$container" "${docker_flags[@]}" --env-file "$env_file" \
    --entrypoint python3 "$image" - "${check_args[@]}"
}

main "$@"
