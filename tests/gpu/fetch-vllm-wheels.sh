#!/usr/bin/env bash
# fetch-vllm-wheels.sh — download tests/gpu/vllm-wheels.txt for the device (x86-64, Python 3.12)
# into .whl/wheels, then pack them into carry folders of at most 60 MiB each (.whl/part1, ...):
# one `run` carries 64 MiB at most. A wheel over 60 MiB is cut with `split -b` into
# NAME.whl.split-aa, -ab, ... (in consecutive parts); the device side rebuilds it with
# `cat NAME.whl.split-* > NAME.whl` (vllm-single-gpu.sh does). Parts are hard links: no copy.
# .whl/ must be ignored (.git/info/exclude: /.whl/), as the device README says.
# PART_MIB (default 60): the parts' size; a call carries 64 MiB with the tree, so a tree of ~17 MiB
# leaves ~46. SKIP: names (as in the list) downloaded but not packed, e.g. SKIP=ray where the run
# needs no Ray (loaders-on-device.sh: plain `vllm serve`, one GPU).
set -euo pipefail
cd "$(dirname "$0")/../.."
limit=$((${PART_MIB:-60} * 1024 * 1024))
wheels=.whl/wheels
mkdir -p "$wheels"
grep -E '^[A-Za-z0-9_.-]+==' tests/gpu/vllm-wheels.txt > .whl/requirements.txt
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64 \
  -d "$wheels" -r .whl/requirements.txt

rm -rf .whl/part* .whl/pieces && mkdir -p .whl/pieces
skip=$(for n in ${SKIP:-}; do printf '%s\n' "$n" | tr '-' '_'; done)
for whl in "$wheels"/*.whl; do
  name=$(basename "$whl"); name=${name%%-*}
  if [ -n "$skip" ] && grep -qixF "$name" <<<"$skip"; then continue; fi
  if [ "$(stat -c %s "$whl")" -gt "$limit" ]; then
    split -b "$limit" "$whl" ".whl/pieces/$(basename "$whl").split-"
  else
    ln "$whl" .whl/pieces/
  fi
done
# first fit, largest first: the fewest parts
part=0
declare -A used=()
while read -r size piece; do
  placed=
  for ((p = 1; p <= part; p++)); do
    if [ $((used[$p] + size)) -le "$limit" ]; then placed=$p; break; fi
  done
  if [ -z "$placed" ]; then part=$((part + 1)); placed=$part; used[$placed]=0; mkdir -p ".whl/part$placed"; fi
  ln ".whl/pieces/$piece" ".whl/part$placed/"
  used[$placed]=$((used[$placed] + size))
done < <(cd .whl/pieces && stat -c '%s %n' -- * | sort -rn)
rm -rf .whl/pieces
for ((p = 1; p <= part; p++)); do
  printf '.whl/part%s\t%s MiB\t%s files\n' "$p" "$((used[$p] / 1024 / 1024))" "$(find ".whl/part$p" -type f | wc -l)"
done
echo "downloaded: $(du -sm --apparent-size "$wheels" | cut -f1) MiB in $(find "$wheels" -name '*.whl' | wc -l) wheels; packed (SKIP left out): $part parts"
