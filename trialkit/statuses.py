"""Trial statuses: a contract shared by the keeper, the platforms, the store and the page; and an experiment's.

PREEMPTED means stopped with a checkpoint, to resume (DESIGN.md).
"""
WAITING = "WAITING"
RUNNING = "RUNNING"
SUCCEEDED = "SUCCEEDED"
FAILED = "FAILED"
USER_CANCELED = "USER_CANCELED"
SYS_CANCELED = "SYS_CANCELED"
EARLY_STOPPED = "EARLY_STOPPED"
PREEMPTED = "PREEMPTED"
FINAL_STATUSES = frozenset({SUCCEEDED, FAILED, USER_CANCELED, SYS_CANCELED, EARLY_STOPPED, PREEMPTED})
# An experiment's statuses (RUNNING too): the control loop's, and what manager.json's readers compare the store's to.
PAUSED = "PAUSED"
DONE = "DONE"
STOPPED = "STOPPED"
ERROR = "ERROR"
# Statuses whose reason a one-line view (a table row, the progress line, the page) shows beside them:
# what a waiting trial waits for, why a failed one failed, why a trial is paused and whether it lost its progress,
# why trialkit canceled one (an experiment in ERROR, maxExperimentDuration), and how a user's was (`trial kill`,
# the page's Kill, `experiment stop`, a Ctrl-C); of a running one, that it is stopping (who asked, when its grace
# ends: NNI has no stopping status) or what is amiss (its keeper unheard, of another version); of a succeeded one,
# what it left undone (no final result, a PBT step that left no checkpoint), where it says anything at all.
EXPLAINED = frozenset({WAITING, RUNNING, SUCCEEDED, FAILED, PREEMPTED, SYS_CANCELED, USER_CANCELED})


# The keeper's reason for a trial it SIGKILLed when the grace ran out; the control plane keeps it beside who
# stopped the trial ("killed by `trialkit trial kill`; killed: it was still running 5 s after SIGTERM (...)").
_grace_killed = "killed: it was still running"  # not a status (every upper-case name here is one)


def grace_killed(seconds: float, signal_name: str, where: str) -> str:
    return f"{_grace_killed} {seconds:g} s after {signal_name} ({where})"


def grace_set_by(reason: str, variable: str, where: str) -> str:
    """A keeper's grace_killed reason naming `where` (an experiment's config key) where it named the `variable`
    that carried the grace to it."""
    return reason.replace(f"({variable})", f"({where})")


def is_grace_killed(reason: str) -> bool:
    return reason.startswith(_grace_killed)
