"""Connecting to a Ray cluster, with one-line errors for what users get wrong:
a bad address, a cluster that cannot be reached, and a cluster whose Python or
Ray version differs from this machine's (Ray cannot work across them).

ray is imported lazily: trialkit's core never needs it.
"""
from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from typing import Any, Dict, Optional

from trialkit.errors import UserError

AUTO = "auto"
CLIENT_SCHEME = "ray://"
PROBE_TIMEOUT = 5.0  # a reachable head answers a TCP connect in milliseconds
FORMS = "use ray://HOST:10001 for Ray Client, HOST:6379 for the head's GCS, or auto for a cluster on this machine"
_VERSIONS = re.compile(r"Ray: (\S+)\s+Python: (\S+)")


@dataclass(frozen=True)
class Address:
    text: str  # as the user wrote it, which is what ray.init takes
    host: Optional[str]  # None for auto
    port: Optional[int]


def parse_address(text: str, where: str) -> Address:
    if text == AUTO:
        return Address(text, None, None)
    rest = text[len(CLIENT_SCHEME):] if text.startswith(CLIENT_SCHEME) else text
    host, sep, port = rest.rpartition(":")
    if not sep or not host or "/" in rest or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"cannot read Ray address {text!r}", where, FORMS)
    return Address(text, host.strip("[]"), int(port))


def connect(address: Address, where: str, **init_options: Any) -> None:
    """ray.init(address, **init_options), or a UserError saying what is wrong."""
    if address.host is not None:
        _probe(address, where)
    import ray

    try:
        ray.init(address=address.text, **init_options)
    except ConnectionError as err:
        raise UserError(f"cannot connect to the Ray cluster at {address.text}: {_first_line(err)}", where,
                        _connection_fix(address, str(err))) from None
    except RuntimeError as err:
        mismatch = version_mismatch(str(err))
        if mismatch is None:
            raise
        raise UserError(mismatch, where, "run it with the cluster's Python and Ray, e.g. in the cluster's image") \
            from None


def _probe(address: Address, where: str) -> None:
    # ray.init retries an unreachable address for a long while; a plain TCP
    # connect tells the user in seconds.
    try:
        socket.create_connection((address.host, address.port), timeout=PROBE_TIMEOUT).close()
    except OSError as err:
        reason = err.strerror or type(err).__name__.replace("Error", " error").lower()
        raise UserError(f"cannot reach the Ray cluster at {address.text} ({reason})", where,
                        "check the address, and that the head node is up and its port is open to this machine") \
            from None


def version_mismatch(message: str) -> Optional[str]:
    """One line out of Ray's version-mismatch error, or None if `message` is not one."""
    found = _VERSIONS.findall(message)
    if "version mismatch" not in message.lower() or len(found) < 2:
        return None
    (cluster_ray, cluster_python), (own_ray, own_python) = found[:2]
    return (f"the cluster runs Python {cluster_python} with Ray {cluster_ray}, "
            f"but this machine runs Python {own_python} with Ray {own_ray}")


def _connection_fix(address: Address, message: str) -> str:
    if address.host is None:
        return "start one with `ray start --head`, or give its address"
    if "Initialization failure from server" in message:
        # Ray Client's proxy forks its session server while gRPC threads run; with
        # gRPC's fork support on, that child often crashes (mostly a fresh head's first session).
        return "Ray Client's server could not start a session: run again, and start the head with " \
               "GRPC_ENABLE_FORK_SUPPORT=0 in its environment to avoid it"
    return "check the address and that the cluster is up"


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def runtime_env(working_dir: Optional[str], extra: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """A runtime environment that ships `working_dir` to every worker."""
    out = dict(extra or {})
    if working_dir:
        out["working_dir"] = working_dir
    return out
