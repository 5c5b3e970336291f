#!/usr/bin/env bash
# Creates (once) a venv holding scikit-learn and NOT nni, and prints its python's path:
# the interpreter a user of NNI's sklearn examples brings when nni is not installed
# (tests/test_nni_examples.py runs those examples there, unchanged, under trialkit).
# Usage: sklearn_venv.sh [PYTHON] [CACHE_DIR]
# Reused while its stamp matches this script; rebuilt when the script changes.
set -euo pipefail
python=${1:-python3}
cache=${2:-${TRIALKIT_CACHE:-$HOME/.cache/trialkit}}
venv=$cache/sklearn-venv
constraints=$(cd "$(dirname "$0")/.." && pwd)/constraints.txt
stamp=$(sha256sum "$0" | cut -c1-16)
mkdir -p "$cache"
# One maker at a time: the test workers that need it ask at once on a fresh machine, and one's rm -rf would pull
# the venv from under the other's ensurepip.
exec 9>"$cache/sklearn-venv.lock"
flock 9
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "$venv/bin/python"; exit 0
fi
echo "sklearn_venv: preparing $venv (once)" >&2
rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q -c "$constraints" scikit-learn >&2
"$venv/bin/python" -c 'import sklearn.svm' >&2
if "$venv/bin/python" -c 'import nni' 2>/dev/null; then echo "sklearn_venv: nni is installed there" >&2; exit 1; fi
echo "$stamp" > "$venv/.stamp"
echo "$venv/bin/python"
