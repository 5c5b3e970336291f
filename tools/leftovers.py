"""Processes found by a tag in their environment, and ended when they outstay a grace.

Whoever starts work (a test: tests/conftest.py; a GPU check: tools/gpu_check)
puts NAME=VALUE in its environment; every process that inherits it carries it,
even one that left its group or was orphaned. `end(NAME, VALUE, grace)` waits
the grace for them to end by themselves, then kills what is left and says
what that was.
"""
from __future__ import annotations

import os
import time
from typing import List

import psutil


def tagged(name: str, value: str) -> List[psutil.Process]:
    """The live processes (no zombie, not this one) whose environment holds name=value."""
    found = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            if proc.environ().get(name) == value and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


def end(name: str, value: str, grace: float) -> List[str]:
    """Wait up to `grace` seconds for the tagged processes to end; kill the rest: "PID COMMAND" of each."""
    deadline = time.monotonic() + grace
    left = tagged(name, value)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = tagged(name, value)
    described = []
    for proc in left:
        try:
            described.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
            proc.kill()
        except psutil.Error:
            pass
    return described
