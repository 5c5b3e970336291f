#!/usr/bin/env bash
# Builds horovod 0.28.1 for torch 2.13 (CPU, gloo) once and caches the wheel.
# Usage: build_horovod.sh PYTHON CACHE_DIR   -> prints the wheel's path
# Why a build: horovod ships only an sdist, and 0.28.1 compiles against torch
# 2.13 only with C++17 (its CMake files ask for C++14).
set -euo pipefail
python=$1
cache=$2
hvd=0.28.1
torch=$("$python" -c 'import torch; print(torch.__version__.split("+")[0])')
pyver=$("$python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
out=$cache/wheels/horovod-$hvd-torch$torch-$pyver
existing=$(ls "$out"/horovod-*.whl 2>/dev/null | head -n1 || true)
if [ -n "$existing" ]; then echo "$existing"; exit 0; fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "bootstrap: building horovod $hvd for torch $torch (a few minutes, once)" >&2
"$python" -m pip download -q --no-deps --no-binary :all: "horovod==$hvd" -d "$work" >&2
tar -xzf "$work"/horovod-$hvd.tar.gz -C "$work"
src=$work/horovod-$hvd
sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j"$(nproc)" \
  "$python" -m pip wheel -q --no-deps --no-build-isolation "$src" -w "$work/dist" >&2
mkdir -p "$out"
cp "$work"/dist/horovod-*.whl "$out"/
ls "$out"/horovod-*.whl | head -n1
