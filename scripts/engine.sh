#!/usr/bin/env bash
# scripts/engine.sh — the Pulumi engine, built here from the Go module proxy, into a cache
# outside the repository (issue 20, part 1).
#
#   scripts/engine.sh build [COMPONENT...]  # build what is missing (cli langhost command random docker)
#   scripts/engine.sh env                   # print the exports that put the engine on PATH
#   scripts/engine.sh versions              # print what is built and installed
#   scripts/engine.sh status                # ready/missing per component; exit 3 if any is missing
#   scripts/engine.sh smoke                 # a tiny Pulumi Python project: up, then up again (no changes)
#   scripts/engine.sh install-provider NAME VERSION BIN  # a provider had elsewhere, kept by build
#   scripts/engine.sh install-engine DIR    # a Pulumi release's CLI and language host, kept by build
#
# Everything lands in $TWINSPARK_ENGINE_CACHE (default ~/.cache/twinspark-engine), one folder
# per component and version, reused across runs; a component whose version (or recipe) changes
# gets a new folder and is built again. Plugins are installed into $TWINSPARK_ENGINE_CACHE/home,
# the PULUMI_HOME that `env` exports, so that nothing is ever downloaded: automatic plugin
# acquisition is off.
#
# What the module proxy serves decides what can be built (the measurements in
# docs/measurements/engine-build-*.md say what was tried):
# - cli: github.com/pulumi/pulumi/pkg/v3 cmd/pulumi, built in a wrapper module that requires
#   pkg/v3 and sdk/v3 at one version and carries pkg's non-relative replaces.
# - langhost: the real Python language host (module
#   github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3, untagged) is not served at
#   any version or commit, so a stand-in of ours (dev/engine/pulumi-language-python) is built
#   against sdk/v3 at the CLI's version and sits beside that sdk/v3's own
#   pulumi-language-python-exec.
# - command, random: their provider modules are refused at every version, commit and
#   pseudo-version, so stand-ins of ours (dev/engine/providers/command, .../random) are built
#   instead, at the versions the SDKs request: command on pulumi-go-provider v1.3.0 and sdk/v3
#   v3.224.0 (what pulumi-command v1.2.1 itself builds on), random on the same; each serves only
#   the resources twinspark uses (their main.go says which).
# - docker: pulumi-docker's module is refused too, so pulumi-resource-docker v5.2.0 is our own
#   (dev/engine/providers/docker): kreuzwerker's provider (served) bridged with
#   pulumi-terraform-bridge v3.120.0 (served), a native Image, one hybrid server; its schema is
#   generated at build time by the bridge's tfgen. Keyed by version and source hash.
# A provider had elsewhere wins over the stand-in: `scripts/engine.sh install-provider NAME
# VERSION BIN` installs it and records its sha256 (in $CACHE/installed), and `build` adopts the
# providers a user's own Pulumi has at these versions (its PULUMI_HOME, default ~/.pulumi) the
# same way; `build` never replaces a recorded binary, and `status` and `versions` say per
# component which one runs (installed, from where, or stand-in), with its sha256. The CLI and the
# language host likewise: `install-engine DIR` (a Pulumi release's folder: pulumi,
# pulumi-language-python, pulumi-language-python-exec) copies and records them, and `build`
# adopts the folder of a user's own `pulumi` on PATH; neither is then built.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)

# The CLI: the pulumi SDK in requirements.txt is 3.272.0, the newest on PyPI; the proxy does
# not serve pkg/v3 v3.272.0 (nor v3.273.0) but serves v3.274.1, the nearest newer one. A CLI
# newer than the SDK is supported.
PULUMI_CLI_VERSION=3.274.1
# the oldest CLI the Python SDK works with: the SDK's own version (requirements.txt)
PULUMI_SDK_VERSION=$(sed -n 's/^pulumi==//p' "$ROOT/requirements.txt")
# The providers at the versions the Python SDKs in requirements.txt request (their
# pulumi-plugin.json); command and random are our stand-ins, reporting these versions.
COMMAND_VERSION=1.2.1
RANDOM_VERSION=4.21.4
DOCKER_VERSION=5.2.0
# pulumi-docker's provider module is refused; ours builds from the proxy's kreuzwerker module,
# whose go.mod names it github.com/terraform-providers/terraform-provider-docker
DOCKER_SRC=$ROOT/dev/engine/providers/docker
DOCKER_UPSTREAM_MODULE=github.com/kreuzwerker/terraform-provider-docker
DOCKER_UPSTREAM_VERSION=v0.0.0-20260916201441-96d331c98ff4
DOCKER_UPSTREAM_PATH=github.com/terraform-providers/terraform-provider-docker

CACHE=${TWINSPARK_ENGINE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/twinspark-engine}
LANGHOST_SRC=$ROOT/dev/engine/pulumi-language-python
STANDIN_SRC=$ROOT/dev/engine/providers

log() { printf '%s engine.sh: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "$*"; exit 1; }

# Go, as the releases build it: no cgo, only the module proxy, nice to the colleagues' tests.
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=${GOTOOLCHAIN:-local}
export GOPROXY=${GOPROXY:-https://proxy.golang.org}
go_() { nice -n 19 go "$@"; }

cli_dir() { echo "$CACHE/cli-v$PULUMI_CLI_VERSION"; }
# keyed by the sdk/v3 version and by the stand-in's source and recipe (a rebuild takes seconds)
langhost_dir() {
  echo "$CACHE/langhost-v$PULUMI_CLI_VERSION-$({ cat "$LANGHOST_SRC/main.go"; declare -f build_langhost; } |
    sha256sum | cut -c1-12)"
}
provider_dir() { echo "$CACHE/provider-$1-v$2"; }
# a stand-in: keyed by its version and by its source (go.mod and go.sum included) and recipe
standin_dir() {
  echo "$CACHE/provider-$1-v$2-$({ (cd "$STANDIN_SRC/$1" && find . -type f -print0 | LC_ALL=C sort -z |
    xargs -0 sha256sum); declare -f build_standin; } | sha256sum | cut -c1-12)"
}

# Seconds per component, appended to $CACHE/timings.tsv (component, version, seconds, date).
timed() {
  local name=$1 version=$2 start rc=0
  shift 2
  start=$(date +%s)
  "$@" || rc=$?
  local secs=$(( $(date +%s) - start ))
  printf '%s\tv%s\t%s\t%s\trc=%s\n' "$name" "$version" "$secs" "$(date -u +%FT%TZ)" "$rc" >>"$CACHE/timings.tsv"
  log "$name v$version: ${secs}s (rc=$rc)"
  return "$rc"
}

# The wrapper module: requires pkg/v3 and sdk/v3 at one version and copies pkg's replaces that
# are not relative paths (go install pkg@version refuses a module with replaces).
write_wrapper_module() {
  local dir=$1 v=v$PULUMI_CLI_VERSION pkgmod replaces
  mkdir -p "$dir"
  pkgmod=$(cd "$dir" && go_ mod download -json "github.com/pulumi/pulumi/pkg/v3@$v" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])') || return 1
  replaces=$(go mod edit -json "$pkgmod" | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    new = r["New"]
    if new["Path"].startswith((".", "/")):
        continue  # relative: the monorepo sdk/, which the require below stands for
    old = r["Old"]["Path"] + ("@" + r["Old"]["Version"] if r["Old"].get("Version") else "")
    print("replace %s => %s %s" % (old, new["Path"], new.get("Version", "")))') || return 1
  cat >"$dir/go.mod" <<EOF
module twinspark.local/engine

go 1.26

require (
	github.com/pulumi/pulumi/pkg/v3 $v
	github.com/pulumi/pulumi/sdk/v3 $v
)

$replaces
EOF
}

# Each build writes DIR.tmp; DIR appears, whole, only once FILE is in it (set -e does not hold
# inside the builds: they run on the left of a ||).
publish() {
  local out=$1 file=$2
  [ -x "$out.tmp/$file" ] || { log "$out.tmp/$file was not built"; return 1; }
  rm -rf "$out" && mv "$out.tmp" "$out"
}

build_cli() {
  local out src v=v$PULUMI_CLI_VERSION
  out=$(cli_dir)
  [ -x "$out/pulumi" ] && return 0
  src=$CACHE/src/cli-$v
  rm -rf "$src" "$out.tmp"
  write_wrapper_module "$src" || return 1
  (
    cd "$src" &&
      go_ get "github.com/pulumi/pulumi/pkg/v3/cmd/pulumi@$v" &&
      go_ build -trimpath -tags osusergo,grpcnotrace \
        -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$v" \
        -o "$out.tmp/pulumi" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi
  ) || return 1
  publish "$out" pulumi
}

build_langhost() {
  local out src v=v$PULUMI_CLI_VERSION sdkdir
  out=$(langhost_dir)
  [ -x "$out/pulumi-language-python" ] && return 0
  src=$CACHE/src/langhost-$v
  rm -rf "$src" "$out.tmp"
  # a module of its own that requires only sdk/v3, at the CLI's version (pkg/v3 is not needed)
  mkdir -p "$src/cmd/pulumi-language-python" "$out.tmp" || return 1
  printf 'module twinspark.local/engine-langhost\n\ngo 1.26\n\nrequire github.com/pulumi/pulumi/sdk/v3 %s\n' \
    "$v" >"$src/go.mod" || return 1
  cp "$LANGHOST_SRC/main.go" "$src/cmd/pulumi-language-python/" || return 1
  (
    cd "$src" &&
      go_ get "github.com/pulumi/pulumi/sdk/v3@$v" &&
      go_ build -trimpath -tags osusergo,grpcnotrace \
        -ldflags "-s -w -X main.version=$v" \
        -o "$out.tmp/pulumi-language-python" ./cmd/pulumi-language-python &&
      sdkdir=$(go_ list -m -f '{{.Dir}}' github.com/pulumi/pulumi/sdk/v3) &&
      install -m 0755 "$sdkdir/python/cmd/pulumi-language-python-exec" "$out.tmp/"
  ) || return 1
  [ -x "$out.tmp/pulumi-language-python-exec" ] || return 1
  publish "$out" pulumi-language-python
}

# A stand-in of ours, built from a copy of its source (so the build never edits the checkout)
# against its committed go.sum (-mod=readonly), then installed into PULUMI_HOME.
build_standin() {
  local name=$1 version=$2 out src
  out=$(standin_dir "$name" "$version")
  if [ ! -x "$out/pulumi-resource-$name" ]; then
    src=$CACHE/src/$name-v$version
    rm -rf "$src" "$out.tmp"
    mkdir -p "$src" "$out.tmp" || return 1
    cp -R "$STANDIN_SRC/$name/." "$src/" || return 1
    (
      cd "$src" &&
        go_ build -mod=readonly -trimpath -ldflags "-s -w -X main.version=v$version" \
          -o "$out.tmp/pulumi-resource-$name" .
    ) || return 1
    publish "$out" "pulumi-resource-$name" || return 1
  fi
  install_plugin "$name" "$version" "$out/pulumi-resource-$name"
}
build_command() { build_standin command "$COMMAND_VERSION"; }
build_random() { build_standin random "$RANDOM_VERSION"; }

# docker: our source (the files below), the kreuzwerker module copied from the module cache
# into ./upstream beside it with our shim added (go.mod's replace points there: the provider is in
# an internal package), tfgen's schema, then the provider with the schema embedded.
DOCKER_FILES=(go.mod go.sum resources.go hybrid.go image.go cmd/pulumi-resource-docker/main.go
  cmd/pulumi-tfgen-docker/main.go upstream/shim/shim.go)
docker_dir() {
  echo "$CACHE/provider-docker-v$DOCKER_VERSION-$({ (cd "$DOCKER_SRC" && cat "${DOCKER_FILES[@]}");
    echo "$DOCKER_UPSTREAM_VERSION"; declare -f build_docker; } | sha256sum | cut -c1-12)"
}
docker_installed() { echo "$CACHE/home/plugins/resource-docker-v$DOCKER_VERSION/pulumi-resource-docker"; }
# ready: this source's build is the one PULUMI_HOME holds
docker_ready() { cmp -s "$(docker_dir)/pulumi-resource-docker" "$(docker_installed)"; }

build_docker() {
  local out src upstream modpath
  out=$(docker_dir)
  if [ ! -x "$out/pulumi-resource-docker" ]; then
    src=$CACHE/src/docker-v$DOCKER_VERSION
    rm -rf "$src" "$out.tmp"
    mkdir -p "$src" "$out.tmp" || return 1
    (cd "$DOCKER_SRC" && cp --parents "${DOCKER_FILES[@]}" "$src/") || return 1
    upstream=$(cd "$CACHE" && go_ mod download -json "$DOCKER_UPSTREAM_MODULE@$DOCKER_UPSTREAM_VERSION" |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])') || return 1
    modpath=$(go mod edit -json "$upstream/go.mod" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Module"]["Path"])')
    [ "$modpath" = "$DOCKER_UPSTREAM_PATH" ] || { log "$DOCKER_UPSTREAM_MODULE names itself $modpath"; return 1; }
    cp -r "$upstream/." "$src/upstream/" && chmod -R u+w "$src/upstream" || return 1
    (
      cd "$src" &&
        go_ build -trimpath -tags no_compose -o bin/pulumi-tfgen-docker ./cmd/pulumi-tfgen-docker &&
        bin/pulumi-tfgen-docker schema --out gen --skip-docs --skip-examples >tfgen.log 2>&1 &&
        cp gen/schema.json cmd/pulumi-resource-docker/schema.json &&
        go_ build -trimpath -tags no_compose \
          -ldflags "-s -w -X twinspark.local/pulumi-docker.Version=$DOCKER_VERSION" \
          -o "$out.tmp/pulumi-resource-docker" ./cmd/pulumi-resource-docker &&
        cp gen/schema.json "$out.tmp/"
    ) || return 1
    publish "$out" pulumi-resource-docker || return 1
  fi
  # a build of other source replaces the one installed at this version
  docker_ready || rm -rf "$(dirname "$(docker_installed)")"*
  install_plugin docker "$DOCKER_VERSION" "$out/pulumi-resource-docker"
}

# A provider is ready when PULUMI_HOME holds, at that version, the binary install-provider
# recorded, or else the build of its stand-in's current source (an older stand-in is rebuilt).
provider_ready() { installed_elsewhere "$1" "$2" || standin_installed "$1" "$2"; }
# NAME VERSION: whether PULUMI_HOME holds the build of the stand-in's current source
standin_installed() {
  case $1 in
    docker) docker_ready ;;
    *) cmp -s "$(standin_dir "$1" "$2")/pulumi-resource-$1" "$(installed_plugin "$1" "$2")" ;;
  esac
}

installed_plugin() { echo "$CACHE/home/plugins/resource-$1-v$2/pulumi-resource-$1"; }
sha256_of() { sha256sum "$1" | cut -d' ' -f1; }
# NAME VERSION: the record of a provider installed from elsewhere (its sha256, then where it came from)
origin_record() { echo "$CACHE/installed/$1-v$2"; }
# whether PULUMI_HOME holds, at that version, the very binary install-provider recorded
installed_elsewhere() {
  local record bin
  record=$(origin_record "$1" "$2") bin=$(installed_plugin "$1" "$2")
  [ -f "$record" ] && [ -x "$bin" ] && [ "$(head -1 "$record")" = "$(sha256_of "$bin")" ]
}

# NAME VERSION BIN: a provider had elsewhere (built from its own source, a user's Pulumi),
# installed and recorded, so that `build` keeps it
install_provider() {
  local name=${1:-} version=${2:-} bin=${3:-} want
  case $name in
    command) want=$COMMAND_VERSION ;; random) want=$RANDOM_VERSION ;; docker) want=$DOCKER_VERSION ;;
    *) die "install-provider NAME VERSION BIN: NAME is command, random or docker, not '$name'" ;;
  esac
  [[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "install-provider $name: VERSION is like $want (no v), not '$version'"
  [[ -f $bin && -x $bin ]] || die "install-provider $name $version: '$bin' is not an executable file"
  [ -x "$(cli_bin)" ] || die "install-provider: the CLI installs the plugin: scripts/engine.sh build cli first"
  [ "$version" = "$want" ] || log "$name v$version: the Python SDK asks v$want, so the engine will not load this one"
  install_plugin "$name" "$version" "$bin" || die "install-provider $name $version: pulumi plugin install failed"
  mkdir -p "$CACHE/installed"
  printf '%s\n%s\n' "$(sha256_of "$bin")" "$(realpath "$bin")" >"$(origin_record "$name" "$version")"
  log "$name v$version: installed from $(realpath "$bin"); build keeps it"
}

# NAME VERSION: the provider a user's own Pulumi installed (`pulumi plugin install`, or its
# automatic download) at that version, adopted as install-provider would (USER_PULUMI_HOME:
# where that Pulumi keeps its plugins, default ~/.pulumi)
adopt_users_provider() {
  local name=$1 version=$2 home=${USER_PULUMI_HOME:-$HOME/.pulumi} bin
  [ "$(realpath -m "$home")" != "$(realpath -m "$CACHE/home")" ] || return 0
  bin=$home/plugins/resource-$name-v$version/pulumi-resource-$name
  [ -x "$bin" ] || return 0
  installed_elsewhere "$name" "$version" && cmp -s "$bin" "$(installed_plugin "$name" "$version")" && return 0
  install_provider "$name" "$version" "$bin"
}

# NAME VERSION: one line, which binary runs: installed (from where) or stand-in, and its sha256
# (an installed one's is its record's, which installed_elsewhere has just held to the binary)
provider_line() {
  local name=$1 version=$2 record
  record=$(origin_record "$name" "$version")
  if installed_elsewhere "$name" "$version"; then
    echo "$name v$version: ready, installed from $(sed -n 2p "$record"), sha256 $(head -1 "$record" | cut -c1-16)"
  elif standin_installed "$name" "$version"; then
    echo "$name v$version: ready, stand-in (dev/engine/providers/$name), sha256 $(sha256_of "$(installed_plugin "$name" "$version")" | cut -c1-16)"
  else
    echo "$name v$version: missing"
    return 3
  fi
}

# PULUMI_HOME's plugin cache, filled from local binaries only; another binary at the same
# version (a rebuilt stand-in) replaces the one installed.
install_plugin() {
  local name=$1 version=$2 bin=$3
  cmp -s "$bin" "$(installed_plugin "$name" "$version")" && return 0
  if [ -e "$(installed_plugin "$name" "$version")" ]; then
    with_env "$(cli_bin)" plugin rm resource "$name" "$version" --yes || return 1
  fi
  with_env "$(cli_bin)" plugin install resource "$name" "$version" --file "$bin"
}

# The CLI and language host had elsewhere: a copy of the folder install-engine was given, and its
# record (each part's sha256 and name, then the folder it came from)
ENGINE_PARTS=(pulumi pulumi-language-python pulumi-language-python-exec)
installed_engine_dir() { echo "$CACHE/engine-installed"; }
engine_record() { echo "$CACHE/installed/engine"; }
# whether the copy holds, part by part, the very binaries install-engine recorded
engine_installed() {
  local record part
  record=$(engine_record)
  [ -f "$record" ] || return 1
  for part in "${ENGINE_PARTS[@]}"; do
    [ -x "$(installed_engine_dir)/$part" ] &&
      grep -qx "$(sha256_of "$(installed_engine_dir)/$part") $part" "$record" || return 1
  done
}
# the CLI that runs: the installed one, or the one built from Go modules
cli_bin() { if engine_installed; then echo "$(installed_engine_dir)/pulumi"; else echo "$(cli_dir)/pulumi"; fi; }
langhost_bin() {
  if engine_installed; then echo "$(installed_engine_dir)/pulumi-language-python"
  else echo "$(langhost_dir)/pulumi-language-python"; fi
}

# DIR: why it cannot be the engine (one line), or nothing
engine_refusal() {
  local dir=$1 part version
  [ -d "$dir" ] || { echo "'$dir' is not a folder"; return; }
  for part in "${ENGINE_PARTS[@]}"; do
    [[ -f $dir/$part && -x $dir/$part ]] || { echo "$dir has no executable $part"; return; }
  done
  version=$("$dir/pulumi" version 2>/dev/null | sed -n '1s/^v//p')
  [[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+ ]] || { echo "$dir/pulumi version said '$version', not vX.Y.Z"; return; }
  [ "$(printf '%s\n' "$PULUMI_SDK_VERSION" "$version" | sort -V | head -1)" = "$PULUMI_SDK_VERSION" ] ||
    echo "$dir/pulumi is v$version, older than the Python SDK's v$PULUMI_SDK_VERSION"
}

# DIR: a Pulumi release's folder (or a build from source laid out as one), copied and recorded,
# so that `build` builds neither the CLI nor the language host and keeps these
install_engine() {
  local dir=${1:-} refusal out part
  refusal=$(engine_refusal "$dir")
  [ -z "$refusal" ] || die "install-engine DIR: DIR is a Pulumi release's folder (${ENGINE_PARTS[*]}, v$PULUMI_SDK_VERSION or newer): $refusal"
  dir=$(realpath "$dir") out=$(installed_engine_dir)
  rm -rf "$out.tmp" && mkdir -p "$out.tmp" "$CACHE/installed"
  for part in "${ENGINE_PARTS[@]}"; do cp "$(realpath "$dir/$part")" "$out.tmp/$part"; done
  publish "$out" pulumi-language-python || die "install-engine $dir: the copy failed"
  { for part in "${ENGINE_PARTS[@]}"; do echo "$(sha256_of "$out/$part") $part"; done
    echo "version $("$out/pulumi" version | sed -n '1s/^v//p')"; echo "from $dir"; } >"$(engine_record)"
  link_bin
  log "engine: $("$out/pulumi" version) installed from $dir; build keeps it"
}

# The folder of a user's own `pulumi` on PATH (not this cache's), adopted as install-engine would
# when it is a whole release's folder at a version the SDK works with
adopt_users_engine() {
  local found dir
  found=$(command -v pulumi) || return 0
  dir=$(dirname "$(realpath "$found")")
  # this cache's engine, or another cache's (a shell that ran `eval "$(scripts/engine.sh env)"`)
  case $(basename "$dir") in engine-v* | engine-installed) return 0 ;; esac
  [ -z "$(engine_refusal "$dir")" ] || return 0
  engine_installed && grep -qx "from $dir" "$(engine_record)" && return 0
  install_engine "$dir"
}

# NAME PART WHAT BUILT: one line, which binary runs as the CLI (PART pulumi) or the language host
# (pulumi-language-python): the installed one (from where, its release's version), or the one
# built here (WHAT, at BUILT)
engine_line() {
  local name=$1 part=$2 built_as=$3 built=$4 record
  record=$(engine_record)
  if engine_installed; then
    echo "$name v$(sed -n 's/^version //p' "$record"): ready, installed from $(sed -n 's/^from //p' "$record"), sha256 $(sha256_of "$(installed_engine_dir)/$part" | cut -c1-16)"
  elif [ -x "$built" ]; then
    echo "$name v$PULUMI_CLI_VERSION: ready, $built_as, sha256 $(sha256_of "$built" | cut -c1-16)"
  else
    echo "$name v$PULUMI_CLI_VERSION: missing"
    return 3
  fi
}

engine_lines() {
  local ok=0
  engine_line cli pulumi "built from Go modules" "$(cli_dir)/pulumi" || ok=3
  engine_line langhost pulumi-language-python "stand-in (dev/engine/pulumi-language-python)" \
    "$(langhost_dir)/pulumi-language-python" || ok=3
  return "$ok"
}

# One folder with the CLI, the language host and pulumi-language-python-exec side by side (hard
# links): the CLI finds the language host beside itself, as in a release, and the host finds
# pulumi-language-python-exec beside itself; $CACHE/bin points at the current one (the installed
# engine's folder, when there is one).
link_bin() {
  local engine
  if engine_installed; then
    ln -sfn "$(basename "$(installed_engine_dir)")" "$CACHE/bin.tmp"
    mv -T "$CACHE/bin.tmp" "$CACHE/bin"
    return 0
  fi
  engine=$CACHE/engine-v$PULUMI_CLI_VERSION-$(basename "$(langhost_dir)" | sed 's/.*-//')
  if [ ! -x "$engine/pulumi-language-python" ]; then
    rm -rf "$engine.tmp"
    mkdir -p "$engine.tmp"
    ln -f "$(cli_dir)/pulumi" "$(langhost_dir)/pulumi-language-python" \
      "$(langhost_dir)/pulumi-language-python-exec" "$engine.tmp/"
    rm -rf "$engine"
    mv "$engine.tmp" "$engine"
  fi
  rm -rf "$CACHE/bin.tmp"
  ln -s "$(basename "$engine")" "$CACHE/bin.tmp"
  mv -T "$CACHE/bin.tmp" "$CACHE/bin"
}

print_env() {
  cat <<EOF
export TWINSPARK_ENGINE_CACHE='$CACHE'
export PATH='$CACHE/bin':"\$PATH"
export PULUMI_HOME='$CACHE/home'
export PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION=true
export PULUMI_SKIP_UPDATE_CHECK=true
export PULUMI_SKIP_CONFIRMATIONS=true
export PULUMI_IGNORE_AMBIENT_PLUGINS=true
EOF
}

with_env() { ( eval "$(print_env)"; "$@" ); }

versions() {
  with_env "$(cli_bin)" version || true
  with_env "$(langhost_bin)" -version 2>&1 || true
  with_env "$(cli_bin)" plugin ls || true
  engine_lines || true
  local p
  for p in command:$COMMAND_VERSION random:$RANDOM_VERSION docker:$DOCKER_VERSION; do
    provider_line "${p%%:*}" "${p#*:}" || true
  done
}

cmd_build() {
  local want=("$@") c v failed=()
  [ "${#want[@]}" -gt 0 ] || want=(cli langhost command random docker)
  mkdir -p "$CACHE"
  adopt_users_engine
  engine_installed || command -v go >/dev/null || die "go is not installed"
  for c in "${want[@]}"; do
    case $c in
      cli) engine_installed || [ -x "$(cli_dir)/pulumi" ] || timed cli "$PULUMI_CLI_VERSION" build_cli || failed+=(cli) ;;
      langhost) engine_installed || [ -x "$(langhost_dir)/pulumi-language-python" ] ||
        timed langhost "$PULUMI_CLI_VERSION" build_langhost || failed+=(langhost) ;;
      command | random)
        [ -x "$(cli_bin)" ] || { log "$c: the CLI installs the plugin: build cli first"; failed+=("$c"); continue; }
        v=$([ "$c" = command ] && echo "$COMMAND_VERSION" || echo "$RANDOM_VERSION")
        adopt_users_provider "$c" "$v"
        provider_ready "$c" "$v" || timed "$c" "$v" "build_$c" || failed+=("$c") ;;
      docker)
        [ ! -x "$(cli_bin)" ] || adopt_users_provider docker "$DOCKER_VERSION"
        provider_ready docker "$DOCKER_VERSION" || timed docker "$DOCKER_VERSION" build_docker || failed+=(docker) ;;
      *) die "unknown component: $c" ;;
    esac
  done
  if [ -x "$(cli_bin)" ] && [ -x "$(langhost_bin)" ]; then
    link_bin
    versions
  fi
  if [ "${#failed[@]}" -gt 0 ]; then
    log "not built: ${failed[*]}"
    return 2
  fi
}

# What is ready, one line each; exit 0 when the CLI, the language host and every provider are.
cmd_status() {
  local ok=0 p
  engine_lines || ok=3
  for p in command:$COMMAND_VERSION random:$RANDOM_VERSION docker:$DOCKER_VERSION; do
    provider_line "${p%%:*}" "${p#*:}" || ok=3
  done
  return "$ok"
}

SMOKE_DIR="" SMOKE_SSHD=""
# An sshd on loopback for the smoke's remote.Command (as tests/ssh_fixtures.py starts one): its
# own host key, one authorized key, no AcceptEnv. Sets SMOKE_SSH_PORT; fails when it cannot.
smoke_sshd() {
  local ssh=$1/ssh
  [ -x /usr/sbin/sshd ] && command -v ssh-keygen >/dev/null || return 1
  mkdir -p "$ssh"
  mkdir -p /run/sshd 2>/dev/null || true
  ssh-keygen -q -t ed25519 -N '' -C '' -f "$ssh/host_key" && ssh-keygen -q -t ed25519 -N '' -C '' -f "$ssh/id" ||
    return 1
  SMOKE_SSH_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  /usr/sbin/sshd -D -e -f /dev/null -o "Port=$SMOKE_SSH_PORT" -o ListenAddress=127.0.0.1 \
    -o "HostKey=$ssh/host_key" -o "AuthorizedKeysFile=$ssh/id.pub" -o StrictModes=no \
    -o PasswordAuthentication=no -o KbdInteractiveAuthentication=no -o UsePAM=no -o PidFile=none \
    2>"$ssh/sshd.log" &
  SMOKE_SSHD=$!
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$SMOKE_SSH_PORT") 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

cmd_smoke() {
  SMOKE_DIR=$(mktemp -d)
  trap '[ -z "$SMOKE_SSHD" ] || kill "$SMOKE_SSHD" 2>/dev/null; rm -rf "$SMOKE_DIR"' EXIT
  local dir=$SMOKE_DIR
  mkdir -p "$dir/state" "$dir/project"
  SMOKE_SSH_PORT=
  smoke_sshd "$dir" || log "smoke: no sshd here (/usr/sbin/sshd), so no remote.Command: $(tail -3 "$dir/ssh/sshd.log" 2>/dev/null)"
  cat >"$dir/project/Pulumi.yaml" <<EOF
name: engine-smoke
runtime:
  name: python
  options:
    toolchain: pip
    virtualenv: $ROOT/.venv
EOF
  cat >"$dir/project/__main__.py" <<'EOF'
import os

import pulumi
import pulumi_random as random
from pulumi_command import local

# TWINSPARK_SMOKE_RANDOM_VERSION asks for a random provider other than the SDK's own version
random_version = os.environ.get("TWINSPARK_SMOKE_RANDOM_VERSION") or None
password = random.RandomPassword("pw", length=24, special=False,
                                 opts=pulumi.ResourceOptions(version=random_version))
hello = local.Command("hello", create="echo smoke-$(hostname)")
pulumi.export("length", pulumi.Output.unsecret(password.result.apply(len)))
pulumi.export("stdout", hello.stdout)

# a remote.Command over SSH to the smoke's own sshd, its host key pinned, stdin fed
if os.environ.get("SMOKE_SSH_PORT"):
    from pulumi_command import remote
    ssh = os.environ["SMOKE_SSH_DIR"]
    conn = remote.ConnectionArgs(
        host="127.0.0.1", port=int(os.environ["SMOKE_SSH_PORT"]), user=os.environ["SMOKE_SSH_USER"],
        private_key=open(f"{ssh}/id").read(),
        host_key=" ".join(open(f"{ssh}/host_key.pub").read().split()[:2]))
    over_ssh = remote.Command("over-ssh", connection=conn, create="cat; echo over-ssh-$(id -un)",
                              stdin="stdin-ok\n", triggers=[password.id], add_previous_output_in_env=False)
    pulumi.export("remote", over_ssh.stdout)
EOF
  (
    eval "$(print_env)"
    export PULUMI_BACKEND_URL="file://$dir/state" PULUMI_CONFIG_PASSPHRASE=smoke
    SMOKE_SSH_USER=$(id -un)
    export SMOKE_SSH_PORT SMOKE_SSH_DIR=$dir/ssh SMOKE_SSH_USER
    unset SSH_AUTH_SOCK # the key above only: an agent in the caller's session is not the smoke's
    cd "$dir/project"
    pulumi stack init smoke --non-interactive
    pulumi up --yes --non-interactive --skip-preview
    pulumi stack output --json | tee "$dir/outputs.json"
    [ -z "$SMOKE_SSH_PORT" ] || python3 -c '
import json, sys
got = json.load(open(sys.argv[1])).get("remote")
want = "stdin-ok\nover-ssh-" + sys.argv[2]
print("remote.Command over ssh:", "ok" if got == want else "got %r, want %r" % (got, want))
sys.exit(got != want)' "$dir/outputs.json" "$SMOKE_SSH_USER"
    # the second up must change nothing: --expect-no-changes fails it otherwise, and the
    # engine's own summary event must count every resource as "same"
    pulumi up --yes --non-interactive --skip-preview --expect-no-changes --json >"$dir/second.json"
    python3 - "$dir/second.json" <<'EOF'
import json, sys
summary = None
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{"):
        summary = json.loads(line).get("summaryEvent", summary)
changes = (summary or {}).get("resourceChanges", {})
print("second up, the engine's summary:", changes)
sys.exit(0 if summary is not None and set(changes) == {"same"} else 1)
EOF
  )
}

case ${1:-build} in
  build) shift || true; cmd_build "$@" ;;
  env) print_env ;;
  versions) versions ;;
  status) cmd_status ;;
  smoke) cmd_smoke ;;
  install-provider) shift; install_provider "$@" ;;
  install-engine) shift; install_engine "$@" ;;
  *) die "usage: $0 build [cli langhost command random docker] | env | versions | status | smoke | install-provider NAME VERSION BIN | install-engine DIR" ;;
esac
