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
catalog (read-only store connections), guard (token and cross-site checks),
manager_page (attach_page), events (server-sent events), logtail, assets
(static files and plotly.js), ui (`trialkit ui`); static/ holds the page
(vanilla JS).
"""
from trialkit.web.manager_page import attach_page
from trialkit.web.routes import install, page_url
from trialkit.web.ui import serve_ui

__all__ = ["attach_page", "install", "page_url", "serve_ui"]
