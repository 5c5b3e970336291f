"""The page's address: its own token, derived from the manager's admin token, and the URL to print.

Apart from the routes and the guard because a command that only reads (`trialkit experiment show` of a running
experiment) prints the URL and must not load an HTTP server to do it.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Optional

_PAGE_SCOPE = b"trialkit page: read, and the page's trial actions"


def page_token(admin_token: str) -> str:
    """The page's token for a manager whose admin token this is (one-way: it does not give the admin token)."""
    digest = hmac.new(admin_token.encode(), _PAGE_SCOPE, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def page_url(server: object, token: str, experiment_id: Optional[str] = None) -> str:
    """The URL to print: the page, carrying the page's token for this admin token (the page keeps it for
    the tab and drops it from the address bar).

    `server`: the manager's server (its `url`), or the address it is reached at (a manager bound to every address
    advertises one).
    """
    base = server if isinstance(server, str) else getattr(server, "url")
    return f"{base}/?token={page_token(token)}" + (f"#/exp/{experiment_id}" if experiment_id else "")
