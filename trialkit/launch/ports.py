"""A port for a rendezvous that another process listens on a moment later (a single node's chief, rank 0's root).

The port bind(("", 0)) gives lies in the kernel's ephemeral range, which it also hands every outgoing connection as
its local port: in the seconds between the pick and the trainer's own bind, any connection the machine makes may
take it (an AdaptDL root then could not listen, and its rank 0 connected to whatever held the port: Broken pipe, in
a full suite at load 7). A port below that range is taken only by a program that binds it by number.
"""
from __future__ import annotations

import random
import socket

LOWEST = 10000  # below: well-known and registered services' ports
_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
_TRIES = 64


def rendezvous_port(addr: str = "") -> int:
    """A port free on `addr` now, below the ephemeral range where one is free there, else the kernel's pick.
    OSError when `addr` cannot be bound at all (not this machine's address)."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET  # TRIALKIT_CHIEF_ADDR=::1
    chooser = random.SystemRandom()  # not the trial's seeded `random`: two trials seeded alike would pick alike
    top = _ephemeral_low()
    candidates = [chooser.randrange(LOWEST, top) for _ in range(_TRIES)] if top > LOWEST else []
    for port in candidates + [0]:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((addr, port))
            except OSError:
                if port == 0:
                    raise
                continue
            return sock.getsockname()[1]
    raise AssertionError("unreachable: bind to port 0 returns or raises")


def _ephemeral_low() -> int:
    try:
        with open(_RANGE_FILE) as lines:
            return int(lines.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default
