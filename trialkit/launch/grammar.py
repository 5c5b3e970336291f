"""The command line every launcher shares (DESIGN.md):

    python -m trialkit.launch.NAME [[OVERRIDES...] --] (--trial TRIAL)|(SCRIPT...)

Overrides exist only when the first argument is an option other than
`--trial`, and they end at the first `--`. What follows is the training code:
`--trial TRIAL` alone, or a script that keeps every argument it was given, its
own `--` included (`train.py -- --lr 0.1` is a script, not overrides).
Everything here is pure: arguments in, a Launch or a UserError out.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import List, Optional, Sequence

from trialkit.errors import UserError

TRIAL_OPTION = "--trial"
RUN_TRIAL_MODULE = "trialkit.launch.run_trial"
DESCRIBE_LIMIT = 200  # a failure line names the script; a huge argv would drown it


@dataclass(frozen=True)
class Launch:
    overrides: tuple
    trial: Optional[str]
    script: tuple

    def describe(self) -> str:
        """The user's training code as they wrote it, for one-line messages."""
        text = f"{TRIAL_OPTION} {self.trial}" if self.trial else shlex.join(self.script)
        return text if len(text) <= DESCRIBE_LIMIT else text[: DESCRIBE_LIMIT - 3] + "..."


def usage(prog: str, engine: str) -> str:
    return (
        f"usage: python -m {prog} [[{engine.upper()}_OVERRIDES...] --] (--trial TRIAL)|(SCRIPT...)\n"
        f"  OVERRIDES   options for {engine}, after trialkit's own, so they win; end them with --\n"
        f"  --trial     package.module:Class or path/to/file.py:Class (a trialkit.Trial)\n"
        f"  SCRIPT      path/to/script.py [ARGS...] (run with this Python) or any command\n"
        f"Every worker runs under trialkit.launch.wrap_rank. One worker failing stops the others;\n"
        f"the launcher then exits with that worker's code and names its rank."
    )


def wants_help(argv: Sequence[str]) -> bool:
    return bool(argv) and argv[0] in ("-h", "--help") and "--" not in argv


def parse(argv: Sequence[str], engine: str) -> Launch:
    """Split a launcher's arguments into overrides and the training code."""
    argv = list(argv)
    if not argv:
        raise UserError("nothing to run", fix="give a script or --trial module:Class")
    overrides: List[str] = []
    rest = argv
    if _is_option(argv[0]) and not _is_trial(argv[0]):
        if "--" not in argv:
            raise UserError(f"unknown launcher option {argv[0]!r}",
                            fix=f"options for {engine} come first and end with --")
        split = argv.index("--")
        overrides, rest = argv[:split], argv[split + 1 :]
    if not rest:
        raise UserError("no script after --", fix="give a script or --trial module:Class")
    head = rest[0]
    if _is_trial(head):
        if head == TRIAL_OPTION:
            trial, extra = (rest[1] if len(rest) > 1 else ""), rest[2:]
        else:
            trial, extra = head.split("=", 1)[1], rest[1:]
        if not trial:
            raise UserError("--trial needs a value", fix="--trial package.module:Class or path/to/file.py:Class")
        if extra:
            raise UserError(f"--trial takes nothing after it, got {shlex.join(extra)!r}",
                            fix="pass settings as parameters, or run a script instead")
        return Launch(tuple(overrides), trial, ())
    if _is_option(head):
        raise UserError(f"unknown launcher option {head!r}",
                        fix="after the overrides comes --trial TRIAL or a script")
    return Launch(tuple(overrides), None, tuple(rest))


def worker_command(launch: Launch, python: str) -> List[str]:
    """What each worker runs: a .py script with this Python, a trial class, or a command as given."""
    if launch.trial:
        return [python, "-m", RUN_TRIAL_MODULE, launch.trial]
    if launch.script[0].endswith(".py"):
        return [python, *launch.script]
    return list(launch.script)


def _is_option(arg: str) -> bool:
    return arg.startswith("-") and arg != "-"


def _is_trial(arg: str) -> bool:
    return arg == TRIAL_OPTION or arg.startswith(TRIAL_OPTION + "=")
