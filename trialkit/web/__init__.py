"""The web page: experiments, trials, metric curves, hyperparameters and the job queue.

The manager serves it on its own address; `trialkit ui` serves stored
experiments read-only. A face that runs an experiment hands the control
plane the hook that adds it to the manager (the control plane does not import
the page):

    from trialkit.web import attach_page
    run_experiment(config, port, page=attach_page)

The page's actions are the trial actions of the control plane's action table
(trialkit.control.actions), performed by the experiment loop.

Modules: routes (the HTTP API, listed there), queries (SQL over a store),
catalog (read-only store connections), address (the page's token and the URL
to print), guard (token and cross-site checks), manager_page (attach_page),
events (server-sent events), logtail, assets (static files and plotly.js), ui
(`trialkit ui`); static/ holds the page (vanilla JS).
"""
from importlib import import_module
from typing import Any

# The face, by the module each name lives in. They load when first asked for: a command that only prints the
# page's address (`trialkit experiment show` of a running experiment) must not load the HTTP server with them.
_FACE = {"attach_page": "manager_page", "install": "routes", "page_url": "address", "serve_ui": "ui"}
__all__ = list(_FACE)


def __getattr__(name: str) -> Any:
    if name not in _FACE:
        raise AttributeError(f"module 'trialkit.web' has no attribute {name!r}")
    return getattr(import_module(f"trialkit.web.{_FACE[name]}"), name)
