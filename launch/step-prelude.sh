# step-prelude.sh — what the steps that reach a peer or leave files in the user's home share:
# the weight copy's ssh options and the owner records. Not in prelude.sh, which the serving
# containers carry too: the runner sends this one only ahead of a script that sources it.
# shellcheck shell=bash

# shellcheck disable=SC2034  # read by the scripts, to source this file only once
TWINSPARK_STEP_PRELUDE=1

# ---- the peers, over the rail with the weight-sync key ----------------------------------------
# sync_key_ssh_options VAR KEY KNOWN_HOSTS: ssh options for a peer that authorized the sync key
# (only from this node's rail address, authorize-key.sh); its host key is learnt at first use.
sync_key_ssh_options() {
  local -n options=$1
  options=(-i "$2" -o IdentitiesOnly=yes -o BatchMode=yes -o StrictHostKeyChecking=accept-new
    -o "UserKnownHostsFile=$3")
}

# sync_key_refused PEER: why a peer refused the sync key (ssh's own exit status 255), and the way
# out: a worker admits the key only while `pulumi up` runs the steps that use it (authorize-key.sh)
sync_key_refused() {
  echo "ssh to $1 with the sync key failed (see ssh's line above): unreachable over the rail, or the key not admitted — a worker admits it only while \`pulumi up\` runs the steps that use it, so with --replace of this step replace $1's weights-authorize and weights-revoke steps too (weights-relay-authorize and -relay-revoke where its copy comes from a relay)"
}

# ---- ownership of what a step leaves in the user's home (the sync key, its authorization) ---
# A renamed resource's old delete runs after the new create (the engine creates first); it
# must leave alone what the new resource now owns. No record: installed before records
# existed, so the caller owns it.
owner_record() { printf '%s/.local/state/twinspark/owners/%s' "$HOME" "$1"; }
claim_owner() {  # claim_owner THING OWNER
  install -d -m 700 "$(dirname "$(owner_record "$1")")"
  printf '%s\n' "$2" >"$(owner_record "$1")"
}
owner_of() { cat "$(owner_record "$1")" 2>/dev/null || true; }
owned_by() { [ -z "$(owner_of "$1")" ] || [ "$(owner_of "$1")" = "$2" ]; }  # owned_by THING OWNER
release_owner() { rm -f "$(owner_record "$1")"; }
