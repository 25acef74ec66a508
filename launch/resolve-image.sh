#!/usr/bin/env bash
# resolve-image.sh — resolve an image tag to the digest the registry serves now, once: the
# `image-pin-resolve` step, whose output the stack keeps until serving.image changes or the
# step is replaced on purpose (docs/operating.md: "Pinned image").
#
#   resolve-image.sh --image ghcr.io/owner/image:1.2.3 --platform linux/arm64
#
# Pulls the tag on this node's docker for the platform, then prints the digest the registry
# named for it (the repository's entry in RepoDigests) as the last line: sha256:<64 hex>.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=prelude.sh
[ -n "${TWINSPARK_PRELUDE:-}" ] || . "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"

image="" platform=""

main() {
  parse_flags --image=image --platform=platform -- "$@"
  require_flags --image --platform
  [[ $image != *@* ]] || usage_error "--image is already pinned ('$image'): nothing to resolve"
  local repo=$image digests digest="" line
  # the tag follows the last ':' after the last '/' (a registry's port comes before a '/')
  if [[ ${image##*/} == *:* ]]; then repo=${image%:*}; fi
  docker pull --quiet --platform "$platform" "$image" >&2
  digests=$(docker image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "$image")
  while IFS= read -r line; do
    if [[ -z $digest && $line == "$repo@"* ]]; then digest=${line#"$repo@"}; fi
  done <<< "$digests"
  # docker names docker.io images in their short form (ubuntu@..., not docker.io/library/ubuntu@...)
  if [[ -z $digest && $(grep -c @ <<< "$digests") == 1 ]]; then digest=${digests#*@}; fi
  [[ $digest =~ ^sha256:[0-9a-f]{64}$ ]] ||
    die "$image: docker names no registry digest for $repo (RepoDigests: $(printf '%s' "$digests" | tr '\n' ' '))"
  printf '%s\n' "$digest"
}

main "$@"
