#!/usr/bin/env bash
# slurm-down.sh - stop what scripts/slurm-up.sh started, by its pid files only (slurmd-*,
# slurmctld, and munged only when slurm-up.sh started it). Cancels the cluster's jobs first.
# Keeps configs and state; --purge also deletes $KILOCARD_SLURM_BASE (job ids restart at 1).
# Safe to run when nothing is running.
set -uo pipefail
BASE=${KILOCARD_SLURM_BASE:-/tmp/kilocard-slurm}
RUN=$BASE/run
export SLURM_CONF=${KILOCARD_SLURM_CONF_DIR:-/etc/slurm}/slurm.conf
log() { echo "[slurm-down $(date +%T)] $*" >&2; }
alive() { local p; [ -s "$1" ] && p=$(cat "$1") && [ -r "/proc/$p/comm" ] &&
          [ "$(cat "/proc/$p/comm")" = "$2" ]; }
# shellcheck source=slurm-stop-pids.sh
. "$(dirname "$0")/slurm-stop-pids.sh"
if [ ! -d "$RUN" ]; then
  log "nothing to stop ($RUN missing)"
else
  if alive "$RUN/slurmctld.pid" slurmctld; then
    jobs=$(timeout 10 squeue -h -o %i 2>/dev/null | tr '\n' ' ')
    if [ -n "${jobs// /}" ]; then
      log "cancelling jobs: $jobs"
      # shellcheck disable=SC2086
      timeout 10 scancel $jobs 2>/dev/null
      for i in $(seq 60); do [ -z "$(timeout 10 squeue -h -t PD,R,CG,S,CF -o %i 2>/dev/null)" ] && break; sleep 0.5; done
    fi
  fi
  shopt -s nullglob
  stop_pids slurmd "$RUN"/slurmd-*.pid
  stop_pids slurmctld "$RUN/slurmctld.pid"
  # munged only when slurm-up.sh started it and no other Slurm daemon (another cluster) still uses it
  others=$(for c in /proc/[0-9]*/comm; do cat "$c" 2>/dev/null; done | grep -cxE 'slurmctld|slurmd' || true)
  if [ "$others" -gt 0 ]; then log "keeping munged: $others other Slurm daemon(s) still use it"; rm -f "$RUN/munged.pid"
  else stop_pids munged "$RUN/munged.pid"; fi
  shopt -u nullglob
fi
if [ "${1:-}" = "--purge" ]; then rm -rf "$BASE"; log "removed $BASE"; fi
exit 0
