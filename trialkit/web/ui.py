"""`trialkit ui [ID]`: the page over stored experiments, read-only, after their managers ended."""
from __future__ import annotations

import secrets
from pathlib import Path
from typing import List, Optional

from trialkit.manager import paths
from trialkit.manager.server import ManagerServer
from trialkit.manager.store import DB_NAME
from trialkit.errors import UserError
from trialkit.web.catalog import Catalog
from trialkit.web.routes import install, page_url


def serve_ui(experiment_id: Optional[str], port: int, host: str = "127.0.0.1") -> int:
    """Serve one experiment (or every one under TRIALKIT_HOME) until interrupted; print the URL with its token."""
    found = _stores(experiment_id)
    if not found:
        raise UserError(f"no experiments under {paths.experiments_root()}", "trialkit ui",
                        "run one first, or set TRIALKIT_HOME to where they were run")
    # No store: the server then has no keeper route, and the page here has no action route: nothing writes.
    server = ManagerServer(None, host, port)
    token = secrets.token_urlsafe(24)
    catalog = install(server, Catalog(lambda: _stores(experiment_id)), admin_token=token, read_only=True)
    print(f"trialkit ui: {page_url(server, token, experiment_id)}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        catalog.close()
    return 0


def _stores(experiment_id: Optional[str]) -> List[Path]:
    """The store files to show: the one experiment's, else every experiment's (looked for again on each list)."""
    dirs = [paths.experiment_dir(experiment_id)] if experiment_id is not None else paths.all_experiment_dirs()
    return [d / DB_NAME for d in dirs]
