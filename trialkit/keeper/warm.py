"""A trial's Python command run in a fork of a warm process, as `python script.py ARGS` would run it.

A warm keeper (a fork of the experiment's zygote, keeper/zygote.py) starts an eligible command, `python[3]
[-u] SCRIPT ARGS...` or `python[3] [-u] -m MODULE ARGS...` whose interpreter on the trial's PATH is the
keeper's own, by forking itself rather than exec'ing a new interpreter: the child is the trial's own process
(its own session, the keeper its parent, SIGTERM its stop, its exit code the trial's), with the modules the
zygote preloaded already imported. Everything else a fresh interpreter has, the child is given anew: the
environment, sys.argv and sys.path[0], a fresh __main__, fresh standard streams, default signal handlers and
an empty mask, and numpy's global generator seeded from fresh entropy.
"""
from __future__ import annotations

import os
import signal
import sys

from typing import Dict, List, NamedTuple, Optional, Sequence, Set  # only warm processes load this module

from trialkit import env
from trialkit.process import Child, set_parent_death_signal

_PYTHONS = ("python", "python3")

# What differs from one trial of an experiment to the next in a keeper's environment: the zygote's environment
# is a trial's without these, and a trial whose environment differs from it in anything else starts cold.
PER_TRIAL = (env.TRIAL_ID, env.SEQUENCE, env.TOKEN, env.PARAMETERS, env.PARAMETER_ID, env.PARAMETERS_FILE,
             env.RESTART_COUNT, env.TRIAL_DIR, env.CODE_DIR, env.OUTPUT_DIR, env.CHECKPOINT_DIR, env.SHARE_DIR,
             env.TENSORBOARD_DIR, env.CHANNEL, env.STOP_FILE, env.NNI["trial_id"],
             env.NNI["sequence"], env.NNI["trial_dir"], env.NNI["output_dir"], env.NNI["code_dir"])


def shared_environ(environ: Dict[str, str]) -> Dict[str, str]:
    """The part of a trial's environment that its experiment's other trials share (what the zygote runs with)."""
    return {key: value for key, value in environ.items() if key not in PER_TRIAL}


class PythonCommand(NamedTuple):
    target: str  # the script's path, or the module's name
    is_module: bool
    args: List[str]
    unbuffered: bool  # -u


def python_command(argv: Sequence[str], environ: Dict[str, str], cwd: str,
                   executable: str = sys.executable) -> Optional[PythonCommand]:
    """argv as a Python command a warm keeper may fork (None: it is not one): `python[3] [-u] SCRIPT.py ...` or
    `... -m MODULE ...`, its interpreter, found on environ's PATH from cwd, `executable` (the keeper's). The same
    file is not enough: a venv's python and the system's are one binary with different site-packages, so it
    must be in the same dir too."""
    if len(argv) < 2:
        return None
    found = interpreter(argv[0], environ, cwd)
    if found is None or not _same_python(found, executable):
        return None
    rest = list(argv[1:])
    unbuffered = rest[0] == "-u"
    if unbuffered:
        rest.pop(0)
    if len(rest) >= 2 and rest[0] == "-m" and not rest[1].startswith("-"):
        return PythonCommand(rest[1], True, rest[2:], unbuffered)
    if rest and rest[0].endswith(".py") and os.path.isfile(os.path.join(cwd, rest[0])):
        return PythonCommand(rest[0], False, rest[1:], unbuffered)
    return None


def interpreter(program: str, environ: Dict[str, str], cwd: str) -> Optional[str]:
    """The file a command's `python[3]` names, on environ's PATH from cwd (None: it names no python)."""
    if os.path.basename(program) not in _PYTHONS:
        return None
    if "/" in program:
        return os.path.join(cwd, program)
    import shutil

    return shutil.which(program, path=environ.get("PATH", os.defpath))


def _same_python(found: str, executable: str) -> bool:
    found, executable = os.path.abspath(found), os.path.abspath(executable)
    return (os.path.dirname(found) == os.path.dirname(executable)
            and os.path.realpath(found) == os.path.realpath(executable))


def single_threaded() -> Optional[str]:
    """None when this process runs one thread (a fork then copies a process whose every lock is free); else
    why not, for the line that says warm start is off."""
    threads = len(os.listdir("/proc/self/task"))
    if threads == 1:
        return None
    return (f"the warm process runs {threads} threads (a module it preloads started them: a fork would copy "
            "their locks held), so trials start cold")


def fork_command(argv: Sequence[str], environ: Dict[str, str], stdout: int, stderr: int) -> Optional[Child]:
    """The keeper's start of an eligible command, in a fork (None: not eligible, or this process is no longer
    single-threaded: the keeper spawns it as usual). The child runs as process.spawn's would."""
    command = python_command(argv, environ, os.getcwd())
    if command is None or single_threaded() is not None or _shadowed(command):
        return None
    parent = os.getpid()
    for stream in (sys.stdout, sys.stderr):
        _flush(stream)  # else the child would write what the keeper had buffered again
    pid = os.fork()
    if pid == 0:
        code = 127
        try:
            os.setsid()
            set_parent_death_signal(parent)  # and an empty mask
            _standard_fds(stdout, stderr)
            reset_signals()
            os.environ.clear()
            os.environ.update(environ)
            code = run_python(command)
        finally:
            os._exit(code)
    return Child(pid=pid, argv=list(argv))


def _shadowed(command: PythonCommand) -> bool:
    """Whether a module in the script's dir has the name of one this process has imported: a new interpreter
    would import the script's (json.py beside it, say), a fork finds this one already there."""
    here = os.path.dirname(os.path.abspath(command.target)) if not command.is_module else os.getcwd()
    try:
        names = {name[:-3] if name.endswith(".py") else name for name in os.listdir(here)
                 if name.endswith(".py") or os.path.isfile(os.path.join(here, name, "__init__.py"))}
    except OSError:
        return True
    return any(name in sys.modules for name in names)


def _standard_fds(stdout: int, stderr: int) -> None:
    """0 on /dev/null, 1 and 2 on these; every other fd closed (as spawn's close_fds)."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(stdout, 1)
    os.dup2(stderr, 2)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))


# The dispositions a new interpreter starts with, other than the default: Ctrl-C a KeyboardInterrupt, and
# SIGPIPE and SIGXFSZ ignored (write errors raise instead).
_AT_START = {signal.SIGINT: signal.default_int_handler, signal.SIGPIPE: signal.SIG_IGN,
             signal.SIGXFSZ: signal.SIG_IGN}


def reset_signals() -> None:
    """Signal handling as a new interpreter has it: no wakeup fd, the start's dispositions, an empty mask."""
    signal.set_wakeup_fd(-1)
    for signum in signal.valid_signals():
        want = _AT_START.get(signum, signal.SIG_DFL)
        try:
            if signal.getsignal(signum) is not want:
                signal.signal(signum, want)
        except (OSError, ValueError, RuntimeError):  # SIGKILL, SIGSTOP, the C library's own
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def run_python(command: PythonCommand) -> int:
    """Run the script or module as the __main__ of a new interpreter would, in this process; its exit code.

    As `python` does: sys.path[0] is the script's dir (the working dir for -m), uncaught exceptions are printed
    by sys.excepthook (with no frame of ours) and exit 1, SystemExit gives its code, KeyboardInterrupt ends by
    SIGINT; then non-daemon threads are joined, atexit runs, the streams are flushed."""
    import atexit
    import gc
    import runpy
    import threading

    gc.enable()  # off in the keeper's start
    # The atexit handlers here are the preloaded modules' (logging's shutdown, say), which a cold trial has too
    # once it imports them: they stay (the keeper and the zygote register none).
    _fresh_streams(command.unbuffered or bool(os.environ.get("PYTHONUNBUFFERED")))
    _reseed_numpy()
    preloaded, trial_dir = set(sys.modules), os.environ.get(env.TRIAL_DIR)  # before the script changes either
    if command.is_module:
        sys.argv = ["-m", *command.args]
        sys.path.insert(0, os.getcwd())
    else:
        sys.argv = [command.target, *command.args]
        sys.path.insert(0, os.path.dirname(os.path.abspath(command.target)))
    code, interrupted = 0, False
    try:
        if command.is_module:
            runpy.run_module(command.target, run_name="__main__", alter_sys=True)
        else:
            _run_script(os.path.abspath(command.target))
    except SystemExit as exit:
        code = _exit_code(exit)
    except BaseException as err:  # noqa: BLE001 - what Python prints and exits 1 for
        _print_uncaught(err)
        code, interrupted = 1, isinstance(err, KeyboardInterrupt)
    # Then, as the interpreter's end: its other threads joined, atexit run, the streams flushed.
    threading._shutdown()
    try:
        atexit._run_exitfuncs()
    except SystemExit as exit:
        code = _exit_code(exit)
    _flush_all()
    if trial_dir:
        _tell_imported(trial_dir, set(sys.modules) - preloaded)
    if interrupted:  # Python ends on an uncaught KeyboardInterrupt killed by SIGINT, as a shell expects
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code


def _run_script(path: str) -> None:
    """The script as a new interpreter runs it: a fresh __main__ whose __file__, like its code's, is the
    script's absolute path (runpy.run_path would set sys.argv[0] to it too)."""
    import builtins
    import types
    from importlib.machinery import SourceFileLoader

    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __builtins__=builtins, __cached__=None,
                         __loader__=SourceFileLoader("__main__", path))
    sys.modules["__main__"] = main
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    exec(code, main.__dict__)


def _exit_code(exit: SystemExit) -> int:
    """SystemExit's code as the interpreter makes it one: None 0, an int itself, anything else printed, 1."""
    if exit.code is None:
        return 0
    if isinstance(exit.code, int):
        return exit.code & 0xFF
    print(exit.code, file=sys.stderr)
    return 1


def _print_uncaught(err: BaseException) -> None:
    """Through sys.excepthook as Python prints an uncaught exception, the frames of this module and runpy's
    left out: the traceback starts in the trial's code."""
    tb = err.__traceback__
    while tb is not None and _ours(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    sys.excepthook(type(err), err.with_traceback(tb), tb)  # the default hook prints the exception's own


def _ours(filename: str) -> bool:
    """Whether code of this file runs the trial's (this module, runpy: frozen or not)."""
    import runpy

    return filename.startswith("<frozen runpy") or filename in (__file__, runpy.__file__)


def _fresh_streams(unbuffered: bool) -> None:
    """sys.stdin, stdout and stderr anew on fds 0, 1 and 2 as a new interpreter makes them (CPython's
    create_stdio): this environment's encoding (PYTHONIOENCODING's included, its name as codecs gives it),
    write-through when unbuffered (-u, PYTHONUNBUFFERED), else line-buffered on a terminal and for stderr."""
    import codecs
    import io

    encoding, _, errors = os.environ.get("PYTHONIOENCODING", "").partition(":")
    encoding = codecs.lookup(encoding).name if encoding else sys.__stdout__.encoding
    errors = errors or sys.__stdout__.errors

    def stream(fd: int, errors: str) -> io.TextIOWrapper:
        if fd == 0:  # always buffered, as TextIOWrapper reads through read1()
            return io.TextIOWrapper(io.BufferedReader(io.FileIO(fd, "r", closefd=False)), encoding=encoding,
                                    errors=errors)
        raw = io.FileIO(fd, "w", closefd=False)
        # Unbuffered, the text goes to the file at each write: no buffer below it (write_through alone hands it
        # to a BufferedWriter, which held a trial's output until its exit, and lost it to a SIGKILL).
        line_buffering = not unbuffered and (fd == 2 or os.isatty(fd))
        return io.TextIOWrapper(raw if unbuffered else io.BufferedWriter(raw), encoding=encoding, errors=errors,
                                line_buffering=line_buffering, write_through=unbuffered)

    sys.stdin = sys.__stdin__ = stream(0, errors)
    sys.stdout = sys.__stdout__ = stream(1, errors)
    sys.stderr = sys.__stderr__ = stream(2, "backslashreplace")


def _tell_imported(trial_dir: str, imported: Set[str]) -> None:
    """Leave the zygote the names of the modules the trial imported that it had not preloaded (it picks what
    it may preload once the trial's keeper ended); a file that cannot be written loses the news, nothing else."""
    from trialkit import layout

    try:
        with open(os.path.join(layout.home(trial_dir), layout.IMPORTED), "w") as f:
            f.write("\n".join(sorted(imported)))
    except OSError:
        pass


def _reseed_numpy() -> None:
    """numpy seeds its global generator from fresh entropy at import: preloaded once, every fork would draw the
    same numbers, so the child seeds it again (random reseeds itself after a fork)."""
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()


def _flush_all() -> None:
    for stream in (sys.stdout, sys.stderr):
        _flush(stream)


def _flush(stream) -> None:
    try:
        stream.flush()
    except (OSError, ValueError, AttributeError):
        pass

