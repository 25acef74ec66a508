#!/usr/bin/env bash
# node-root.sh — PID 1 of a simulated node's pid namespace, in its own mount/uts namespaces
# and network namespace: build an overlay root over the machine's root (changes live in a
# tmpfs and vanish with the node; /tmp stays in the overlay so a checkout under /tmp is
# still visible), mount /proc, /sys (this netns), /dev, /run, then chroot into it and
# exec node_init.py.
#   node-root.sh NAME SIM_DIR USER PUBKEY_FILE PYTHON
set -euo pipefail
name="$1" sim_dir="$2" user="$3" pubkey_file="$4" python="$5"
base="/tmp/twinspark-sim-root-$name"
mkdir -p "$base"
mount -t tmpfs -o size=4g tmpfs "$base"
mkdir -p "$base/upper" "$base/work" "$base/merged"
mount -t overlay overlay -o "lowerdir=/,upperdir=$base/upper,workdir=$base/work" "$base/merged"
root="$base/merged"
mount -t proc proc "$root/proc"
mount -t sysfs sysfs "$root/sys"
mount --rbind /dev "$root/dev"
mount -t tmpfs tmpfs "$root/run"
hostname "$name"
echo "$name" > "$root/etc/hostname"
cp "$pubkey_file" "$root/tmp/authorized_key.pub"
exec chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  "$python" "$sim_dir/node_init.py" --name "$name" --user "$user" --sim-dir "$sim_dir"
