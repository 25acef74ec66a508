#!/usr/bin/env bash
# node-root.sh — PID 1 of a simulated node's pid namespace, in its own mount/uts namespaces
# and network namespace: build an overlay root over the machine's root, mount /proc, /sys
# (this netns, with the machine's cgroup hierarchies, which dockerd needs), a /dev of the
# node's own, /run, then pivot into it and exec node_init.py.
#
# The node's disk is STATE_DIR: the overlay's upper layer and docker's data-root (overlay2
# cannot sit on an overlay) live there, so they survive the node's reboot (PID 1 killed, this
# script run again) as a real disk does; /run is a fresh tmpfs each boot. The cluster wipes
# STATE_DIR when it makes the node anew and when it takes it down.
#   node-root.sh NAME SIM_DIR USER PUBKEY_FILE PYTHON STATE_DIR [NODE_INIT_ARG...]
set -euo pipefail
name="$1" sim_dir="$2" user="$3" pubkey_file="$4" python="$5" state="$6"
shift 6
root="/tmp/twinspark-sim-root-${state##*/}"  # by disk (PREFIX-NAME): another site's node has the same name
mkdir -p "$root" "$state/upper" "$state/work" "$state/docker"
mount -t overlay overlay -o "lowerdir=/,upperdir=$state/upper,workdir=$state/work" "$root"
mount -t proc proc "$root/proc"
mount -t sysfs sysfs "$root/sys"
mount --rbind /sys/fs/cgroup "$root/sys/fs/cgroup"
# /dev: the node's own (a tmpfs with the machine's character devices bound in), so that the
# node's /dev/infiniband stand-ins stay the node's
mount -t tmpfs -o mode=0755,size=1m tmpfs "$root/dev"
for dev in null zero full random urandom tty; do
  touch "$root/dev/$dev"
  mount --bind "/dev/$dev" "$root/dev/$dev"
done
mkdir -p "$root/dev/pts" "$root/dev/shm" "$root/dev/infiniband"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$root/dev/pts"
ln -s pts/ptmx "$root/dev/ptmx"
mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
ln -s /proc/self/fd "$root/dev/fd"
for i in 0:stdin 1:stdout 2:stderr; do ln -s "/proc/self/fd/${i%%:*}" "$root/dev/${i#*:}"; done
# the RDMA devices a Spark's ConnectX-7 gives (the numbers of the kernel's uverbs and rdma_cm):
# docker's `--device /dev/infiniband` copies them into the container; nothing can open them
mknod -m 0666 "$root/dev/infiniband/rdma_cm" c 10 58
for i in 0 1 2 3; do mknod -m 0666 "$root/dev/infiniband/uverbs$i" c 231 $((192 + i)); done
mount -t tmpfs tmpfs "$root/run"
# a boot id of this boot's own (the kernel's is the machine's, the same at every sim reboot): the
# node recorder tells one boot from the next by it (launch/node-recorder.py)
cat /proc/sys/kernel/random/uuid > "$root/run/twinspark-sim-boot-id"
mount --bind "$root/run/twinspark-sim-boot-id" "$root/proc/sys/kernel/random/boot_id"
mkdir -p "$root/var/lib/docker"
mount --bind "$state/docker" "$root/var/lib/docker"
hostname "$name"
echo "$name" > "$root/etc/hostname"
cp "$pubkey_file" "$root/tmp/authorized_key.pub"
# pivot_root, not chroot: the overlay becomes this mount namespace's root, so runc can
# pivot_root into a container's rootfs (under a chroot it falls back to one, and `docker exec`
# then lands in the node's root instead of the container's)
cd "$root"
mkdir -p .host-root
pivot_root . .host-root
umount -l /.host-root
# shared, as systemd makes / on a real host: docker's `rslave` binds of / (the node exporter's
# /host) need a source mount that propagates
mount --make-rshared /
exec chroot . /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  "$python" "$sim_dir/node_init.py" --name "$name" --user "$user" --sim-dir "$sim_dir" "$@"
