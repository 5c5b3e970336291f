"""The web page: experiments, trials, metric curves, hyperparameters and the job queue.

The manager serves it on its own address; `trialkit ui` serves stored
experiments read-only. The experiment loop wires it in with

    from trialkit.web import Admin, install, page_url
    install(server, store, admin_token=token, read_only=False,
            admin=Admin(kill=..., pause=..., activate=..., set_priority=..., queue_order=...))
    print(page_url(server, token))

Modules: routes (the HTTP API, listed there), queries (SQL over a store),
catalog (read-only store connections), guard (token and cross-site checks),
actions (Admin), events (server-sent events), logtail, assets (static files
and plotly.js), ui (`trialkit ui`); static/ holds the page (vanilla JS).
"""
from trialkit.web.actions import Admin
from trialkit.web.routes import install, page_url
from trialkit.web.ui import serve_ui

__all__ = ["Admin", "install", "page_url", "serve_ui"]
