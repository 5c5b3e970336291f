"""The manager's admin side: manager.json, the admin routes, and the CLI's client for them.

A running manager writes `<experiment dir>/manager.json` (mode 0600): its
pid and start time (which name the process for good), URL, port, the admin
token, and how long the experiment has run over all its runs. The file stays
after the manager ends: `experiment resume` binds the same port again, so
keepers still running deliver to the new manager at the URL they were given.

Admin routes take `Authorization: Bearer <admin token>`. Each action is one
function `action(runner, request) -> JSON body`, run on the experiment loop's
thread (never beside it); add one by writing it and listing it in ACTIONS:

    POST /api/v1/admin/experiment/stop              stop the experiment (trials stopped gracefully)
    POST /api/v1/admin/experiment/pause             pause its running trials; start nothing until activated
    POST /api/v1/admin/experiment/activate          queue its paused trials again; go on
    POST /api/v1/admin/trials/<trial_id>/kill       stop one trial (USER_CANCELED); another takes its slot
    POST /api/v1/admin/trials/<trial_id>/pause      stop it with a checkpoint (PREEMPTED); its slot frees
    POST /api/v1/admin/trials/<trial_id>/activate   queue a paused trial again
    POST /api/v1/admin/queue/moves                  {"moves": [{"trial_id", one of "priority",
                                                    "ahead_of", "behind_of"}, ...]}: all or none

A move the loop refuses (an unknown trial, a running one) answers 404/409
with one line saying why.
"""
from __future__ import annotations

import dataclasses
import hmac
import json
import os
import secrets
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Tuple

from trialkit import process
from trialkit.manager import paths
from trialkit.control.queue import Move
from trialkit.manager.server import HttpError, ManagerServer, Request
from trialkit.errors import UserError

if TYPE_CHECKING:
    from trialkit.control.runner import Runner

CLIENT_TIMEOUT = 30.0


@dataclass
class ManagerInfo:
    experiment_id: str
    pid: int
    start_ticks: int
    url: str
    port: int
    token: str
    elapsed: float = 0.0  # seconds the experiment ran, over all its runs, as of the last write

    @classmethod
    def for_this_process(cls, experiment_id: str, url: str, port: int, elapsed: float) -> "ManagerInfo":
        pid = os.getpid()
        return cls(experiment_id, pid, process.start_ticks(pid), url, port, secrets.token_urlsafe(32), elapsed)

    def running(self) -> bool:
        """Whether the manager that wrote this still runs (a reused pid has another start time)."""
        try:
            return process.start_ticks(self.pid) == self.start_ticks
        except (IndexError, ValueError):
            return False


def write_info(experiment_dir: Path, info: ManagerInfo) -> None:
    path = Path(experiment_dir) / paths.MANAGER_FILE
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds the admin token
    with os.fdopen(fd, "w") as f:
        json.dump(dataclasses.asdict(info), f)
    os.replace(tmp, path)


def read_info(experiment_dir: Path) -> Optional[ManagerInfo]:
    try:
        data = json.loads((Path(experiment_dir) / paths.MANAGER_FILE).read_text())
        return ManagerInfo(**data)
    except (OSError, ValueError, TypeError):
        return None


# -- the actions (on the experiment loop's thread) ----------------------------------------


def stop_experiment(runner: "Runner", request: Request) -> Any:
    runner.stop_experiment_by_user("stopped by `trialkit experiment stop`")
    return {"stopping": True}


def pause_experiment(runner: "Runner", request: Request) -> Any:
    runner.pause_experiment()
    return {"paused": True}


def activate_experiment(runner: "Runner", request: Request) -> Any:
    runner.activate_experiment()
    return {"paused": False}


def kill_trial(runner: "Runner", request: Request) -> Any:
    runner.kill_trial(request.params["trial_id"])
    return {"stopping": request.params["trial_id"]}


def pause_trial(runner: "Runner", request: Request) -> Any:
    runner.pause_trial(request.params["trial_id"])
    return {"pausing": request.params["trial_id"]}


def activate_trial(runner: "Runner", request: Request) -> Any:
    runner.activate_trial(request.params["trial_id"])
    return {"queued": request.params["trial_id"]}


def move_jobs(runner: "Runner", request: Request) -> Any:
    body = request.json()
    if not isinstance(body, dict) or not isinstance(body.get("moves"), list):
        raise HttpError(400, 'expected {"moves": [...]}')
    try:
        moves = [Move.from_json(item) for item in body["moves"]]
    except ValueError as err:
        raise HttpError(400, str(err)) from None
    runner.move_jobs(moves)
    return {"queue": runner.queue.order()}


Action = Callable[["Runner", Request], Any]
ACTIONS: List[Tuple[str, str, Action]] = [
    ("POST", "/api/v1/admin/experiment/stop", stop_experiment),
    ("POST", "/api/v1/admin/experiment/pause", pause_experiment),
    ("POST", "/api/v1/admin/experiment/activate", activate_experiment),
    ("POST", "/api/v1/admin/trials/<trial_id>/kill", kill_trial),
    ("POST", "/api/v1/admin/trials/<trial_id>/pause", pause_trial),
    ("POST", "/api/v1/admin/trials/<trial_id>/activate", activate_trial),
    ("POST", "/api/v1/admin/queue/moves", move_jobs),
]


def install(server: ManagerServer, token: str, runner: "Runner") -> None:
    """Add the admin routes to the server, each behind the admin token."""
    for method, pattern, action in ACTIONS:
        server.router.add(method, pattern, _guarded(action, token, runner))


def _guarded(action: Action, token: str, runner: "Runner") -> Callable[[Request], Tuple[int, Any]]:
    def handler(request: Request) -> Tuple[int, Any]:
        given = request.bearer()
        if given is None or not hmac.compare_digest(given.encode(), token.encode()):
            raise HttpError(401, "admin routes need the admin token from manager.json")
        return 200, runner.call(action, runner, request)
    return handler


# -- the client (the CLI) --------------------------------------------------------------


def running_manager(experiment_id: str) -> ManagerInfo:
    """The running manager of an experiment; UserError when none runs."""
    info = read_info(paths.experiment_dir(experiment_id))
    if info is None or not info.running():
        raise UserError(f"experiment {experiment_id} is not running", "EXPERIMENT_ID",
                        f"resume it with `trialkit experiment resume {experiment_id}`")
    return info


def call(experiment_id: str, method: str, path: str, body: Any = None) -> Any:
    """An admin request to the experiment's running manager; its JSON answer."""
    info = running_manager(experiment_id)
    data = json.dumps({} if body is None else body).encode() if method == "POST" else None
    # The manager listens on loopback or on every address: loopback reaches it either way.
    request = urllib.request.Request(f"http://127.0.0.1:{info.port}{path}", data=data,
                                     method=method, headers={"Authorization": f"Bearer {info.token}",
                                                             "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=CLIENT_TIMEOUT) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as err:
        try:
            reason = json.loads(err.read()).get("error", err.reason)
        except (ValueError, AttributeError):
            reason = err.reason
        raise UserError(f"the manager refused: {reason}", experiment_id) from None
    except OSError as err:
        raise UserError(f"cannot reach the manager of {experiment_id} on port {info.port}: {err}", experiment_id,
                        "see its manager.log") from None
