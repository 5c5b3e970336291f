"""The trial keeper: runs the training command and keeps its whole tree in hand.

    python -m trialkit.keeper [--grace SECONDS] [options] -- COMMAND [ARGS...]

Its life, in order: read the arguments and the environment contract, prepare
the trial's home, become the reaper of orphans, listen for signals, start the
command in its own session with its output piped to us; then load the
reporting side (spool, followed files, shipper: off the trial's way to its
start), serve events until the command has exited and nothing of its tree is
left, and exit with its code (128+N when signal N ended it). SIGTERM and
SIGINT stop the trial with a bounded grace; the other forwarded signals pass
through to the group as they are.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TYPE_CHECKING = False  # no typing at run time: it costs every start 1.6 ms (tests/test_start_imports.py)
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, NoReturn, Optional, Sequence, Tuple

from trialkit import env, layout, records
from trialkit.errors import ArgumentParser, UserError, report_and_exit
from trialkit.keeper.status import PROG, StatusFile, warn
from trialkit.process import (
    FORWARDED_SIGNALS,
    Child,
    EventLoop,
    LaunchError,
    own_module_argv,
    set_child_subreaper,
    shell_line_argv,
    spawn,
    start_ticks,
)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    argv = list(argv)
    if "--" in argv:
        split = argv.index("--")
        options, command = argv[:split], argv[split + 1 :]
    else:
        # No "--": the command starts at the first argument that is not an option.
        split = next((i for i, a in enumerate(argv) if not a.startswith("-") and not _is_option_value(argv, i)), len(argv))
        options, command = argv[:split], argv[split:]
    parser = ArgumentParser(
        prog=PROG,
        description="Run a training command under trialkit's keeper: own process group, "
        "signal forwarding with a bounded grace, log capture, metrics delivery.",
        usage=f"{PROG} [options] -- COMMAND [ARGS...]   (no COMMAND: runs ${env.COMMAND})",
        epilog="Exit status: the command's, 128+N if signal N ended it, 126 if it is not "
        "executable, 127 if it is not found, 2 for bad keeper arguments.",
    )
    parser.add_argument("--grace", type=float, metavar="SECONDS",
                        help=f"time between the forwarded SIGTERM and SIGKILL (default ${env.GRACE_SECONDS}; else, "
                        f"as a container's main process, what its runtime allows: its stop timeout less "
                        f"{layout.CLEANUP_MARGIN_SECONDS} s, {env.fitting_grace(env.CONTAINER_STOP_SECONDS):g} under "
                        f"docker or podman stop; else {env.DEFAULT_GRACE_SECONDS:g})")
    parser.add_argument("--trial-dir", metavar="DIR",
                        help=f"where logs, status, pidfile and spool go (default ${env.TRIAL_DIR}, else .)")
    parser.add_argument("--forward", metavar="SIGNALS", default=",".join(s.name for s in FORWARDED_SIGNALS),
                        help="comma-separated signals passed to the trial's process group "
                        "(default %(default)s)")
    parser.add_argument("--flush-seconds", type=float, default=layout.FLUSH_SECONDS, metavar="SECONDS",
                        help="at exit, how long to try delivering records to the manager (default %(default)s)")
    parser.add_argument("--quiet", action="store_true", help="capture output to files without echoing it")
    parser.add_argument("--startup-hook", metavar="FILE",
                        help="a shell script sourced in the command's own process group before it runs (run.sh's "
                        "startup-hook.sh): what it exports reaches the command, what it starts is stopped with the "
                        "command's group, its output goes to startup-hook.log in the trial dir, and if it fails "
                        "the command does not run")
    opts = parser.parse_args(options)
    if not command and os.environ.get(env.COMMAND, "").strip():
        command = shell_line_argv(os.environ[env.COMMAND])
    if not command:
        raise UserError("no command given", "arguments",
                        f"usage: {PROG} [options] -- COMMAND [ARGS...], or set {env.COMMAND} to a command line")
    if opts.grace is not None:
        env.check_grace(opts.grace, "--grace")
    opts.forward = _signals(opts.forward)
    opts.command = command
    return opts


_OPTIONS_WITH_VALUES = {"--grace", "--trial-dir", "--forward", "--flush-seconds", "--startup-hook"}


def _is_option_value(argv: List[str], i: int) -> bool:
    return i > 0 and argv[i - 1] in _OPTIONS_WITH_VALUES


def _signals(spec: str) -> Tuple[int, ...]:
    out = []
    for name in filter(None, (s.strip().upper() for s in spec.split(","))):
        name = name if name.startswith("SIG") else "SIG" + name
        try:
            out.append(signal.Signals[name])
        except KeyError:
            raise UserError(f"unknown signal {name!r}", "--forward", "use names like SIGTERM,SIGUSR1") from None
        if out[-1] in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            raise UserError(f"{name} cannot be forwarded", "--forward", "leave it out")
    return tuple(out)


def read_trial(opts: argparse.Namespace) -> env.TrialEnv:
    environ = dict(os.environ)
    if opts.trial_dir:
        environ[env.TRIAL_DIR] = os.path.abspath(opts.trial_dir)
    if opts.grace is not None:
        environ[env.GRACE_SECONDS] = str(opts.grace)
    trial = env.read(environ)
    env.check(trial)
    return trial._replace(trial_dir=trial.trial_dir.absolute())


def prepare_home(trial: env.TrialEnv) -> Tuple[env.TrialEnv, Path]:
    """Create the trial's dirs and the keeper's home; raise the restart count if we ran here before."""
    home = layout.home(trial.trial_dir)
    # The record files' dirs too: the command starts before the keeper watches them, and a trial may write there
    # first (NNI's own SDK makes .nni itself; a script that appends to $NNI_SYS_DIR/.nni/metrics does not).
    for path in (home, trial.output_dir, trial.checkpoint_dir, trial.share_dir, trial.stop_file.parent,
                 trial.channel.parent, layout.nni_metrics_path(trial.trial_dir).parent):
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as err:  # a file in the way, a dir under /proc, a name too long, no permission
            raise UserError(f"cannot make the dir {str(path)[:200]!r}: {err.strerror}", _dir_option(path, trial),
                            "give a directory the keeper can create and write") from None
    previous = StatusFile.previous(home / layout.STATUS)
    if previous and "restart_count" in previous:
        # AdaptDL names checkpoints after the count and refuses to reuse one:
        # a keeper restarted on the same dir must count up even if nobody told it.
        trial = trial._replace(restart_count=max(trial.restart_count, previous["restart_count"] + 1))
    try:
        trial.stop_file.unlink()
    except FileNotFoundError:
        pass
    except OSError as err:  # a name too long, a dir, no permission: a stop could never be asked through it
        raise UserError(f"cannot use the stop file {str(trial.stop_file)[:200]!r}: {err.strerror}", env.STOP_FILE,
                        "give a file path the keeper can create and remove") from None
    try:
        write_nni_parameters(trial)
    except (OSError, ValueError) as err:
        warn(f"cannot write parameter.cfg for NNI's SDK ({err})")
    return trial, home


def _dir_option(path: Path, trial: env.TrialEnv) -> str:
    """Where a dir the keeper makes comes from, for an error line (the first name that gives it)."""
    names = ((layout.home(trial.trial_dir), f"--trial-dir or {env.TRIAL_DIR}"), (trial.output_dir, env.OUTPUT_DIR),
             (trial.checkpoint_dir, env.CHECKPOINT_DIR), (trial.share_dir, env.SHARE_DIR),
             (trial.stop_file.parent, env.STOP_FILE), (trial.channel.parent, env.CHANNEL),
             (layout.nni_metrics_path(trial.trial_dir).parent, f"--trial-dir or {env.TRIAL_DIR}"))
    return next(name for where, name in names if where == path)


def write_nni_parameters(trial: env.TrialEnv) -> None:
    """parameter.cfg in NNI's shape, before the trial starts: nni.get_next_parameter() waits for it."""
    target = trial.trial_dir / "parameter.cfg"
    if trial.parameters_file and Path(trial.parameters_file).absolute() == target:
        return  # the trial was given NNI's own file
    parameters = trial.parameters()
    cfg = records.nni_parameter_cfg(records.parameter_id(trial.parameter_id, trial.sequence), parameters)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(cfg))
    os.replace(tmp, target)  # never seen empty or half written


def write_pidfile(home: Path, trial: env.TrialEnv) -> Tuple[Path, str]:
    """`PID START_TICKS GRACE` for cleanup.sh: which process to signal (a reused pid
    does not match the start time) and how long it may take to stop."""
    path = home / layout.PIDFILE
    line = f"{os.getpid()} {start_ticks(os.getpid())} {trial.grace_seconds:g}\n"
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(line)
        os.replace(tmp, path)
    except OSError as err:
        raise UserError(f"cannot write {path}: {err.strerror}", f"--trial-dir or {env.TRIAL_DIR}",
                        "give a trial dir on a disk that takes writes") from None
    return path, line


def remove_pidfile(pidfile: Tuple[Path, str]) -> None:
    path, line = pidfile
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)  # not read_text(): on the way out, a third of its CPU
        try:
            held = os.read(fd, 256)
        finally:
            os.close(fd)
        if held == line.encode():  # a newer keeper on this dir may have replaced it
            os.unlink(path)
    except OSError:
        pass  # gone already, or a disk that takes no writes: a stale pidfile names a process that has ended


# Sources the hook ($1, output to $2) in the shell that then becomes the command (the rest): the hook's
# exports reach the command, and what the hook starts stays in the command's process group, so it is
# signalled, stopped within the grace and swept with the command. Positional arguments only: no path or
# command is ever pasted into this line.
HOOK_RUNNER = """hook=$1 log=$2
shift 2
hook_ended() {
  status=$?
  cat "$log" >&2
  if [ "$status" -eq 0 ]; then
    echo "startup hook $hook called exit; the trial does not start (its output is above, and in startup-hook.log)" >&2
    exit 1
  fi
  echo "startup hook $hook failed with exit code $status; the trial does not start (its output is above, and in startup-hook.log)" >&2
  exit "$status"
}
trap hook_ended EXIT
set -eu
{ . "$hook"; } >"$log" 2>&1
set +eu
trap - EXIT
exec "$@"
"""
HOOK_LOG = "startup-hook.log"


def command_argv(opts: argparse.Namespace, trial: env.TrialEnv) -> List[str]:
    """What the keeper starts: the command, or, with a startup hook, the shell that sources it and then becomes
    the command."""
    if not opts.startup_hook:
        return list(opts.command)
    return ["/bin/sh", "-c", HOOK_RUNNER, "startup-hook", opts.startup_hook, str(trial.trial_dir / HOOK_LOG),
            *opts.command]


# In a keeper forked from an experiment's zygote (keeper/zygote.py): keeper/warm.py's fork_command, which starts
# an eligible Python command in a fork of this keeper, its modules preloaded (None: not one, spawned as usual).
fork_command: Optional[Callable[[Sequence[str], Dict[str, str], int, int], Optional[Child]]] = None


def start_command(command: Sequence[str], trial: env.TrialEnv) -> Tuple[Child, int, int]:
    """Spawn the command with its stdout and stderr piped to us; returns the child and the pipes' read ends."""
    environ = trial.child_environ()
    environ[env.UNDER_KEEPER] = str(os.getpid())
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        child = (fork_command and fork_command(command, environ, out_w, err_w)) or \
            spawn(command, env=environ, stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w)
    except LaunchError:
        os.close(out_r)
        os.close(err_r)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    return child, out_r, err_r


def followed_sizes(trial: env.TrialEnv) -> Dict[str, int]:
    """The sizes of the files the keeper follows (by its sources' names), taken before the command starts: what
    they hold then is an earlier keeper's, and is spooled before this run's first status (Reporter.attach)."""
    sizes = {}
    for name, path in (("channel", trial.channel), ("nni", layout.nni_metrics_path(trial.trial_dir))):
        try:
            sizes[name] = os.stat(path).st_size
        except OSError:  # not written yet
            sizes[name] = 0
    return sizes


def restore_checkpoint(trial: env.TrialEnv) -> None:
    """With an object store of checkpoints, fetch the trial's latest before it starts (a new node or pod has
    none; a pod its operator made again keeps its restart count, so every start asks): in a process of its
    own (trialkit/checkpoints/restore.py), so the keeper never loads the cloud library. LaunchError when it
    cannot: a trial started without its checkpoint would lose its progress; a store that fails exits
    STORE_FAILED_EXIT (the trial resumes later)."""
    if not trial.checkpoint_store:
        return
    from importlib.util import find_spec

    from trialkit.checkpoints import STORE_FAILED_EXIT
    if find_spec("obstore") is None:  # an image without trialkit runs the keeper from its archive
        raise LaunchError("an object store of checkpoints needs trialkit in the image, with its checkpoints extra "
                          "(obstore is not importable here); build the image from images/Dockerfile.cpu or .gpu", 1)
    argv = own_module_argv("trialkit.checkpoints.restore")
    try:
        done = subprocess.run(argv, env=trial.child_environ(), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, errors="replace", timeout=trial.checkpoint_transfer_seconds)
    except subprocess.TimeoutExpired:
        raise LaunchError(f"its checkpoint was not restored within {trial.checkpoint_transfer_seconds:g} s "
                          f"({env.CHECKPOINT_TRANSFER_SECONDS}): the store is too slow or does not answer",
                          STORE_FAILED_EXIT) from None
    said = done.stderr.strip().splitlines()
    if done.returncode == 0:
        sys.stderr.writelines(line + "\n" for line in said)
        return
    sys.stderr.writelines(line + "\n" for line in said[:-1])  # its last line, why, is said once: in the reason
    why = said[-1].split(": cannot restore: ", 1)[-1] if said else f"exit {done.returncode}"
    raise LaunchError(f"its checkpoint could not be restored: {why}", STORE_FAILED_EXIT)


def run(argv: Sequence[str]) -> int:
    """The keeper's whole life; returns its exit code."""
    try:
        opts = parse_args(argv)
        trial, home = prepare_home(read_trial(opts))
        pidfile = write_pidfile(home, trial)
    except UserError as err:
        report_and_exit(PROG, err)
    env.hide_secrets()  # before anything starts that could read ours in /proc
    set_child_subreaper()
    loop = EventLoop(opts.forward)
    loop.install_signal_handlers()
    started = time.time()
    ends = followed_sizes(trial)
    try:
        restore_checkpoint(trial)
        launched: Any = start_command(command_argv(opts, trial), trial)
    except LaunchError as err:
        launched = err
    gc.enable()  # off since __main__, for the start
    # Loaded once the command runs: the reporting side (decoders, spool, followed
    # files, threads) is ~4 ms that the trial's start does not wait for. What the
    # trial writes meanwhile waits in its pipes and files.
    from trialkit.keeper.keep import keep

    code = keep(opts, trial, home, loop, launched, started, ends)
    remove_pidfile(pidfile)
    return code


class _Unfailing:
    """The keeper's own stderr, whose lines are dropped rather than raised when they cannot be written: the
    local platform points it at trial.log, and a full or read-only disk must not end the keeper mid-delivery."""

    def __init__(self, stream: Any):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError:
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError:
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def main(argv: Optional[Sequence[str]] = None) -> NoReturn:
    sys.stderr = _Unfailing(sys.stderr)
    code = run(sys.argv[1:] if argv is None else argv)
    # Everything is written and delivered: leave without the interpreter's
    # teardown (module cleanup, daemon echo threads), which would add tens of
    # milliseconds between the trial's exit and ours.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    main()
