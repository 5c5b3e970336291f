"""The warm start of local trials: one warm process (a zygote) per experiment, which forks their keepers.

    python -c RUN_MODULE_OFF_CWD trialkit.keeper.zygote FD SKIP CODE_DIR COMMAND...   (the local platform starts it)

Started as a keeper would be (the trial's environment less what differs from trial to trial, warm.PER_TRIAL),
it imports the keeper's modules and what the trial's script imports at its top level from outside the code
dir (numpy, torch, ...: never the user's own modules, nor the SDK, which read the trial's identity), then
serves fork requests on the socket FD: for each trial, a message with the trial's environment and working
dir and the trial log's fd; the child does what run.sh and the keeper's __main__ do for a local trial (its
own session, stdio to the log, the environment, the dir, default signals) and runs the keeper, whose own
fork of an eligible command (keeper/warm.py) then finds those modules imported. The answer is the child's
pid and a pidfd opened before the zygote could reap it, so it names that process for good; asked later, it
says how a keeper it forked ended (its parent alone reaps it: the platform's status of a keeper that died
before its trial names the signal, as a cold keeper's does). A module whose
import starts a thread (numpy's OpenBLAS pool, unless OMP_NUM_THREADS=1) is not preloaded: the zygote starts
again without it (SKIP). A zygote that runs more than one thread at a fork answers why instead (a fork would
copy their locks held): the platform then starts its trials cold. Once a trial's keeper ended, what the trial
imported as it ran is preloaded as well (Learner). It ends when the socket's other end
closes: the experiment's end, or its control plane's exit, however it exited; the keepers it forked go on.
"""
from __future__ import annotations

import gc
import json
import os
import select
import signal
import socket
import sys
from pathlib import Path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Sequence, Set, Tuple

from trialkit import env, layout
from trialkit.keeper import warm
from trialkit.process import RUN_MODULE_OFF_CWD, exit_code, shell_line_argv, spawn

MODULE = "trialkit.keeper.zygote"  # as run (__name__ is __main__ there)
REQUEST_BYTES = 1 << 22  # a request is the trial's environment, in one message
PROBE_SECONDS = 15.0  # the longest a fork may take to import what trials imported (Learner)
FIRST_ANSWER_SECONDS = 120.0  # the first answer waits for the preload (torch takes seconds)


class WarmStartError(Exception):
    """The zygote cannot fork this trial's keeper (why): the trial starts cold, and so do the experiment's next."""


class Zygote:
    """The platform's end of an experiment's zygote."""

    def __init__(self, environ: Dict[str, str], code_dir: str, cwd: str, log: Path):
        import subprocess

        self.environ = warm.shared_environ(environ)
        self.log = log
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            argv = [environ[env.PYTHON], "-c", RUN_MODULE_OFF_CWD, MODULE, str(theirs.fileno()), "", code_dir,
                    *shell_line_argv(environ.get(env.COMMAND, ""))]
            with open(log, "ab") as out:
                self.child = spawn(argv, env=self.environ, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT,
                                   pass_fds=(theirs.fileno(),), in_child=False, name="zygote")
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.settimeout(FIRST_ANSWER_SECONDS)
        self._socket = ours

    def fork(self, environ: Dict[str, str], cwd: str, log: int) -> Tuple[int, int]:
        """(pid, pidfd) of a keeper forked for a trial with this environment, working dir and log fd."""
        try:
            socket.send_fds(self._socket, [json.dumps({"environ": environ, "cwd": cwd}).encode()], [log])
            message, fds, _, _ = socket.recv_fds(self._socket, 4096, 1)
        except ConnectionError:  # it ended with the request unread
            message = b""
        except OSError as err:  # its first answer waits for its preload: FIRST_ANSWER_SECONDS
            raise WarmStartError(f"the warm process does not answer ({err})") from None
        if not message:
            raise WarmStartError(f"the warm process ended (its log: {self.log})")
        answer = json.loads(message)
        if "error" in answer:
            raise WarmStartError(answer["error"])
        return answer["pid"], fds[0]

    def exit_code(self, pid: int) -> Optional[int]:
        """The exit code of a keeper it forked that has exited (its parent alone reaps it); None when it cannot
        say (it ended, or the keeper is not its child)."""
        try:
            self._socket.send(json.dumps({"reap": pid}).encode())
            message = self._socket.recv(4096)
        except OSError:
            return None
        return json.loads(message)["exit_code"] if message else None

    def close(self) -> None:
        """End it (it sees the socket close); the keepers it forked go on."""
        self._socket.close()
        try:
            self.child.popen.wait(timeout=5)
        except Exception:  # noqa: BLE001 - stuck in an import: it goes now
            self.child.popen.kill()
            self.child.popen.wait()


# ---------------------------------------------------------------- the zygote's side


def preloads(command: Sequence[str], code_dir: str) -> List[str]:
    """The modules the command's script (or -m module) imports at its top level that are not in the code dir,
    nor trialkit's or NNI's (the SDK reads the trial's identity), and that this Python finds."""
    import ast

    found = warm.python_command(command, dict(os.environ), code_dir)
    if found is None:
        return []
    path = Path(code_dir, found.target) if not found.is_module else _module_file(code_dir, found.target)
    try:
        tree = ast.parse(path.read_bytes()) if path is not None else ast.Module(body=[])
    except (OSError, SyntaxError, ValueError):
        return []
    names: List[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return [name for name in dict.fromkeys(names) if preloadable(name, code_dir)]


def preloadable(name: str, code_dir: str) -> bool:
    """Whether a module may be imported in the zygote: found by this Python, from outside the code dir, and
    neither trialkit's nor NNI's (the SDK reads the trial's identity)."""
    from importlib.util import find_spec

    top = name.partition(".")[0]
    if top in ("__future__", "__main__", "trialkit", "nni") or _in_code_dir(code_dir, top):
        return False
    try:
        spec = find_spec(top)
    except (ImportError, ValueError):
        return False
    return spec is not None and not (spec.origin or "").startswith(os.path.abspath(code_dir) + os.sep)


def _module_file(code_dir: str, module: str) -> Optional[Path]:
    base = Path(code_dir, *module.split("."))
    for path in (base / "__main__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def _in_code_dir(code_dir: str, top: str) -> bool:
    return any(os.path.exists(os.path.join(code_dir, top + suffix)) for suffix in ("", ".py"))


def main(argv: Sequence[str]) -> None:
    """argv: the socket's fd, the modules not to preload (comma-separated), the code dir, the trial's command."""
    gc.disable()  # what is imported lives on; frozen below, so no fork copies it for a collection to touch
    fd, skip, code_dir, command = int(argv[0]), set(filter(None, argv[1].split(","))), argv[2], argv[3:]
    import trialkit.keeper.keep  # noqa: F401 - the keeper's reporting side, for every trial
    from trialkit.keeper import main as keeper

    keeper.fork_command = warm.fork_command
    for name in preloads(command, code_dir):
        if name in skip:
            continue
        try:
            __import__(name)
        except BaseException as err:  # noqa: BLE001 - the trial imports it itself, and says why it fails
            print(f"zygote: {name} not preloaded: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        if warm.single_threaded() is not None:
            # A fork copies no thread: this process starts again without what started one (numpy's OpenBLAS
            # pool without OMP_NUM_THREADS=1); its trials import it themselves, the rest still comes preloaded.
            print(f"zygote: {name} started a thread at import: not preloaded", file=sys.stderr, flush=True)
            os.set_inheritable(fd, True)
            os.execv(sys.executable, [sys.executable, "-c", RUN_MODULE_OFF_CWD, MODULE, str(fd),
                                      ",".join(sorted(skip | {name})), code_dir, *command])
    gc.freeze()
    serve(socket.socket(fileno=fd), keeper.main, Learner(code_dir, skip))


def serve(sock: socket.socket, run_keeper, learner: "Learner") -> None:
    """Fork a keeper for each request, and say how one ended when asked, until the socket's other end closes;
    reap them as they end; then preload what their trials imported (`learner`)."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    ended: Dict[int, int] = {}  # reaped keepers' exit codes, by pid, until asked
    while True:
        readable, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in readable:
            try:
                os.read(wake_r, 4096)
            except BlockingIOError:
                pass
            _reap(ended)
        if sock in readable:
            message, fds, _, _ = socket.recv_fds(sock, REQUEST_BYTES, 1)
            if not message:
                return
            request = json.loads(message)
            if "reap" in request:
                sock.send(json.dumps({"exit_code": _exit_code(request["reap"], ended)}).encode())
                learner.reaped(request["reap"])  # after the answer: the platform waits for no import
            else:
                pid = _fork_keeper(request, fds[0], sock, (wake_r, wake_w), run_keeper)
                ended.pop(pid, None)
                learner.forked(pid, request["environ"].get(env.TRIAL_DIR))


class Learner:
    """Preloads the modules that trials imported beside the preloaded ones (numpy loads numpy.random at its
    first use; np.load imports zipfile): imported once here, not again in every trial. A warm trial leaves their
    names in its trial dir as it ends (warm.run_python); read once its keeper is reaped, before the next fork.
    Only what preloadable() allows, never what the zygote was started without (`skip`), and only what a fork
    that imported it kept one thread with (the rule of the zygote's own preloads); a module is tried once."""

    def __init__(self, code_dir: str, skip: Set[str]):
        self.code_dir = code_dir
        self.skip = skip
        self.tried: Set[str] = set()
        self.trial_dirs: Dict[int, str] = {}  # forked keepers' trial dirs, by pid, until reaped

    def forked(self, pid: int, trial_dir: Optional[str]) -> None:
        if pid and trial_dir:
            self.trial_dirs[pid] = trial_dir

    def reaped(self, pid: int) -> None:
        trial_dir = self.trial_dirs.pop(pid, None)
        if trial_dir is None:
            return
        path = os.path.join(layout.home(trial_dir), layout.IMPORTED)
        try:
            with open(path) as f:
                names = set(f.read().split())
            os.unlink(path)
        except OSError:
            return
        new = sorted(name for name in names - self.tried if name not in sys.modules
                     and name.partition(".")[0] not in self.skip and preloadable(name, self.code_dir))
        self.tried.update(names)
        if new and not _import_keeps_one_thread(new):  # one package's thread would keep the others out
            groups: Dict[str, List[str]] = {}
            for name in new:
                groups.setdefault(name.partition(".")[0], []).append(name)
            kept = {top: group for top, group in groups.items() if _import_keeps_one_thread(group)}
            print(f"zygote: not preloaded (a thread started at import, or it hung): "
                  f"{', '.join(sorted(set(groups) - set(kept)))}", file=sys.stderr, flush=True)
            new = [name for group in kept.values() for name in group]
        if not new:
            return
        for name in new:
            try:
                __import__(name)
            except BaseException:  # noqa: BLE001 - a trial imported it; here it only would have saved time
                pass
        gc.freeze()
        print(f"zygote: preloads {len(new)} more modules that trials imported", file=sys.stderr, flush=True)


def _import_keeps_one_thread(names: List[str]) -> bool:
    """Whether a fork of this process that imports `names` still runs one thread (and ends within PROBE_SECONDS:
    meanwhile the zygote forks no keeper)."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for name in names:
                try:
                    __import__(name)
                except BaseException:  # noqa: BLE001
                    pass
            code = 0 if warm.single_threaded() is None else 1
        finally:
            os._exit(code)
    pidfd = os.pidfd_open(pid)
    try:
        if not select.select([pidfd], [], [], PROBE_SECONDS)[0]:
            os.kill(pid, signal.SIGKILL)
    finally:
        os.close(pidfd)
    _, status = os.waitpid(pid, 0)
    return exit_code(status) == 0


def _reap(ended: Dict[int, int]) -> None:
    """Reap the keepers that ended, their exit codes kept until the platform asks."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        ended[pid] = exit_code(status)


def _exit_code(pid: int, ended: Dict[int, int]) -> Optional[int]:
    """How keeper `pid` ended: reaped already, or now (the platform asks once its pidfd said it exited)."""
    if pid not in ended:
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:  # not ours, or asked twice
            return None
        return exit_code(status)
    return ended.pop(pid)


def _fork_keeper(request: Dict, log: int, sock: socket.socket, wake: Tuple[int, int], run_keeper) -> int:
    """Fork the keeper a request asks for and answer with its pid and a pidfd, or why not; its pid (0: none)."""
    why = warm.single_threaded()
    if why is not None:
        os.close(log)
        socket.send_fds(sock, [json.dumps({"error": why}).encode()], [])
        return 0
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid == 0:
        try:
            _become_keeper(request, log, sock, wake, run_keeper)
        finally:
            os._exit(1)
    os.close(log)
    pidfd = os.pidfd_open(pid)  # not reaped before this: the pid is still the child's
    try:
        socket.send_fds(sock, [json.dumps({"pid": pid}).encode()], [pidfd])
    finally:
        os.close(pidfd)
    return pid


def _become_keeper(request: Dict, log: int, sock: socket.socket, wake: Tuple[int, int], run_keeper) -> None:
    """What run.sh and the keeper's __main__ do for a local trial, then the keeper; never returns."""
    os.setsid()
    sock.close()
    for fd in wake:
        os.close(fd)
    warm.reset_signals()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.environ.clear()
    os.environ.update(request["environ"])
    os.chdir(request["cwd"])
    run_keeper([])  # the keeper's main(): it leaves by os._exit


if __name__ == "__main__":
    main(sys.argv[1:])
