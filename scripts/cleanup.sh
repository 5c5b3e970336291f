#!/bin/sh
# trialkit's preStop hook: ask the keeper to stop the trial, wait until it has
# exited or the deadline has passed, and always exit 0 within that bound.
# The deadline is the keeper's grace plus its flush time, so the trial gets its
# whole grace to checkpoint before Kubernetes' own SIGKILL.
set -u
trial_dir=${TRIALKIT_TRIAL_DIR:-${NNI_SYS_DIR:-$PWD}}
grace=${TRIALKIT_GRACE_SECONDS:-25}
deadline=${TRIALKIT_CLEANUP_DEADLINE:-$(awk -v g="$grace" 'BEGIN { printf "%d", g + 6 }')}
pidfile=$trial_dir/.trialkit/keeper.pid

pid=$(cat "$pidfile" 2>/dev/null) || exit 0
case "$pid" in ''|*[!0-9]*) exit 0 ;; esac
# The pid may have been reused since the keeper exited: check it is a keeper.
grep -q trialkit.keeper "/proc/$pid/cmdline" 2>/dev/null || exit 0

kill -TERM "$pid" 2>/dev/null || exit 0
waited=0
# Tenths of a second: short enough to leave as soon as the keeper is gone.
while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt $((deadline * 10)) ]; do
  sleep 0.1
  waited=$((waited + 1))
done
exit 0
