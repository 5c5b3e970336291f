"""`trialkit ui [ID]`: the page over stored experiments, read-only, after their managers ended."""
from __future__ import annotations

import secrets
from pathlib import Path
from typing import List, Optional, Tuple

from trialkit.control import admin
from trialkit.manager import paths, ports
from trialkit.manager.server import ManagerServer
from trialkit.manager.store import DB_NAME
from trialkit.errors import UserError
from trialkit.web.catalog import Catalog
from trialkit.web.address import page_url
from trialkit.web.routes import install


def serve_ui(experiment_id: Optional[str], port: int, host: str = "127.0.0.1") -> int:
    """Serve one experiment (or every one under TRIALKIT_HOME) until interrupted; print the URL with its token.

    One experiment whose run has ended is served where its run served it (the port and the page's token of
    its last manager, from manager.json) when that port is free and none was asked for: the address the run
    printed answers again, and a tab still open on it takes up where it was; where that port is taken, it
    serves on a free one and says so first (`ports.moved`). One whose run still goes is not
    served again: its run serves the live page (with its actions), whose address this prints."""
    found = _stores(experiment_id)
    if not found:
        raise UserError(f"no experiments under {paths.experiments_root()}", "trialkit ui",
                        "run one first, or set TRIALKIT_HOME to where they were run")
    last = admin.read_info(paths.experiment_dir(experiment_id)) if experiment_id is not None else None
    if last is not None and last.running():
        print(f"experiment {experiment_id} is running: its run serves the live page at "
              f"{page_url(last.url, last.token, experiment_id)}", flush=True)
        return 0
    server, token, again, moved = _listen(None if port else last, port, host)
    catalog = install(server, Catalog(lambda: _stores(experiment_id)), admin_token=token, read_only=True)

    def ready() -> None:
        if moved is not None:
            print(moved, flush=True)
        print(f"trialkit ui: {page_url(server, token, experiment_id)}", flush=True)
        print(("the address its run printed, " if again else "") + "read-only, until Ctrl-C", flush=True)

    try:
        server.serve_until_signalled(ready)
    finally:
        catalog.close()
    return 0


def _listen(last: Optional[admin.ManagerInfo], port: int,
            host: str) -> Tuple[ManagerServer, str, bool, Optional[str]]:
    """(server, admin token, whether it is the run's own address: `last`'s, its ended run's manager.json, and
    where that address is taken, the line that says where it serves instead).
    No store: the server then has no keeper route, and the page here has no action route: nothing writes."""
    if last is None:
        return ManagerServer(None, host, port), secrets.token_urlsafe(24), False, None
    try:
        return ManagerServer(None, host, last.port), last.token, True, None
    except OSError:
        who = ports.holder(last.port)  # while it still holds it
    server = ManagerServer(None, host, 0)
    return server, secrets.token_urlsafe(24), False, ports.moved(last.port, who, server.url)


def _stores(experiment_id: Optional[str]) -> List[Path]:
    """The store files to show: the one experiment's, else every experiment's (looked for again on each list)."""
    dirs = [paths.experiment_dir(experiment_id)] if experiment_id is not None else paths.all_experiment_dirs()
    return [d / DB_NAME for d in dirs]
