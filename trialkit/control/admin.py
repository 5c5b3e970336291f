"""The manager's admin side as its clients see it: manager.json, and the CLI's client for the admin routes.

A running manager writes `<experiment dir>/manager.json` (mode 0600): its
pid and start time (which name the process for good), URL, port, the admin
token, and how long the experiment has run over all its runs (the time it
stood stopped between them counts not, as NNI's execDuration) with the time of
that write, so a reader adds what the running manager ran since. The file stays
after the manager ends: `experiment resume` binds the same port again, so
keepers still running deliver to the new manager at the URL they were given.

The admin routes are the action table's (trialkit.control.actions, installed
by trialkit.control.manager_http), behind `Authorization: Bearer <admin
token>`. The CLI and the Python API act through them:

    act(experiment_id, "trial", "pause", trial_id)      # POST /api/v1/admin/trials/<id>/pause
    act(experiment_id, "queue", "moves", body={"moves": [...]})
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from trialkit import env, process
from trialkit.errors import UserError
from trialkit.manager import paths

if TYPE_CHECKING:
    import ssl

    from trialkit.manager.disk import DiskWatch

CLIENT_TIMEOUT = 30.0
# The commands that only read (experiment list/show, job list) read manager.json and nothing else here: the HTTP
# client (http.client, ssl, email), the action table and dataclasses (inspect) wait for the commands that act.


class ManagerInfo:
    """What manager.json holds. A plain class, not a dataclass: dataclasses loads inspect, milliseconds of every
    `trialkit experiment list`."""

    FIELDS = ("experiment_id", "pid", "start_ticks", "url", "port", "token", "elapsed", "saved")

    def __init__(self, experiment_id: str, pid: int, start_ticks: int, url: str, port: int, token: str,
                 elapsed: float = 0.0, saved: Optional[float] = None):
        self.experiment_id = experiment_id
        self.pid = pid
        self.start_ticks = start_ticks
        self.url = url
        self.port = port
        self.token = token
        self.elapsed = elapsed  # seconds the experiment ran, over all its runs, as of the last write
        self.saved = saved  # time.time() of that write; None in a file an older trialkit wrote

    def __repr__(self) -> str:
        return f"ManagerInfo(experiment_id={self.experiment_id!r}, pid={self.pid}, url={self.url!r})"  # no token

    @classmethod
    def for_this_process(cls, experiment_id: str, url: str, port: int, elapsed: float,
                         token: Optional[str] = None) -> "ManagerInfo":
        """This process's manager; `token`: the experiment's earlier run's (a resume keeps it: the page's token
        comes from it, so the page address a user kept from any run opens the experiment's page again)."""
        import secrets

        pid = os.getpid()
        return cls(experiment_id, pid, process.start_ticks(pid), url, port, token or secrets.token_urlsafe(32),
                   elapsed, time.time())

    def to_json(self) -> dict:
        return {name: getattr(self, name) for name in self.FIELDS}

    def ran(self, now: Optional[float] = None) -> float:
        """Seconds the experiment's runs ran, summed (what `experiment show`, the page and NNI's execDuration
        say): up to `now` while this manager runs; a run that is over counts up to its last write."""
        if self.saved is None or not self.running():
            return self.elapsed
        return self.elapsed + max(0.0, (time.time() if now is None else now) - self.saved)

    def running(self) -> bool:
        """Whether the manager that wrote this still runs (a reused pid has another start time)."""
        return process.is_running(self.pid, self.start_ticks)


def write_info(experiment_dir: Path, info: ManagerInfo, disk: Optional[DiskWatch] = None) -> bool:
    """Replace manager.json; False when `disk` took note that the disk refused it (the next write tries again)."""
    path = Path(experiment_dir) / paths.MANAGER_FILE
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds the admin token
        with os.fdopen(fd, "w") as f:
            json.dump(info.to_json(), f)
        os.replace(tmp, path)
    except OSError as err:
        try:
            tmp.unlink()
        except OSError:
            pass
        if disk is None or not disk.failed(err, paths.MANAGER_FILE):
            raise
        return False  # the run goes on: the file lags, the manager keeps its state in memory
    return True


def _loopback_tls(scheme: str) -> Optional[ssl.SSLContext]:
    """For a manager serving HTTPS: its certificate names the address trials use, not 127.0.0.1, and the
    client found this manager by its running pid in manager.json (mode 0600), so it is not checked here."""
    if scheme != "https":
        return None
    import ssl

    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def read_info(experiment_dir: Path) -> Optional[ManagerInfo]:
    try:
        data = json.loads(env.read_regular_file(Path(experiment_dir) / paths.MANAGER_FILE, 1 << 20))
        return ManagerInfo(**data)
    except (OSError, ValueError, TypeError):
        return None


# -- the client (the CLI) --------------------------------------------------------------


def running_manager(experiment_id: str, where: str = "EXPERIMENT_ID") -> ManagerInfo:
    """The running manager of an experiment; UserError when none runs, saying whether it ended, placed at
    `where` (the argument that named it: a trial's command names the experiment by the trial)."""
    info = read_info(paths.experiment_dir(experiment_id))
    if info is None or not info.running():
        ended = ended_status(experiment_id)
        if ended is None:  # interrupted: its manager is gone before its end
            # Its trials may run on unwatched (`experiment show` says): only a manager, the resume's, reaches them.
            raise UserError(f"experiment {experiment_id} is not running: its manager is gone (INTERRUPTED)", where,
                            f"resume it with `trialkit experiment resume {experiment_id} --detach`, then run this "
                            f"again: the resume takes up the trials that run on unwatched")
        results = f"its results: `trialkit experiment show {experiment_id}`"
        raise UserError(f"experiment {experiment_id} has ended ({ended}): nothing of it runs now", where,
                        results if ended == "DONE" else f"{results}; go on with `trialkit experiment resume {experiment_id}`")
    return info


def ended_status(experiment_id: str) -> Optional[str]:
    """DONE, STOPPED or ERROR: how the stored experiment ended; None while it is not over (it runs, it
    was interrupted, it is paused) or when there is no store to say."""
    import sqlite3

    from trialkit.manager.store import Store
    from trialkit.statuses import DONE, ERROR, STOPPED

    try:
        store = Store.reader(paths.experiment_dir(experiment_id) / paths.DB_NAME)
    except (UserError, sqlite3.DatabaseError):
        return None
    try:
        stored = store.experiment(experiment_id)
    finally:
        store.close()
    status = stored and stored["status"]
    return status if status in (DONE, STOPPED, ERROR) else None


def call(experiment_id: str, method: str, path: str, body: Any = None, where: str = "EXPERIMENT_ID") -> Any:
    """An admin request to the experiment's running manager; its JSON answer. `where`: as running_manager's."""
    import http.client
    import urllib.error
    import urllib.request

    info = running_manager(experiment_id, where)
    data = json.dumps({} if body is None else body).encode() if method == "POST" else None
    # The manager listens on loopback or on every address: loopback reaches it either way.
    scheme = "https" if info.url.startswith("https:") else "http"
    request = urllib.request.Request(f"{scheme}://127.0.0.1:{info.port}{path}", data=data,
                                     method=method, headers={"Authorization": f"Bearer {info.token}",
                                                             "Content-Type": "application/json"})
    answer = b""
    try:
        with urllib.request.urlopen(request, timeout=CLIENT_TIMEOUT, context=_loopback_tls(scheme)) as response:
            answer = response.read()
        return json.loads(answer or b"null")
    except ValueError:  # not the manager's JSON: another program on its port, or a proxy's page
        raise UserError(f"the answer on port {info.port} is not the manager's (not JSON: {answer[:60]!r})",
                        experiment_id, "see its manager.log; is another program listening there?") from None
    except urllib.error.HTTPError as err:
        try:
            reason = json.loads(err.read()).get("error", err.reason)
        except (ValueError, AttributeError):
            reason = err.reason
        raise UserError(f"the manager refused: {reason}", experiment_id) from None
    except (OSError, http.client.HTTPException) as err:  # HTTPException: what answers is not HTTP
        raise UserError(f"cannot reach the manager of {experiment_id} on port {info.port}: {err}", experiment_id,
                        "see its manager.log") from None


def act(experiment_id: str, on: str, name: str, trial_id: Optional[str] = None, body: Any = None,
        where: Optional[str] = None) -> Any:
    """One action of the table (trialkit.control.actions) on the experiment's running manager; its JSON answer.
    `where`: the argument that named the experiment (TRIAL_ID when a trial's id did), for a refusal to point at."""
    from trialkit.control import actions

    action = actions.find(on, name)
    return call(experiment_id, action.method, action.path(trial_id), body,
                where or ("TRIAL_ID" if trial_id else "EXPERIMENT_ID"))
