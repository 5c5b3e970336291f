#!/usr/bin/env bash
# Build the CPU trial image from images/Dockerfile.cpu with podman, offline,
# the way the test suite runs it:
#   images/build.sh [--torch]    prints the image's name (trialkit-cpu:local-HASH[-torch])
#   images/build.sh --base       prints the Debian base's name (the tests build a user's own image on it)
# - base: a Debian bookworm made by debootstrap (minbase + python3, python3-venv)
#   and `podman import`ed; no registry is needed. Its tarball is cached under
#   $TRIALKIT_CACHE/rootfs, keyed by the debootstrap line.
# - packages: trialkit's dependencies (and torch 2.13.0 with --torch) are
#   downloaded on the host by the project's pip (.venv, this machine's indexes)
#   with constraints.txt; the build runs with --network none and pip --no-index.
# - the image is tagged with a hash of its inputs (Dockerfile, the source tree
#   that goes in, constraints.txt, the base): an unchanged tree is not rebuilt.
# Needs podman, runc and debootstrap (`./bootstrap.sh test` installs them).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${TRIALKIT_CACHE:-$HOME/.cache/trialkit}
podman=$root/images/podman.sh
pip=${TRIALKIT_HOST_PYTHON:-$root/.venv/bin/python}
torch=
only_base=
case "${1:-}" in
  --torch) torch=torch==2.13.0 ;;
  --base) only_base=1 ;;
  "") ;;
  *) echo "usage: images/build.sh [--torch | --base]" >&2; exit 2 ;;
esac
log() { echo "build.sh: $*" >&2; }

# What goes into the image from the checkout (the Dockerfile's COPY lines).
SOURCES=(setup.py constraints.txt trialkit scripts launchers)

base_image() {
  local suite=bookworm packages=python3,python3-venv
  local key; key=$(echo "debootstrap --variant=minbase --include=$packages $suite" | sha256sum | cut -c1-12)
  local name=localhost/trialkit-debian:$suite-$key
  if "$podman" image exists "$name"; then echo "$name"; return; fi
  local tarball=$cache/rootfs/debian-$suite-$key.tar
  if [ ! -f "$tarball" ]; then
    log "making the Debian $suite rootfs (1-2 minutes, once)"
    local tmp; tmp=$(mktemp -d "$cache/rootfs-XXXXXX")
    debootstrap --variant=minbase --include="$packages" "$suite" "$tmp/root" >"$tmp/debootstrap.log" 2>&1 \
      || { cat "$tmp/debootstrap.log" >&2; rm -rf "$tmp"; exit 1; }
    rm -rf "$tmp/root/var/cache/apt/archives/"*.deb "$tmp/root/var/lib/apt/lists/"*
    mkdir -p "$cache/rootfs"
    tar -C "$tmp/root" --numeric-owner -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
    rm -rf "$tmp"
  fi
  "$podman" import -q "$tarball" "$name" >/dev/null
  echo "$name"
}

inputs_hash() {
  (cd "$root" && find "${SOURCES[@]}" images/Dockerfile.cpu -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 \
     | sort -z | xargs -0 sha256sum; echo "$1 $torch") | sha256sum | cut -c1-16
}

base=$(base_image)
if [ -n "$only_base" ]; then echo "$base"; exit 0; fi
tag=localhost/trialkit-cpu:local-$(inputs_hash "$base")${torch:+-torch}
if "$podman" image exists "$tag"; then echo "$tag"; exit 0; fi

log "building $tag"
context=$(mktemp -d "$cache/context-XXXXXX")
trap 'rm -rf "$context"' EXIT
(cd "$root" && cp -r "${SOURCES[@]}" images "$context/")
find "$context" -name __pycache__ -prune -exec rm -rf {} +
# Wheels of everything the image installs, from this machine's indexes, for an offline build.
"$pip" -m pip download -q -c "$root/constraints.txt" -d "$context/wheels" "$context[checkpoints]" 'setuptools<81' wheel \
  ${torch:+"$torch"} \
  2>"$context/pip.log" || { cat "$context/pip.log" >&2; exit 1; }
rm -f "$context/wheels/trialkit-"*
"$podman" build -q --network none -f "$context/images/Dockerfile.cpu" -t "$tag" \
  --build-arg BASE_IMAGE="$base" --build-arg TORCH="$torch" \
  --build-arg PIP_SOURCE="--no-index --find-links /tmp/pip" --build-arg TORCH_SOURCE="--no-index --find-links /tmp/pip" \
  "$context" >/dev/null
# Builds of older trees go once they are a few hours old (a test session still using one keeps it).
"$podman" images --filter reference=localhost/trialkit-cpu --filter until=3h --format '{{.Repository}}:{{.Tag}}' \
  | xargs -r "$podman" rmi >/dev/null 2>&1 || true
echo "$tag"
