#!/usr/bin/env bash
# Fills .whl/ (git-ignored) with the wheels tools/gpu_check.sh installs on a GPU
# machine whose Python (3.12, x86-64) has CUDA torch, aiohttp, psutil, PyYAML,
# requests, numpy, ninja, pathspec and the rest of a CUDA image's usual set, but
# none of what DeepSpeed and optuna (the TPE tuner) need beyond that, and no
# way to fetch them there.
#   bash tools/gpu_wheels.sh          # about 15 MB; run from any directory, with the network
# DeepSpeed is an sdist on PyPI: its wheel is built here, pure Python, without
# its CUDA ops (DS_BUILD_OPS=0), which it then compiles on the GPU machine with
# its JIT (the check times that build).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}  # ./bootstrap.sh makes it; any Python with pip and setuptools will do
[ -x "$py" ] || py=python3
dest=.whl
target=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
        --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
        --platform manylinux1_x86_64)
# One version of each (two would stop the install there), the ones this checkout's tests run with.
# typing-extensions travels because pydantic needs a newer one than a CUDA image may hold.
WHEELS=(
  hjson==3.1.0
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  typing-extensions==4.16.0
  optuna==5.0.0 alembic==1.20.1 sqlalchemy==2.1.9 mako==1.4.3 colorlog==6.12.0
  orjson==3.13.0
)

rm -rf "$dest"
mkdir -p "$dest"
DS_BUILD_OPS=0 "$py" -m pip wheel -q --no-deps --no-build-isolation -w "$dest" deepspeed==0.19.8
"$py" -m pip download -q --no-deps --only-binary=:all: "${target[@]}" -d "$dest" "${WHEELS[@]}"
ls -1 "$dest"
du -sh "$dest"
