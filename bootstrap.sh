#!/usr/bin/env bash
# The project's one entry point for a fresh machine.
#   ./bootstrap.sh demo   install, then run the quickstart experiment
#   ./bootstrap.sh test   install, then run the whole test suite
# The environment lives in .venv; it is rebuilt only when the inputs change.
set -euo pipefail
cd "$(dirname "$0")"
root=$PWD
cache=${TRIALKIT_CACHE:-$HOME/.cache/trialkit}
venv=$root/.venv
py=${PYTHON:-python3}
mkdir -p "$cache"

stamp_of() { cat setup.py constraints.txt bootstrap.sh tools/build_horovod.sh tools/nni_venv.sh | sha256sum | cut -c1-16; }

install_venv() {
  local stamp; stamp=$(stamp_of)
  if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.trialkit-stamp" 2>/dev/null)" = "$stamp" ]; then
    return 0
  fi
  echo "bootstrap: preparing $venv" >&2
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
  local pip=("$venv/bin/python" -m pip install -q -c "$root/constraints.txt")
  "${pip[@]}" --upgrade pip wheel 'setuptools<81'
  "${pip[@]}" torch==2.13.0
  "${pip[@]}" -e "$root[all,test]"
  local whl; whl=$(bash tools/build_horovod.sh "$venv/bin/python" "$cache")
  "${pip[@]}" "$whl"
  bash tools/nni_venv.sh "$py" "$cache" >/dev/null  # the real nni 3.0, for the compatibility tests
  echo "$stamp" > "$venv/.trialkit-stamp"
}

# What only the tests use besides: object storage for checkpoints and its S3 server (the demo installs neither).
install_test_extras() {
  local stamp; stamp=$(stamp_of)
  [ "$(cat "$venv/.trialkit-test-stamp" 2>/dev/null)" = "$stamp" ] && return 0
  "$venv/bin/python" -m pip install -q -c "$root/constraints.txt" -e "$root[checkpoints,checkpoint-tests]"
  echo "$stamp" > "$venv/.trialkit-test-stamp"
}

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
    install_venv
    # Trials run on the user's PATH: the quickstart's `python3` is the project's.
    PATH="$venv/bin:$PATH" exec "$venv/bin/trialkit" run examples/quickstart/config.yml
    ;;
  test)
    install_venv
    install_test_extras
    install_browser
    install_podman
    # DeepSpeed compiles its CPU communication op on first use (minutes): keep
    # the build with trialkit's cache, keyed by the versions that shape it.
    export TORCH_EXTENSIONS_DIR="$cache/torch_extensions/deepspeed-0.19.8-torch-2.13.0"
    shift
    exec "$venv/bin/python" -m pytest "$@"
    ;;
  *)
    echo "usage: ./bootstrap.sh demo|test [pytest args...]" >&2
    exit 2
    ;;
esac
