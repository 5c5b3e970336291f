"""The keeper's second half: keep a started command to its end and record how it ended.

main.py starts the command as early as it can; this module loads after it
(the reporting side costs a few milliseconds of imports that the trial's start
does not wait for). It captures the command's output, says RUNNING, serves
events until the command and its tree are gone, and records the final status
(or FAILED when the command could not start), then delivers what is pending.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

TYPE_CHECKING = False  # no typing at run time: 2 of the 5.6 ms the reporting side imports beside the trial's start
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple, Union

from trialkit import __version__, env, layout, records
from trialkit.checkpoints import STORE_FAILED_EXIT, STORED_LIST, unstored
from trialkit.keeper.logs import ECHO_DRAIN_SECONDS, Capture, LineScanner, explain_failure
from trialkit.keeper.reporter import Reporter
from trialkit.keeper.status import PROG, say, warn, warnings_also_to
from trialkit.process import (STOP_SIGNALS, Child, EventLoop, LaunchError, describe_exit, own_module_argv, pipes_output,
                              signal_group, spawn)
from trialkit.statuses import FAILED, PREEMPTED, RUNNING, SUCCEEDED, USER_CANCELED, grace_killed


def keep(opts: argparse.Namespace, trial: env.TrialEnv, home: Path, loop: EventLoop,
         launched: Union[Tuple[Child, int, int], LaunchError], started: float, ends: Dict[str, int]) -> int:
    """From the command's start (its child and output pipes, or why it could not start; `ends`, the followed
    files' sizes before it) to its recorded end and the delivery of what is pending; returns the keeper's exit
    code."""
    reporter = Reporter(trial, home)
    reporter.attach(loop, ends)
    if isinstance(launched, LaunchError):
        print(f"{PROG}: {launched}", file=sys.stderr, flush=True)
        # A store that failed the restore is not the trial's fault: it waits, PREEMPTED, for the store's repair.
        status = PREEMPTED if launched.code == STORE_FAILED_EXIT else FAILED
        reporter.status(status, exit_code=launched.code, reason=str(launched), restart_count=trial.restart_count)
        code = launched.code
    else:
        child, out_r, err_r = launched
        ready_stop(trial.stop_file)
        # Said in the RUNNING record too: the experiment's console prints each once (control/loop.py), on every
        # platform, for a user who reads that and not each trial's log.
        said = stop_warnings(opts, trial) + sdk_shadowed()
        reporter.status(RUNNING, pid=child.pid, started=started, restart_count=trial.restart_count,
                        command=list(opts.command), keeper_version=__version__, **({"warnings": said} if said else {}))
        captures = capture_output(opts, trial, loop, reporter, out_r, err_r)
        for line in said:
            warn(line)
        # Watched before the uploader starts: its start reaps every exited child, and a command that already
        # ended, reaped unwatched, would leave the keeper waiting for it for ever.
        loop.watch(child)
        # One pod of a multi-pod trial stores its checkpoints (the one that reports: rank 0's saves); every pod
        # fetched the latest before it started.
        uploads = Uploads(trial, loop) if trial.checkpoint_store and env.is_reporting_replica() else None
        code = keep_to_end(opts, trial, loop, reporter, child, captures, uploads)
    reporter.finish(time.monotonic() + opts.flush_seconds)
    return code


def stop_warnings(opts: argparse.Namespace, trial: env.TrialEnv) -> List[str]:
    """What would go wrong when the trial is stopped, one line each, the same for every trial of an experiment
    (no paths of its own: the console says each once): a grace that the runtime cuts short (it SIGKILLs the
    keeper mid-grace: the trial's end goes unrecorded), a pipe in the command (the stop reaches the pipe's reader
    too, which ends first: the trainer dies writing to it before it saves)."""
    said = []
    runtime = env.runtime_stop(os.environ)
    if runtime is not None and trial.grace_seconds > env.fitting_grace(runtime[1]):
        name, seconds = runtime
        given = grace_from(opts)
        said.append(f"a grace of {trial.grace_seconds:g} s ({given}) and {layout.CLEANUP_MARGIN_SECONDS} s to record "
                    f"the trial's end do not fit in the {seconds:g} s {name} waits between its SIGTERM and its "
                    f"SIGKILL: a stop would kill the keeper mid-grace; set {env.GRACE_SECONDS}="
                    f"{env.fitting_grace(seconds):g}, or let the runtime wait longer and say how long in "
                    f"{env.TERMINATION_GRACE}")
    pipe = pipes_output(opts.command)
    if pipe is not None:
        said.append(f"the command pipes its output (... {pipe:.60}): a stop signals the pipe's reader too, which "
                    "ends first, and the trainer dies writing to it (BrokenPipeError) before it can checkpoint; "
                    "leave the pipe out (the keeper keeps the output in the trial dir's stdout.log and stderr.log) "
                    "or write to a file (> train.log 2>&1)")
    return said


def sdk_shadowed(code_dir: str = ".") -> List[str]:
    """A module or a package named trialkit in the code dir (the command's working directory), which a script
    there imports instead of trialkit's SDK; one line to say so. (A folder without an __init__.py, taken for a
    namespace package, is no matter: the training process gets the real trialkit all the same, shims/boot.)"""
    module = os.path.join(code_dir, "trialkit.py")
    package = os.path.join(code_dir, "trialkit")
    if os.path.isfile(module):
        found = "trialkit.py"
    elif (os.path.isfile(os.path.join(package, "__init__.py"))
          and os.path.realpath(package) != os.path.dirname(os.path.realpath(env.__file__))):  # not this trialkit
        found = "a package trialkit/"
    else:
        return []
    return [f"the code dir holds {found}, which a script there imports as trialkit instead of trialkit's SDK "
            "(its functions missing, or not the SDK's); rename it"]


def grace_from(opts: argparse.Namespace) -> str:
    """Where the grace was said, for the lines that name it."""
    return "--grace" if opts.grace is not None else env.GRACE_SECONDS


def capture_output(opts: argparse.Namespace, trial: env.TrialEnv, loop: EventLoop, reporter: Reporter,
                   out_r: int, err_r: int) -> List[Capture]:
    """The command's output into its log files (and our own stdout and stderr), served by the loop."""
    streams = log_streams(reporter, loop)
    captures = [
        Capture(out_r, str(trial.trial_dir / "stdout.log"), None if opts.quiet else sys.stdout.fileno(),
                LineScanner(records.NNI_STDOUT_PREFIX, reporter.nni_stdout_line), streams.get("stdout")),
        Capture(err_r, str(trial.trial_dir / "stderr.log"), None if opts.quiet else sys.stderr.fileno(),
                tee=streams.get("stderr")),
    ]
    for capture in captures:
        loop.add_reader(capture.pipe_fd, _reader(loop, capture))
    warnings_also_to(captures[1].note)  # where the user reads the trial's output: stderr.log, the manager
    return captures


def log_streams(reporter: Reporter, loop: EventLoop) -> Dict[str, Any]:
    """stream -> the feed of its copy for the manager; none without a manager to ship to."""
    if reporter.shipper is None:
        return {}
    from trialkit.keeper.logship import Budget, LogStream

    budget = Budget()
    reporter.log_streams = [LogStream(name, budget, reporter.log_chunk, loop.call_later)
                            for name in ("stdout", "stderr")]
    return {stream.name: stream.feed for stream in reporter.log_streams}


def _reader(loop: EventLoop, capture: Capture):
    def on_readable() -> None:
        capture.on_readable()
        if not capture.open:
            loop.remove_reader(capture.pipe_fd)
    return on_readable


def keep_to_end(opts: argparse.Namespace, trial: env.TrialEnv, loop: EventLoop, reporter: Reporter,
                child: Child, captures: List[Capture], uploads: Optional[Uploads]) -> int:
    """Keep the running command to its end and record how it ended (once its checkpoints are stored: a
    PREEMPTED trial may start again elsewhere at once); returns its exit code."""
    stop = supervise(loop, child, captures, trial)
    unstored = None
    if uploads is not None:
        unstored = uploads.finish(loop, time.monotonic() + trial.checkpoint_transfer_seconds)
    status, reason = final_status(child, stop is not None), ""
    if stop is not None and child.outlived_its_grace:
        reason = grace_killed(trial.grace_seconds, signal.Signals(stop).name, grace_from(opts))
        say(reason)
    if status == FAILED:
        reason, hint = explain_failure(opts.command, str(trial.trial_dir / "stderr.log"), os.environ.get("PATH"))
        reason = reason or f"{describe_exit(child.exit_code)}, nothing on stderr"  # a silent death says how
        if hint is not None:
            print(f"{PROG}: {hint}", file=sys.stderr, flush=True)
    reason = "; ".join(filter(None, (reason, unstored)))
    reporter.trial_ended()
    reporter.status(status, exit_code=child.exit_code, ended=time.time(), reason=reason)
    return child.exit_code


class Uploads:
    """The uploader beside the trial (trialkit/checkpoints/sync.py): its own process and session, so the cloud
    library never loads here nor in training, and a stop of the trial's group leaves it uploading."""

    def __init__(self, trial: env.TrialEnv, loop: EventLoop):
        self.trial = trial
        try:
            os.unlink(trial.trial_dir / STORED_LIST)  # an earlier run's: this run's uploader writes its own
        except OSError:
            pass
        read, self._end = os.pipe()
        try:
            self.child: Optional[Child] = loop.watch(spawn(own_module_argv("trialkit.checkpoints.sync"),
                                                           env=trial.child_environ(), stdin=read, name="uploader"))
        except LaunchError as err:
            warn(f"cannot start the checkpoint uploader ({err}); checkpoints stay in {trial.checkpoint_dir}")
            self.child = None
        finally:
            os.close(read)

    def finish(self, loop: EventLoop, deadline: float) -> Optional[str]:
        """Tell it the trial ended and wait (to the deadline) until it has stored what is left; what it did not
        store, said for the trial's reason (None when everything is stored)."""
        try:
            os.write(self._end, b"end\n")
        except OSError:
            pass  # it is gone already: its exit code says how it went
        os.close(self._end)
        child = self.child
        if child is not None and not loop.run_until(lambda: not child.running, deadline):
            signal_group(child.pgid, signal.SIGKILL)
            why = (f"the uploader did not finish within {self.trial.checkpoint_transfer_seconds:g} s "
                   f"({env.CHECKPOINT_TRANSFER_SECONDS})")
        elif child is None or child.exit_code != 0:
            why = "the uploader failed (its lines in trial.log say why)"
        else:
            return None
        left = unstored(self.trial.trial_dir, self.trial.checkpoint_dir)
        if not left:
            return None
        note = (f"{len(left)} checkpoint{'s' * (len(left) > 1)} not stored in the object store: {why}; kept in "
                f"{self.trial.checkpoint_dir}")
        warn(note)
        return note


def supervise(loop: EventLoop, child: Child, captures: List[Capture], trial: env.TrialEnv) -> Optional[int]:
    """Serve events until the child and its tree are gone; the signal of the first stop asked, if one was."""
    stop_asked: List[int] = []

    def on_signal(signum: int) -> None:
        if signum in STOP_SIGNALS:
            if not stop_asked:
                stop_asked.append(signum)
                mark_stop(trial.stop_file)  # before the signal, so a handler that asks should_preempt() sees it
            loop.stop(child, trial.grace_seconds, first=signum)
        else:
            signal_group(child.pgid, signum)

    loop.serve(child, on_signal, lambda: any(c.open for c in captures))
    echo_deadline = time.monotonic() + ECHO_DRAIN_SECONDS
    for capture in captures:
        loop.remove_reader(capture.pipe_fd)
        capture.close(echo_deadline)
    return stop_asked[0] if stop_asked else None


def ready_stop(stop_file: Path) -> None:
    """Make the stop file ahead, once the command runs (off its way to its start): asking a stop is then
    one rename (~30 us), not a file's creation (80-220 us on a cold disk), on the way from SIGTERM to
    the trial's handler (bench/bench_keeper.py)."""
    try:
        os.close(os.open(layout.stop_ready(stop_file), os.O_WRONLY | os.O_CREAT, 0o644))
    except OSError as err:
        warn(f"cannot make the stop file ahead ({err}); a stop creates it then")


def mark_stop(stop_file: Path) -> None:
    """Make the stop file exist: the one made ahead at the start, renamed; created when there is none."""
    try:
        os.rename(layout.stop_ready(stop_file), stop_file)
    except FileNotFoundError:  # the disk refused it at the start
        try:
            os.close(os.open(stop_file, os.O_WRONLY | os.O_CREAT, 0o644))
        except OSError as err:  # the disk refuses it still: the signal alone tells the trial
            warn(f"cannot make the stop file {stop_file} ({err.strerror}); should_preempt() stays false")


def final_status(child: Child, stop_asked: bool) -> str:
    if child.exit_code == 0:
        return SUCCEEDED
    # Loaded only here: AdaptDL's wiring brings its checkpoint hook's module (json, ctypes,
    # shutil), ~2 ms that a successful trial's way out does without.
    from trialkit import adaptdl

    # 143 from exit(), not from dying of SIGTERM: the trial saved a checkpoint.
    if child.killed_by is None and adaptdl.is_checkpointed_exit(child.exit_code, stop_asked):
        return PREEMPTED
    return USER_CANCELED if stop_asked else FAILED
