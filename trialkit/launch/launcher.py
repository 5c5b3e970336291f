"""What every launcher's main does around its engine's command line.

A launcher module holds a pure `build_command(...)` for its engine and a main
that reads as the story: `setup` (arguments and topology, one-line errors),
build the engine's argv, `supervise` it (trialkit.launch.supervisor).
"""
from __future__ import annotations

import importlib.util
import os
import signal
import sys
from typing import List, Optional, Sequence, Tuple

from trialkit import env
from trialkit import trial as trials
from trialkit.errors import UserError, report_and_exit
from trialkit.launch import discover, grammar, leftovers
from trialkit.launch.ports import rendezvous_port
from trialkit.launch.supervisor import Supervisor

WRAP_RANK = "trialkit.launch.wrap_rank"


def setup(prog: str, engine: str, argv: Optional[Sequence[str]],
          needs: Tuple[str, str] = ("", "")) -> Tuple[grammar.Launch, env.Topology]:
    """Parse the shared grammar, check that the engine's package (`needs`: its module, how to install it) is
    here and read the topology; a mistake exits 2 with one line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if grammar.wants_help(argv):
        print(grammar.usage(prog, engine))
        raise SystemExit(0)
    try:
        launch = grammar.parse(argv, engine)
        check_installed(*needs)
        if launch.trial:
            trials.check_spec(launch.trial)
        topo = env.topology(discover.with_chief(os.environ))
        if topo.chief_port is None:
            topo = topo._replace(chief_port=free_port(topo.chief_addr))
    except UserError as err:
        report_and_exit(prog, err)
    return launch, topo


def check_installed(module: str, how: str) -> None:
    """Found, not imported: the launcher starts in milliseconds (torch alone takes seconds to import)."""
    if module and importlib.util.find_spec(module) is None:
        raise UserError(f"{module} is not installed here", fix=f"install it with {how}")


def wrapped(rank_vars: str, launch: grammar.Launch, python: str = sys.executable) -> List[str]:
    """`-m wrap_rank RANK -- <the user's code>`: what follows the engine's Python for each worker."""
    return ["-m", WRAP_RANK, rank_vars, "--", *grammar.worker_command(launch, python)]


def supervise(prog: str, engine: str, launch: grammar.Launch, topo: env.Topology, command: Sequence[str],
              stop_signal: int = signal.SIGTERM) -> int:
    """Run the engine under the fail-fast supervisor; the workers see the topology in trialkit's names."""
    environ = {**os.environ, **topo.environ()}
    leftovers.remove_when_gone(environ)  # before the supervisor is a subreaper (see Supervisor.run)
    supervisor = Supervisor(prog, engine, launch.describe(), env.read().grace_seconds,
                            stop_signal=stop_signal, overrides=launch.overrides)
    return supervisor.run(command, environ)


def free_port(addr: str) -> int:
    """A port free on addr now, for a single node's rendezvous (a fixed one collides between trials)."""
    try:
        return rendezvous_port(addr)
    except OSError as err:
        raise UserError(f"cannot listen on {addr}: {err.strerror or err}", env.CHIEF_ADDR,
                        "give this node's own address, or leave it unset on one node") from None
