"""The page on a running experiment's manager: the hook the faces hand the control plane.

    run_experiment(config, port, page=attach_page)      # trialkit run, Experiment.run

The control plane does not import the page: it calls this hook with its
server, store and manager info, and the experiment loop as the performer of
the page's actions (trialkit.control.actions, the table the admin routes serve
too). The hook adds the page's routes and says where the page is.
"""
from __future__ import annotations

from trialkit.control.actions import Performer
from trialkit.control.admin import ManagerInfo
from trialkit.control.manager_http import AttachedPage
from trialkit.manager.server import ManagerServer
from trialkit.manager.store import Store
from trialkit.web import address
from trialkit.web.routes import install


def attach_page(server: ManagerServer, store: Store, info: ManagerInfo, performer: Performer) -> AttachedPage:
    catalog = install(server, store, admin_token=info.token, read_only=False, performer=performer)
    return AttachedPage(address.page_url(info.url, info.token, info.experiment_id), catalog.close,
                        address.page_token(info.token))
