#!/usr/bin/env bash
# locked-install.sh — what the serving image adds to its pinned base, every package locked
# (run by the Dockerfile, once, on the head):
#
#   locked-install.sh LOCK_FILE 'nginx=1.22.1-9+deb12u11 nginx-common=1.22.1-9+deb12u11' GROUP GID
#
# - Python: `pip install --require-hashes -r LOCK_FILE` (ray-requirements.lock). A requirement
#   the base already holds at the locked version is taken as it is (pip fetches nothing for
#   it); any other is downloaded and must match one of the lock's hashes.
# - apt: each package at the exact version given (serving.aptPackages). apt installs a package
#   already there at that version without a package list, so an offline base with empty
#   sources (the simulator's) builds too.
# Refused, naming the packages: a lock that would change a package the base holds (vLLM's
# own dependencies stay the base's), and apt pulling in any package not given at a version.
set -euo pipefail

lock=$1 apt_packages=$2 group=$3 gid=$4

die() { echo "locked-install: ERROR: $*" >&2; exit 1; }

python_packages() { python3 -m pip list --disable-pip-version-check --format=freeze | LC_ALL=C sort; }
debian_packages() { dpkg-query -W -f '${Package}=${Version}\n' | LC_ALL=C sort; }

python_locked() {
  local before after changed
  before=$(python_packages)
  python3 -m pip install --no-cache-dir --disable-pip-version-check --require-hashes -r "$lock"
  after=$(python_packages)
  changed=$(LC_ALL=C comm -23 <(printf '%s\n' "$before") <(printf '%s\n' "$after"))
  [ -z "$changed" ] || die "the lock $(basename "$lock") changes what the base holds: $(echo "$changed" | tr '\n' ' ')— \
compile the lock against the base's packages (its header: uv pip compile ... --constraint)"
}

apt_locked() {
  local before after added wanted
  # shellcheck disable=SC2086  # one word per package=version
  wanted=$(printf '%s\n' $apt_packages | LC_ALL=C sort)
  before=$(debian_packages)
  apt-get update
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $apt_packages
  rm -rf /var/lib/apt/lists/*
  after=$(debian_packages)
  added=$(LC_ALL=C comm -13 <(printf '%s\n' "$before") <(printf '%s\n' "$after") |
    LC_ALL=C comm -23 - <(printf '%s\n' "$wanted"))
  [ -z "$added" ] || die "apt installed packages not given at a version: $(echo "$added" | tr '\n' ' ')— add them \
to serving.aptPackages as NAME=VERSION"
}

python_locked
apt_locked
groupadd --gid "$gid" "$group"
