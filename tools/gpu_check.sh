#!/usr/bin/env bash
# trialkit's GPU paths on a real GPU, as one table (docs/gpus.md says what each line proves).
#   bash tools/gpu_check.sh [--only NAME,...] [--budget SECONDS] [--device cpu]
# On a machine whose Python has CUDA torch but not trialkit's needs: first
# `bash tools/gpu_wheels.sh` on a machine with the network (fills .whl/), then
# this, which installs .whl/ and trialkit from this checkout into
# $GPU_CHECK_SITE (default /tmp/site) when .whl/ holds wheels. Without .whl/,
# $PYTHON (default python3) must have trialkit and its extras already.
# Without nvidia-smi every line is NO-GPU and the exit status 0.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
py=${PYTHON:-python3}
site=${GPU_CHECK_SITE:-/tmp/site}
export PYTHONUNBUFFERED=1

install() {
  # --no-deps --no-index: the machine fetches nothing; --no-build-isolation: setuptools as it is there.
  local pip=("$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site")
  local began=$SECONDS
  "${pip[@]}" .whl/*.whl || echo "gpu_check: installing .whl/ failed (the checks that need it will say so)" >&2
  "${pip[@]}" --no-build-isolation . || echo "gpu_check: installing trialkit from $PWD failed" >&2
  export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} PATH=$site/bin:$PATH
  echo "gpu_check: installed .whl/ and trialkit into $site in $((SECONDS - began)) s" >&2
}

rehearsal() { case " $* " in *" --device cpu "*|*" --device=cpu "*) return 0 ;; esac; return 1; }
if command -v nvidia-smi >/dev/null && compgen -G ".whl/*.whl" >/dev/null && ! rehearsal "$@"; then
  install
fi
exec "$py" tools/gpu_check/check.py "$@"
