"""The manager's HTTP side of a running experiment, wired to its loop.

    listening = Listening.on(store, config, port)     # bound (a taken --port refuses here), not serving yet
    manager = Manager.start(loop, listening, page=hook)  # serving; manager.json written
    manager.url                                       # what trials are told to deliver to
    manager.close(note)                               # the page's open tabs are told `note`, then it stops

One server (trialkit.manager.server) serves four things: the keepers' routes,
whose stored records go to the loop's queue; the admin routes, one per action
of the table (trialkit.control.actions) behind the admin token, each run on
the loop's thread; /metrics for Prometheus (trialkit.manager.metrics, behind
the admin, page or TRIALKIT_METRICS_TOKEN token); and, when the face that
started the experiment shows one, the page. The page comes as a hook (`PageHook`) that the face passes in: the
control plane never imports trialkit.web, the page imports the action table.

It listens on loopback for local trials and on every address otherwise,
telling trials trainingService.managerAddress, nniManagerIp or the host name.
Kept apart from the loop (trialkit.control.loop), which knows nothing of HTTP
but the action table's answers.
"""
from __future__ import annotations

import hmac
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Optional, Tuple

from trialkit.control import actions
from trialkit.control.actions import Action, Performer
from trialkit.control.admin import ManagerInfo, write_info
from trialkit.control.config import ExperimentConfig
from trialkit.env import METRICS_TOKEN
from trialkit.errors import UserError
from trialkit.manager import metrics, ports
from trialkit.manager.routes import HttpError, Request
from trialkit.manager.server import ManagerServer
from trialkit.manager.store import Store

if TYPE_CHECKING:
    from trialkit.control.loop import Loop


@dataclass
class AttachedPage:
    url: str  # printed at the start: the page, with what opens it
    close: Callable[[], None]  # called once the server has stopped
    token: Optional[str] = None  # the page's token: it opens /metrics too


# (server, the experiment's store, manager.json's info, who performs the page's actions) -> the attached page
PageHook = Callable[[ManagerServer, Store, ManagerInfo, Performer], AttachedPage]


class Listening(NamedTuple):
    """A manager's socket, bound before the experiment's store is written to: a port that is taken refuses the
    start while nothing has changed (a resume refused so had left a stopped experiment INTERRUPTED)."""
    server: ManagerServer
    taken: Optional[Tuple[int, Optional[str]]]  # the earlier run's port, and who holds it, when it moved

    @classmethod
    def on(cls, store: Store, config: ExperimentConfig, port: Optional[int],
           last_port: Optional[int] = None) -> "Listening":
        """Listen on `port` (UserError when taken); without one on `last_port`, the earlier run's, else (taken)
        any free one, said later in the manager's `moved`."""
        host = "127.0.0.1" if config.platform == "local" else "0.0.0.0"
        try:
            return cls(ManagerServer(store, host, port or last_port or 0, tls=tls_files(config)), None)
        except OSError as err:
            if port or not last_port:
                raise UserError(f"cannot listen on {host}:{port}: {err.strerror}", "--port",
                                "pick a free port, or leave --port out for any free one") from None
            taken = last_port, ports.holder(last_port)  # while it still holds it
            return cls(ManagerServer(store, host, 0, tls=tls_files(config)), taken)


class Manager:
    def __init__(self, server: ManagerServer, info: ManagerInfo, experiment_dir: Path,
                 page: Optional[AttachedPage], moved: Optional[str] = None):
        self.server = server
        self.info = info
        self.experiment_dir = experiment_dir
        self.page = page
        self.moved = moved  # the line that says the earlier run's port was taken, and where this one listens

    @classmethod
    def start(cls, loop: "Loop", listening: Listening, page: Optional[PageHook] = None,
              token: Optional[str] = None) -> "Manager":
        """Wire the routes to the loop, serve, write manager.json; `token`: the admin token of the experiment's
        earlier run, kept (ManagerInfo.for_this_process)."""
        server, taken = listening.server, listening.taken
        bound = server.url.rsplit(":", 1)[1]
        url = server.url if loop.config.platform == "local" else f"{server.scheme}://{_advertised_host(loop.config)}:{bound}"
        info = ManagerInfo.for_this_process(loop.experiment_id, url, int(bound), loop.elapsed_before, token)
        install_admin_routes(server, info.token, loop)
        attached = page(server, loop.store, info, loop) if page is not None else None
        metrics.install(server, loop.store, [info.token, attached and attached.token, os.environ.get(METRICS_TOKEN)])
        server.add_listener(loop.stored)
        server.start()
        manager = cls(server, info, loop.experiment_dir, attached, ports.moved(*taken, url) if taken else None)
        manager.save(loop.elapsed())
        return manager

    @property
    def url(self) -> str:
        return self.info.url

    def save(self, elapsed: float) -> None:
        """manager.json with how long the experiment has run: kept current, so a manager killed outright
        resumes with the time it had."""
        self.info.elapsed, self.info.saved = elapsed, time.time()
        write_info(self.experiment_dir, self.info, self.server.disk)

    def close(self, note: str) -> None:
        """Stop serving: a page open now shows what was stored last, then `note` (why its server went)."""
        self.server.stop(note)
        if self.page is not None:
            self.page.close()


def install_admin_routes(server: ManagerServer, token: str, performer: Performer) -> None:
    """One route per action of the table, behind the admin token (checked before the body is read)."""
    def check(request: Request) -> None:
        given = request.bearer()
        if given is None or not hmac.compare_digest(given.encode(), token.encode()):
            raise HttpError(401, "admin routes need the admin token from manager.json")

    for action in actions.ACTIONS:
        server.router.add(action.method, action.route, _performed(action, performer), check)


def _performed(action: Action, performer: Performer) -> Callable[[Request], Tuple[int, Any]]:
    def handler(request: Request) -> Tuple[int, Any]:
        body = request.json() if request.body else {}
        return 200, performer.perform(action, request.params.get("trial_id"), body)
    return handler


def tls_files(config: ExperimentConfig) -> Optional[Tuple[str, str]]:
    """(certificate, key) when the manager serves HTTPS (managerTls, or `run --tls-cert/--tls-key`)."""
    return (config.manager_tls["certFile"], config.manager_tls["keyFile"]) if config.manager_tls else None


def _advertised_host(config: ExperimentConfig) -> str:
    common = getattr(config.training_service, "common", None)  # the Kubernetes platforms' shared section
    return getattr(common, "manager_address", None) or config.nni_manager_ip or socket.gethostname()
