# slurm-stop-pids.sh - sourced by slurm-up.sh and slurm-down.sh.
# stop_pids COMM PIDFILE...: TERM every live process named by the pid files (whose command
# name is COMM), wait up to 20 s, then KILL the stragglers. Waits on the pids, not the pid
# files: slurmd deletes its pid file on TERM but can linger while it retries registration.
stop_pids() {
  local c=$1 f p i pids=(); shift
  for f in "$@"; do
    if alive "$f" "$c"; then p=$(cat "$f"); kill -TERM "$p" || true; pids+=("$p"); fi
    rm -f "$f"
  done
  [ ${#pids[@]} -gt 0 ] || return 0
  _running() { for p in "${pids[@]}"; do [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$c" ] && return 0; done; return 1; }
  for i in $(seq 200); do _running || break; sleep 0.1; done
  for p in "${pids[@]}"; do
    if [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$c" ]; then log "$c ($p) ignored TERM, sending KILL"; kill -KILL "$p" || true; fi
  done
  log "stopped $c (${pids[*]})"
}
