#!/usr/bin/env bash
# fabric-check.sh — verify this node's QSFP fabric before anything loads a model (recipe §1).
#
#   fabric-check.sh --node spark1 --mtu 9000 --speed-mbps 200000 \
#       --rail enp1s0f0np0:rocep1s0f0:10.0.0.2 --rail enP2p1s0f0np0:roceP2p1s0f0:10.0.1.2 \
#       --far-end 10.0.0.2=spark2:enp1s0f0np0 --far-end 10.0.1.2=spark2:enP2p1s0f0np0
#
# A rail is IFACE:HCA:PEER[,PEER...]; a far end ADDR=NODE:IFACE is a rail of another node (all of
# them). Checks each rail: link up at the expected speed, the expected MTU, HCA the one whose port
# the interface is (rdma link show: a wrong pairing is refused with the right one), RoCE port
# ACTIVE with active_mtu 4096, a don't-fragment ping of MTU-28 bytes to every peer — and when one
# goes unanswered, which far end the rail's cable does reach (LLDP, else an ARP probe: crossed
# cables named with the port to move them to); and memlock unlimited in this (fresh) login.
# Prints one FAIL line per failed check naming node, rail, expected and measured value; exits 1
# if any failed. --memlock skip leaves out the login's memlock (the serving guard's
# re-qualification is no login; the limit it checks does not change while serving).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=prelude.sh
[ -n "${TWINSPARK_PRELUDE:-}" ] || . "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"

node="" mtu="" speed_mbps="" memlock="check"
rails=() far_ends=()
failures=0

ok() { log "ok   $*"; }
fail() { log "FAIL $*"; failures=$((failures + 1)); }


read_sys() { cat "/sys/class/net/$1/$2" 2>/dev/null || echo "unreadable"; }

check_link() {
  local iface="$1" state speed measured_mtu
  if [ ! -d "/sys/class/net/$iface" ]; then
    fail "rail $iface: interface expected present, measured absent (cable plugged before boot? see README)"
    return 1
  fi
  state=$(read_sys "$iface" operstate)
  if [ "$state" = "up" ]; then ok "rail $iface: link up"; else fail "rail $iface: link expected up, measured $state"; fi
  speed=$(read_sys "$iface" speed)
  if [ "$speed" = "$speed_mbps" ]; then ok "rail $iface: speed ${speed} Mb/s"; else fail "rail $iface: speed expected ${speed_mbps} Mb/s, measured ${speed} Mb/s"; fi
  measured_mtu=$(read_sys "$iface" mtu)
  if [ "$measured_mtu" = "$mtu" ]; then ok "rail $iface: MTU $mtu"; else fail "rail $iface: MTU expected $mtu, measured $measured_mtu"; fi
}

check_roce() {
  local iface="$1" hca="$2" info state active_mtu
  if ! command -v ibv_devinfo >/dev/null; then
    fail "rail $iface: RoCE $hca expected inspectable, measured ibv_devinfo missing (apt install ibverbs-utils)"
    return 0
  fi
  if ! info=$(ibv_devinfo -d "$hca" -i 1 2>&1); then
    fail "rail $iface: RoCE device $hca expected present, measured: $(echo "$info" | tail -n 1)"
    return 0
  fi
  state=$(awk '$1 == "state:" {print $2; exit}' <<<"$info")
  active_mtu=$(awk '$1 == "active_mtu:" {print $2; exit}' <<<"$info")
  if [ "$state" = "PORT_ACTIVE" ]; then ok "rail $iface: RoCE $hca ACTIVE"; else fail "rail $iface: RoCE $hca state expected PORT_ACTIVE, measured ${state:-unknown}"; fi
  if [ "$active_mtu" = "4096" ]; then ok "rail $iface: RoCE active_mtu 4096"; else fail "rail $iface: RoCE $hca active_mtu expected 4096, measured ${active_mtu:-unknown}"; fi
}

# The HCA whose port this interface is (iproute2's `rdma link show`: "link HCA/PORT ... netdev IFACE"):
# a config that pairs the interface with another HCA would give NCCL_IB_HCA the wrong rail.
check_pairing() {
  local iface="$1" hca="$2" links owner
  if ! command -v rdma >/dev/null; then
    fail "rail $iface: its HCA expected readable, measured rdma missing (apt install iproute2)"
    return 0
  fi
  links=$(rdma link show 2>&1) || { fail "rail $iface: rdma link show failed: $(tail -n 1 <<<"$links")"; return 0; }
  owner=$(awk -v n="$iface" '$(NF-1) == "netdev" && $NF == n {split($2, port, "/"); print port[1]; exit}' <<<"$links")
  if [ -z "$owner" ]; then
    fail "rail $iface: HCA expected $hca, measured none (no RoCE port has $iface as its netdev: is it a ConnectX port?)"
  elif [ "$owner" = "$hca" ]; then
    ok "rail $iface: HCA $hca (rdma link show)"
  else
    fail "rail $iface: HCA expected $hca, measured $owner: $iface is $owner's port (rdma link show); set hca: $owner" \
      "on this node's rail with iface: $iface"
  fi
}

# The far end a rail address is (NODE's IFACE), from --far-end; the address alone if none names it.
far_end_name() {
  local entry far
  for entry in "${far_ends[@]}"; do
    far=${entry#*=}
    if [ "${entry%%=*}" = "$1" ]; then echo "${far%%:*}'s ${far#*:}"; return; fi
  done
  echo "$1"
}

root_or_sudo() { [ "$(id -u)" -eq 0 ] || echo "sudo -n"; }

# ARP answered for ADDR on IFACE within the probe just sent: REACHABLE, confirmed at most 3 s ago
# (`ip -s neigh`'s "used USED/CONFIRMED/UPDATED"; an older confirmation is another cabling's).
arp_answered() {
  ip -s neigh show dev "$1" to "$2" 2>/dev/null | awk '
    { for (i = 1; i < NF; i++) if ($i == "used") { split($(i + 1), t, "/"); age = t[2] + 0 } }
    $NF == "REACHABLE" && age <= 3 { found = 1 }
    END { exit !found }'
}

# Which far end IFACE's cable reaches, for a FAIL line. LLDP where lldpd runs; else a probe of every
# other node's rail address from this rail: each rail answers ARP only for its own address
# (HostPrep's arp_ignore=1), so an address that answers on this cable is the rail at its other end.
cable_reaches() {
  local iface="$1" expected="$2" lldp chassis port entry addr reached=()
  if command -v lldpcli >/dev/null && lldp=$(lldpcli -f keyvalue show neighbors ports "$iface" 2>/dev/null); then
    chassis=$(awk -F= -v k="lldp.$iface.chassis.name" '$1 == k { print substr($0, length(k) + 2); exit }' <<<"$lldp")
    port=$(awk -F= -v i="lldp.$iface.port." '
      index($1, i) == 1 { f[substr($1, length(i) + 1)] = substr($0, length($1) + 2) }
      END { print (f["ifname"] != "" ? f["ifname"] : (f["descr"] != "" ? f["descr"] : f["mac"])) }' <<<"$lldp")
    if [ -n "$chassis" ]; then
      echo "LLDP: its cable reaches ${chassis}'s ${port:-unnamed port}, expected $(far_end_name "$expected")"
      return
    fi
  fi
  # a small ping answered (the far end's reply came back on this cable), or its ARP answered just now
  # (a crossed cable: the reply leaves by the other one)
  local pings=() i=0
  for entry in "${far_ends[@]}"; do
    # what the table learnt before (another cabling's answer, kept fresh by traffic) is forgotten first,
    # where this login may (sudo, or root in the guard's re-qualification)
    $(root_or_sudo) ip neigh flush dev "$iface" to "${entry%%=*}" >/dev/null 2>&1 || true
    ping -q -n -c 1 -W 1 -I "$iface" "${entry%%=*}" >/dev/null 2>&1 &
    pings+=("$!")
  done
  for entry in "${far_ends[@]}"; do
    addr=${entry%%=*}
    if wait "${pings[$i]}" || arp_answered "$iface" "$addr"; then reached+=("$addr"); fi
    i=$((i + 1))
  done
  if [ "${#reached[@]}" -eq 0 ]; then
    echo "nothing on its cable answers ARP for any other node's rail: unplugged, or the far end's rail down or without its address"
  elif [ "${#reached[@]}" -gt 1 ]; then
    echo "its cable reaches a node that answers ARP for several rails (${reached[*]}): is HostPrep's arp_ignore there?"
  elif [ "${reached[0]}" = "$expected" ]; then
    echo "its cable reaches $(far_end_name "$expected") (it answers), which the full-size ping does not: an MTU below" \
      "$mtu on the way, or a firewall there"
  else
    echo "its cable reaches $(far_end_name "${reached[0]}") (${reached[0]} answered ARP on $iface), not" \
      "$(far_end_name "$expected"): crossed cables: plug it into $(far_end_name "$expected")"
  fi
}

check_peers() {
  local iface="$1" peer payload=$((mtu - 28)) peers
  IFS=',' read -ra peers <<<"$2"
  for peer in "${peers[@]}"; do
    [ -n "$peer" ] || continue
    if ping -q -M "do" -s "$payload" -c 2 -i 0.2 -W 2 -I "$iface" "$peer" >/dev/null 2>&1; then
      ok "rail $iface: ${payload}-byte DF ping to $peer ($(far_end_name "$peer"))"
    else
      fail "rail $iface: ${payload}-byte don't-fragment ping to $peer expected answered, measured no reply;" \
        "$(cable_reaches "$iface" "$peer")"
    fi
  done
}

check_memlock() {
  local limit
  limit=$(ulimit -l)
  if [ "$limit" = "unlimited" ]; then ok "memlock unlimited in a fresh login"; else fail "memlock expected unlimited in a fresh login, measured ${limit} KiB (recipe gotchas 1-2)"; fi
}

main() {
  parse_flags --node=node --mtu=mtu --speed-mbps=speed_mbps --rail=rails[] --far-end=far_ends[] \
    --memlock=memlock -- "$@"
  require_flags --node --mtu --speed-mbps --rail
  log_node=$node
  local rail iface hca peers
  for rail in "${rails[@]}"; do
    IFS=':' read -r iface hca peers <<<"$rail"
    if check_link "$iface"; then
      check_pairing "$iface" "$hca"
      check_roce "$iface" "$hca"
      check_peers "$iface" "$peers"
    fi
  done
  case "$memlock" in
    check) check_memlock ;;
    skip) ;;
    *) usage_error "--memlock expects check or skip, got '$memlock'" ;;
  esac
  if [ "$failures" -gt 0 ]; then
    log "$failures check(s) failed"
    exit 1
  fi
  log "fabric healthy"
}

main "$@"
