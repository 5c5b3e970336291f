#!/usr/bin/env bash
# podman with trialkit's own configuration: `images/podman.sh ARGS...` runs
# `podman ARGS...` with a containers.conf and a storage.conf that this script
# writes under $TRIALKIT_CACHE/podman (default ~/.cache/trialkit/podman),
# pointed at by CONTAINERS_CONF and CONTAINERS_STORAGE_CONF, so nothing global
# changes and built images survive between runs (and in a CI cache).
# What this kind of machine needs (tested): runc, not crun (crun refuses a
# hybrid cgroup layout); cgroupfs, not systemd; no default ulimits (raising
# them needs CAP_SYS_RESOURCE); overlay storage; events in a file.
set -euo pipefail
cache=${TRIALKIT_CACHE:-$HOME/.cache/trialkit}
dir=$cache/podman
mkdir -p "$dir"
conf=$dir/containers.conf
storage=$dir/storage.conf
want_conf="[containers]
default_ulimits = []
[engine]
runtime = \"runc\"
cgroup_manager = \"cgroupfs\"
events_logger = \"file\"
events_logfile_path = \"$dir/events.log\""
want_storage="[storage]
driver = \"overlay\"
graphroot = \"$dir/storage\"
runroot = \"$dir/run\""
# Written only when different, so concurrent callers never see a half file.
write() {
  if [ "$(cat "$1" 2>/dev/null)" != "$2" ]; then
    printf '%s\n' "$2" >"$1.$$" && mv -f "$1.$$" "$1"
  fi
}
write "$conf" "$want_conf"
write "$storage" "$want_storage"
export CONTAINERS_CONF=$conf CONTAINERS_STORAGE_CONF=$storage
exec podman "$@"
