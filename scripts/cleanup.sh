#!/bin/sh
# trialkit's preStop hook: ask the keeper to stop the trial, wait until it has
# exited or the deadline has passed, and always exit 0 within that bound.
# The keeper's pidfile holds `PID START_TICKS GRACE`: the start time tells the
# keeper from a process that reused its pid, and the deadline is the keeper's
# own grace plus time to record and flush (TRIALKIT_CLEANUP_DEADLINE overrides
# it), so the trial gets its whole grace to checkpoint before Kubernetes' SIGKILL.
set -u
trial_dir=${TRIALKIT_TRIAL_DIR:-${NNI_SYS_DIR:-$PWD}}
pidfile=$trial_dir/.trialkit/keeper.pid

{ read -r pid started grace <"$pidfile"; } 2>/dev/null || exit 0
case "$pid$started" in '' | *[!0-9]*) exit 0 ;; esac
deadline=${TRIALKIT_CLEANUP_DEADLINE:-$(awk -v g="${grace:-25}" 'BEGIN { print g + 6 }')}
tenths=$(awk -v d="$deadline" 'BEGIN { printf "%d", d * 10 }')

# Still our keeper: not gone, not a zombie waiting to be reaped, and started
# when the pidfile says. Builtins only: the wait loop must not fork.
keeper_alive() {
  { read -r stat <"/proc/$pid/stat"; } 2>/dev/null || return 1
  set -- ${stat##*) }
  [ "$1" != Z ] && [ "${20}" = "$started" ]
}

keeper_alive || exit 0
kill -TERM "$pid" 2>/dev/null || exit 0
waited=0
while keeper_alive && [ "$waited" -lt "$tenths" ]; do
  sleep 0.1
  waited=$((waited + 1))
done
exit 0
