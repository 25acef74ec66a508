#!/usr/bin/env bash
# locked-install.sh — what the serving image adds to its pinned base, every package locked
# (run by the Dockerfile, once, on the head):
#
#   locked-install.sh LOCK_FILE 'nginx=1.22.1-9+deb12u11 nginx-common=1.22.1-9+deb12u11' GROUP GID LOADER_LOCK
#
# - Python: `pip install --require-hashes -r LOCK_FILE` (ray-requirements.lock). A requirement
#   the base already holds at the locked version is taken as it is (pip fetches nothing for
#   it); any other is downloaded and must match one of the lock's hashes.
# - the weight loaders (LOADER_LOCK, loader-requirements.lock: core/loaders.py's packages): each one
#   the base does not hold, from the lock with its hashes and --no-deps (their requirements are
#   vLLM's own, torch and numpy: the base's stay). One the base holds is kept at its version: it is
#   vLLM's choice, matched to the vLLM it runs with.
# - apt: each package at the exact version given (serving.aptPackages). apt installs a package
#   already there at that version without a package list, so an offline base with empty
#   sources (the simulator's) builds too.
# Refused, naming the packages: a lock that would change a package the base holds (vLLM's
# own dependencies stay the base's), and apt pulling in any package not given at a version.
set -euo pipefail

lock=$1 apt_packages=$2 group=$3 gid=$4 loader_lock=$5

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

# the lock's requirement blocks (NAME==VERSION and its --hash lines) whose distribution is not installed
missing_from_base() {
  python3 - "$1" <<'EOF'
import importlib.metadata
import re
import sys

for block in re.split(r"\n(?=\S)", open(sys.argv[1]).read()):
    name = re.match(r"([A-Za-z0-9_.-]+)==", block)
    if name:
        try:
            importlib.metadata.version(name[1])
        except importlib.metadata.PackageNotFoundError:
            print(block.strip())
EOF
}

loaders_locked() {
  local missing=/tmp/twinspark-image/loaders-missing.lock
  missing_from_base "$loader_lock" >"$missing"
  [ -s "$missing" ] || return 0
  python3 -m pip install --no-cache-dir --disable-pip-version-check --no-deps --require-hashes -r "$missing"
}

python_locked
loaders_locked
apt_locked
groupadd --gid "$gid" "$group"
