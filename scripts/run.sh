#!/bin/sh
# trialkit's container entrypoint.
#   run.sh [COMMAND [ARGS...]]    (no arguments: the keeper runs the command line in $TRIALKIT_COMMAND)
# Prepares the trial's dirs, checks that the image has a usable Python 3,
# fetches from the manager what the pod lacks (trialkit's trial side when the
# image cannot import it, the experiment's code when the platform shipped it:
# scripts/fetch.py, by digest), then execs the keeper, so that in a container the
# keeper is PID 1 and receives the pod's SIGTERM itself. The keeper sources
# startup-hook.sh from the code dir, when there is one, before the command (a
# failing hook fails the trial, its output in the logs).
set -eu

trial_dir=${TRIALKIT_TRIAL_DIR:-${NNI_SYS_DIR:-$PWD}}
export TRIALKIT_TRIAL_DIR="$trial_dir"
python=${TRIALKIT_PYTHON:-python3}
# No program runs on a local trial's way to its keeper (each one a fork and an exec, 1 to 3 ms): the dir
# that what is written here goes to is made where it is written (the keeper makes it too).
case $0 in
  */*) scripts_dir=${0%/*} ;;
  *) scripts_dir=. ;;
esac
# Kubernetes shows this file's text as the container's termination message:
# how a trial that fails before its keeper runs tells the platform why.
termination_log=${TRIALKIT_TERMINATION_LOG:-/dev/termination-log}

# A pod that takes no envFrom (a TrainJob's) mounts its Secrets under $TRIALKIT_ENV_FROM_DIR, one subdir each:
# their keys become variables here, as envFrom makes them (a variable the pod sets itself wins, as there; a key
# that is no variable name is skipped). Globs skip the volume's own ..data entries.
if [ -n "${TRIALKIT_ENV_FROM_DIR:-}" ]; then
  for file in "$TRIALKIT_ENV_FROM_DIR"/*/*; do
    name=${file##*/}
    case $name in
      [!A-Za-z_]* | *[!A-Za-z0-9_]*) continue ;;
    esac
    eval "set_before=\${$name+1}"
    if [ -f "$file" ] && [ -z "$set_before" ]; then
      value=$(cat "$file"; echo .)  # the dot keeps a value's trailing newlines
      export "$name=${value%.}"
    fi
  done
fi

# give_up EXIT_CODE REASON DETAIL: the trial fails before it starts, REASON in its status.
give_up() {
  echo "run.sh: $2: $3" >&2
  echo "run.sh: $2: $3" >>"$trial_dir/stderr.log" 2>/dev/null || true
  if [ -w "$termination_log" ] || [ -n "${TRIALKIT_TERMINATION_LOG:-}" ]; then
    echo "$2: $3" >"$termination_log" 2>/dev/null || true
  fi
  mkdir -p "$trial_dir/.trialkit" 2>/dev/null || true
  printf '{"status": "FAILED", "exit_code": %d, "reason": "%s", "history": []}\n' \
    "$1" "$2" >"$trial_dir/.trialkit/status.json"
  exit "$1"
}

no_python() {
  give_up 127 "no usable Python in the image" \
    "$python $1; install python3 (3.9 or later) in the image, or set TRIALKIT_PYTHON to one"
}
command -v "$python" >/dev/null 2>&1 || no_python "is not found"

# Until it execs the keeper this script is the container's PID 1, to which the kernel delivers no signal it
# has no handler for: a pod deleted while it fetches (podman stop, the kubelet's SIGTERM) would wait out its
# whole grace and end by SIGKILL. Its SIGTERM or SIGINT ends it at once, and what it runs, as 128+N.
child=
stopped() {
  [ -z "$child" ] || kill -TERM "$child" 2>/dev/null || true
  exit "$1"
}
trap 'stopped 143' TERM
trap 'stopped 130' INT

# fetch DIGEST DEST WHAT: one archive from the manager into DEST (kept: a restarted container reuses it).
# fetch.py runs in the background, waited for: a trap runs at once during `wait`, not after a foreground child.
fetch() {
  mkdir -p "$trial_dir/.trialkit"
  said="$trial_dir/.trialkit/fetch.out"
  "$python" "$scripts_dir/fetch.py" "$1" "$2" >"$said" 2>&1 &
  child=$!
  code=0
  wait "$child" || code=$?
  child=
  detail=$(cat "$said")
  rm -f "$said"
  [ "$code" -eq 0 ] || give_up 1 "$3 could not be fetched from the manager" "$detail"
}

if [ -n "${TRIALKIT_TRIALSIDE_DIGEST:-}" ]; then
  # In a pod: one start of the image's Python says whether it is usable (3.9+, exit 3 if not) and whether it
  # imports trialkit's keeper (exit 1 if not: the trial side is fetched and put on PYTHONPATH).
  found=0
  "$python" -c 'import sys
if sys.version_info < (3, 9): sys.exit(3)
import trialkit.keeper' >/dev/null 2>&1 || found=$?
  case $found in
    0) ;;
    1)
      trial_side="$trial_dir/.trialkit/trialside/$TRIALKIT_TRIALSIDE_DIGEST"
      fetch "$TRIALKIT_TRIALSIDE_DIGEST" "$trial_side" "trialkit's trial side (the image has no trialkit)"
      export PYTHONPATH="$trial_side${PYTHONPATH:+:$PYTHONPATH}"  # the keeper's, and the training code's
      ;;
    3) no_python "is older than 3.9" ;;
    *) no_python "does not run (exit code $found)" ;;
  esac
fi

if [ -n "${TRIALKIT_CODE_DIGEST:-}" ]; then
  fetch "$TRIALKIT_CODE_DIGEST" "$trial_dir/code" "the experiment's code"
  export TRIALKIT_CODE_DIR="$trial_dir/code"
fi

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

# startup-hook.sh is the keeper's to source (--startup-hook), in the trial's own process group just before
# the command: its exports reach the trial, and what it starts is stopped with the trial, within its grace.
if [ "$#" -gt 0 ]; then
  set -- -- "$@"
fi
if [ -f ./startup-hook.sh ]; then
  set -- --startup-hook ./startup-hook.sh "$@"
fi
# The keeper runs as `-m trialkit.keeper` would, with the code dir off sys.path: a folder named trialkit there
# would be taken for trialkit itself (trialkit/process.py's RUN_MODULE_OFF_CWD, the same code; -c, not -P: the
# image's Python may be older than 3.11).
exec "$python" -c 'import runpy, sys; getattr(sys.flags, "safe_path", 0) or sys.path.pop(0); runpy.run_module(sys.argv.pop(1), run_name="__main__", alter_sys=True)' \
  trialkit.keeper "$@"  # no command: it reads $TRIALKIT_COMMAND itself
