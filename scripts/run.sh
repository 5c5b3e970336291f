#!/bin/sh
# trialkit's container entrypoint.
#   run.sh [COMMAND [ARGS...]]    (no arguments: the keeper runs the command line in $TRIALKIT_COMMAND)
# Prepares the trial's dirs, sources startup-hook.sh from the code dir when
# there is one (a failing hook fails the trial, its output in the logs), then
# execs the keeper, so that in a container the keeper is PID 1 and receives the
# pod's SIGTERM itself.
set -eu

trial_dir=${TRIALKIT_TRIAL_DIR:-${NNI_SYS_DIR:-$PWD}}
export TRIALKIT_TRIAL_DIR="$trial_dir"
mkdir -p "$trial_dir/.trialkit"
python=${TRIALKIT_PYTHON:-python3}

code_dir=${TRIALKIT_CODE_DIR:-${NNI_CODE_DIR:-}}
if [ -n "$code_dir" ]; then
  cd "$code_dir"
fi

if [ "$#" -eq 0 ]; then
  if [ -z "${TRIALKIT_COMMAND:-}" ]; then
    echo "run.sh: no command: pass one as arguments or set TRIALKIT_COMMAND" >&2
    exit 2
  fi
fi

hook=./startup-hook.sh
if [ -f "$hook" ]; then
  hook_failed() {
    status=$?
    echo "run.sh: startup-hook.sh failed with exit code $status; the trial does not start. Its output:" >&2
    cat "$trial_dir/startup-hook.log" >&2 || true
    cat "$trial_dir/startup-hook.log" >>"$trial_dir/stderr.log" 2>/dev/null || true
    printf '{"status": "FAILED", "exit_code": %d, "reason": "startup-hook.sh failed", "history": []}\n' \
      "$status" >"$trial_dir/.trialkit/status.json"
  }
  trap hook_failed EXIT
  # Sourced, so what it exports reaches the trial; set -e makes any failing line fatal.
  { . "$hook"; } >"$trial_dir/startup-hook.log" 2>&1
  trap - EXIT
fi

if [ "$#" -eq 0 ]; then
  exec "$python" -m trialkit.keeper  # it reads $TRIALKIT_COMMAND itself
fi
exec "$python" -m trialkit.keeper -- "$@"
