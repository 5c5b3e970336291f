#!/usr/bin/env bash
# The project's one entry point for a fresh machine.
#   ./bootstrap.sh demo   install what the demo runs (torch, trialkit and its control extra), then run the
#                         quickstart experiment
#   ./bootstrap.sh test   install everything (the engines, the platforms, horovod built for torch, NNI 3.0's own
#                         venv, the browser and podman), then run the test suite with any pytest arguments
# Both keep the environment in .venv, made when missing and reused while it is current. Its stamp says which
# inputs it was made from and how far: demo, or full. `test` after `demo` completes it; `demo` after `test`
# reuses it; a change to setup.py, the pins or these scripts installs again over it.
set -euo pipefail
cd "$(dirname "$0")"
root=$PWD
cache=${TRIALKIT_CACHE:-$HOME/.cache/trialkit}
venv=$root/.venv
stamp_file=$venv/.trialkit-stamp
py=${PYTHON:-python3}
mkdir -p "$cache"

inputs() { cat setup.py constraints.txt bootstrap.sh tools/build_horovod.sh tools/nni_venv.sh | sha256sum | cut -c1-16; }

# The level .venv holds for the current inputs: full, demo or none.
level() {
  local stamp= held=
  [ -x "$venv/bin/python" ] && read -r stamp held <"$stamp_file" 2>/dev/null || true
  if [ -n "$stamp" ] && [ "$stamp" = "$(inputs)" ]; then echo "${held:-none}"; else echo none; fi
}

# step N TOTAL WHAT: a numbered line saying what comes, and when the last step ended, how long it took.
step_started=
step() {
  [ -z "$step_started" ] || echo "bootstrap:       done in $((SECONDS - step_started)) s" >&2
  step_started=$SECONDS
  [ "$1" = end ] || echo "bootstrap: [$1/$2] $3" >&2
}

venv_pip() { "$venv/bin/python" -m pip install --progress-bar on -c "$root/constraints.txt" "$@"; }

# venv_pip with its output in a log that only a failure shows (its last lines, and where the rest is): an
# editable install's build prints setuptools' "Editable installation" banner, which pip's -q does not hold back,
# among the numbered steps. On a terminal one line, rewritten in place, says how far pip got meanwhile.
venv_pip_logged() {
  local log=$venv/.bootstrap-pip.log code=0
  if [ -t 2 ]; then
    venv_pip "$@" 2>&1 | tee "$log" | pip_progress || code=${PIPESTATUS[0]}
  else
    venv_pip "$@" >"$log" 2>&1 || code=$?
  fi
  [ "$code" = 0 ] && return 0
  tail -n 40 "$log" >&2
  echo "bootstrap: pip failed (exit $code); its whole output: $log" >&2
  return "$code"
}

# pip_progress: pip's output on stdin; the package it is collecting, and how many so far, on one line of stderr.
pip_progress() {
  local n=0 line
  while IFS= read -r line; do
    case $line in
      Collecting*) n=$((n + 1)); printf '\rbootstrap:       %d packages, collecting %-40.40s' "$n" "${line#Collecting }" >&2 ;;
    esac
  done
  [ "$n" = 0 ] || printf '\r%-90s\r' '' >&2
}

# install_venv demo|full
install_venv() {
  local want=$1 have; have=$(level)
  if [ "$have" = full ] || [ "$have" = "$want" ]; then
    return 0
  fi
  local total=3; [ "$want" = full ] && total=6
  local n=0
  if [ "$have" = none ]; then
    step $((n += 1)) $total "$venv: a virtual environment with pip, wheel and setuptools<81"
    [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
    rm -f "$stamp_file"
    venv_pip -q --upgrade pip wheel 'setuptools<81'
    step $((n += 1)) $total "torch 2.13.0, the CPU build (the largest part)"
    venv_pip torch==2.13.0
    step $((n += 1)) $total "trialkit and its control extra: optuna (tuners), aiohttp and orjson (the manager), \
plotly and matplotlib (the page, plots), pathspec, tensorboardX"
    venv_pip_logged -e "$root[control]"
    echo "$(inputs) demo" >"$stamp_file"
  else
    n=3
  fi
  if [ "$want" = full ]; then
    step $((n += 1)) $total "the engines and platforms (deepspeed, adaptdl, ray, kubernetes, object storage), the docs and test tools"
    venv_pip_logged -e "$root[all,test]"
    step $((n += 1)) $total "horovod 0.28.1 for this torch (built from source once, a few minutes; then cached in $cache)"
    local whl; whl=$(bash tools/build_horovod.sh "$venv/bin/python" "$cache")
    venv_pip -q "$whl"
    step $((n += 1)) $total "NNI 3.0 in a venv of its own, for the compatibility tests (once; cached in $cache)"
    bash tools/nni_venv.sh "$py" "$cache" >/dev/null
    echo "$(inputs) full" >"$stamp_file"
  fi
  step end
}

# The checkout's own sources compiled, as a wheel's install compiles them: an editable install leaves that to each
# process, and where PYTHONDONTWRITEBYTECODE is set (this machine's shells) every keeper and trial compiled
# trialkit anew at its start, 40 ms and more at load 10 (bench/bench_search.py's history). Unchanged files cost a
# stat each.
compile_sources() { "$venv/bin/python" -m compileall -q -j 0 "$root/trialkit" >/dev/null; }

# Headless Chromium and its driver for the web page's tests (Debian's packages: the two always match).
install_browser() {
  [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] && return 0
  local sudo=; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -q && $sudo apt-get install -y -q chromium chromium-driver
}

# podman, runc and debootstrap for the container tests (-m containers): images/build.sh
# makes the trial image with them, offline (images/podman.sh holds their settings).
install_podman() {
  command -v podman >/dev/null && command -v runc >/dev/null && command -v debootstrap >/dev/null && return 0
  local sudo=; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -q && $sudo apt-get install -y -q podman runc debootstrap
}

case "${1:-}" in
  demo)
    install_venv demo
    compile_sources
    echo "bootstrap: running the quickstart: trialkit run examples/quickstart/config.yml" >&2
    code=0
    # Trials run on the user's PATH: the quickstart's `python3` is the project's.
    PATH="$venv/bin:$PATH" "$venv/bin/trialkit" run examples/quickstart/config.yml || code=$?
    echo "bootstrap: trialkit is in .venv; to run it as \`trialkit\` in this shell: . .venv/bin/activate" >&2
    exit "$code"
    ;;
  test)
    install_venv full
    compile_sources
    install_browser
    install_podman
    # DeepSpeed compiles its CPU communication op on first use (minutes): keep
    # the build with trialkit's cache, keyed by the versions that shape it.
    export TORCH_EXTENSIONS_DIR="$cache/torch_extensions/deepspeed-0.19.8-torch-2.13.0"
    # A build killed mid-compile leaves its lock, and torch then waits on it for ever: every DeepSpeed test of every
    # later run hung. No build takes 30 minutes here; an older lock is a dead build's.
    find "$TORCH_EXTENSIONS_DIR" -name lock -mmin +30 -delete 2>/dev/null || true
    shift
    # The suite runs in TRIALKIT_TEST_WORKERS pytest-xdist workers (most tests wait on processes, clusters and
    # containers more than they compute); tests/conftest.py groups what must run in one. `-n0` or
    # `-p no:xdist` among the arguments runs it in this process.
    workers=(-n "${TRIALKIT_TEST_WORKERS:-3}" --dist loadgroup)
    case " $* " in *" no:xdist "* | *" -pno:xdist "*) workers=() ;; esac
    exec "$venv/bin/python" -m pytest "${workers[@]}" "$@"
    ;;
  *)
    echo "usage: ./bootstrap.sh demo|test [pytest args...]" >&2
    exit 2
    ;;
esac
