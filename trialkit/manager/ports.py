"""A server that went back to the port of an experiment's last run (`trialkit ui ID`, `experiment resume ID`)
and found it taken serves on a free one instead: this is the one line that says so, with who holds the port
where this user may see it."""
from __future__ import annotations

from typing import Optional


def holder(port: int) -> Optional[str]:
    """Who has TCP `port` open on this machine ("NAME, pid N"), where this user may see its sockets; else None."""
    import psutil  # only on this rare path: it reads every process's sockets

    try:
        pids = [conn.pid for conn in psutil.net_connections(kind="tcp") if conn.laddr and conn.laddr.port == port
                and conn.pid]
    except (psutil.Error, OSError):
        return None
    for pid in pids:
        try:
            return f"{psutil.Process(pid).name()}, pid {pid}"
        except psutil.Error:
            continue  # ended since
    return None


def moved(port: int, who: Optional[str], url: str) -> str:
    """The line a server that serves at `url` prints because `port`, its run's, is taken (`who`: `holder`'s)."""
    by = f" (by {who})" if who else ""
    return f"port {port} is taken{by}; serving at {url} instead; --port N to choose"
