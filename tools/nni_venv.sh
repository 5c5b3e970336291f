#!/usr/bin/env bash
# Creates (once) a venv holding the real nni 3.0, for the compatibility tests
# and the SDK benchmark, and prints its python's path.
# Usage: nni_venv.sh [PYTHON] [CACHE_DIR]
# Why a venv of its own: nni 3.0 pins old versions of packages that trialkit's
# environment shares (typeguard<4.1.3, filelock<3.12), so it cannot live in .venv.
# Reused while its stamp matches this script; rebuilt when the script changes.
set -euo pipefail
python=${1:-python3}
cache=${2:-${TRIALKIT_CACHE:-$HOME/.cache/trialkit}}
venv=$cache/nni-3.0-venv
constraints=$(cd "$(dirname "$0")/.." && pwd)/constraints.txt
stamp=$(sha256sum "$0" | cut -c1-16)
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "$venv/bin/python"; exit 0
fi
echo "nni_venv: preparing $venv (once)" >&2
rm -rf "$venv"
"$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q -c "$constraints")
"${pip[@]}" --upgrade pip 'setuptools<81' >&2
"${pip[@]}" nni==3.0 >&2
"$venv/bin/python" -c 'import nni; nni.get_next_parameter' >&2
echo "$stamp" > "$venv/.stamp"
echo "$venv/bin/python"
