#!/usr/bin/env bash
# managed-file.sh — install or remove one root-owned file that twinspark manages on a node.
#
#   managed-file.sh install --node spark1 --step hostprep/netplan --path /etc/netplan/99-qsfp.yaml \
#       --mode 0600 --owner spark1-hostprep-netplan --state-dir /var/lib/twinspark/applied \
#       [--action netplan|systemd|sysctl|nftables|unit|service|none] [--undo WHAT]   < content
#   managed-file.sh remove  (same flags; stdin ignored)
#
# install writes stdin to --path and applies it when the file or its mode differ or its last
# apply did not finish; otherwise it prints "unchanged: PATH" and touches nothing. The
# applied-state record names the owner only: it is removed before the file changes and
# written after the apply succeeded, so a dropped session between "written" and "applied" is
# retried next time. It holds nothing of the content — for a secret file (secrets.env, the Ray
# token, passwords) even a plain hash would let any reader test guesses offline — and only
# root reads the records.
# remove deletes the file and reverts its effect — only when the record names --owner: a
# renamed resource's old delete, which the engine runs after the new create, must not take
# away what the new one just installed.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=prelude.sh
[ -n "${TWINSPARK_PRELUDE:-}" ] || . "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"

node="" step="" path="" mode="0644" owner="" state_dir="" action="none" undo=""

# Each action applies the file's effect after install and undoes it after remove.
apply_action() {
  local pairs
  case "$action" in
    none) ;;
    systemd) sudo -n systemctl daemon-reexec ;;
    # `netplan apply` runs as its own systemd unit: if it bounces links, the apply still
    # completes even when our SSH session is the one that drops.
    netplan)
      sudo -n netplan generate
      sudo -n systemd-run --quiet --collect --wait --service-type=oneshot --unit=twinspark-netplan-apply netplan apply
      ;;
    sysctl)
      # --undo: one or more KEY=VALUE, space-separated
      if [ "$1" = install ]; then sudo -n sysctl -q -p "$path"; else read -ra pairs <<<"$undo" && sudo -n sysctl -q -w "${pairs[@]}"; fi
      ;;
    # nft -f replaces the table in one transaction; --undo names the table to delete
    nftables)
      if [ "$1" = install ]; then
        sudo -n nft -c -f "$path" || die "nft refused $path (nothing was changed)"
        sudo -n nft -f "$path"
      else
        sudo -n nft delete table "$undo" 2>/dev/null || true
      fi
      ;;
    # a systemd unit: enabled (it runs at the next boot; its file's effect is applied by
    # the files before it), disabled on remove
    unit)
      if [ "$1" = install ]; then
        sudo -n systemctl daemon-reload
        sudo -n systemctl enable --quiet "$(basename "$path")"
      else
        sudo -n systemctl daemon-reload
      fi
      ;;
    # a oneshot service whose start applies the file (and whose stop undoes it): restarted on
    # every install, so a changed unit takes effect now, not at the next boot
    service)
      if [ "$1" = install ]; then
        sudo -n systemctl daemon-reload
        sudo -n systemctl enable --quiet "$(basename "$path")"
        sudo -n systemctl restart "$(basename "$path")"
      else
        sudo -n systemctl daemon-reload
      fi
      ;;
    *) usage_error "--action $action: expected netplan, systemd, sysctl, nftables, unit, service or none" ;;
  esac
}

record_file() { printf '%s/%s.applied' "$state_dir" "$(echo "${path#/}" | tr / _)"; }
# The owner a record names; a record of an older twinspark held "HASH OWNER".
recorded_owner() { { sudo -n cat "$(record_file)" 2>/dev/null || true; } | awk '{ print $NF }'; }

install_file() {
  local staged record
  make_temp staged
  cat >"$staged"
  record=$(record_file)
  if sudo -n test -f "$path" && sudo -n cmp -s "$staged" "$path" \
     && [ "$(sudo -n stat -c %a:%U:%G "$path")" = "${mode#0}:root:root" ] \
     && [ "$(sudo -n cat "$record" 2>/dev/null)" = "$owner" ]; then
    echo "unchanged: $path"
    return 0
  fi
  sudo -n install -d -m 0700 -o root -g root "$state_dir"
  sudo -n rm -f "$record"
  sudo -n install -D -m "$mode" -o root -g root "$staged" "$path"
  echo "installed: $path"
  apply_action install
  echo "$owner" | sudo -n install -m 0600 -o root -g root /dev/stdin "$record"
}

remove_file() {
  local record recorded_owner
  record=$(record_file)
  recorded_owner=$(recorded_owner)
  if [ -n "$recorded_owner" ] && [ "$recorded_owner" != "$owner" ]; then
    echo "kept: $path (now managed by $recorded_owner)"
    return 0
  fi
  sudo -n test -e "$path" || return 0
  # disabling needs the unit file still there (its [Install] names the links to remove)
  case "$action" in
    unit) sudo -n systemctl disable --quiet "$(basename "$path")" ;;
    service) sudo -n systemctl disable --now --quiet "$(basename "$path")" ;;  # its stop undoes it
  esac
  sudo -n rm -f "$path" "$record"
  echo "removed: $path"
  apply_action remove
}

main() {
  local verb="${1:-}"
  [ $# -gt 0 ] && shift
  parse_flags --node=node --step=step --path=path --mode=mode --owner=owner --state-dir=state_dir \
    --action=action --undo=undo -- "$@"
  require_flags --node --step --path --owner --state-dir
  log_node=$node log_step=$step
  [[ $mode =~ ^0[0-7]{3}$ ]] || usage_error "--mode $mode: expected an octal mode like 0644"
  case "$action" in
    sysctl) [ -n "$undo" ] || usage_error "--action sysctl needs --undo KEY=VALUE (the value to restore)" ;;
    nftables) [ -n "$undo" ] || usage_error "--action nftables needs --undo 'FAMILY TABLE' (the table to delete)" ;;
  esac
  case "$verb" in
    install) install_file ;;
    remove) remove_file ;;
    *) usage_error "expected 'install' or 'remove' first, got '$verb'" ;;
  esac
}

main "$@"
