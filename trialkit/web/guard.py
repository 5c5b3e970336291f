"""Who may use the page's API: the holder of the page's token, from the page's own origin.

The page has a token of its own, derived from the manager's admin token
(`address.page_token`): it opens the page's routes (reads, and the trial actions the
page offers) and nothing else; the admin routes still want the admin token,
which cannot be worked out from the page's. The printed URL carries it once:
the page moves it to the tab's sessionStorage and replaces the address
without it (history.replaceState), so it stays out of the history.

The token travels in an Authorization header, which a cross-site form cannot
send and a cross-site script cannot send without a CORS preflight that this
server never approves; the browser's Sec-Fetch-Site and Origin headers are
checked as well, so a request another site makes is refused before the token
is even looked at. All of it is checked on the headers, before a body is read.
"""
from __future__ import annotations

import hmac

from trialkit.manager.server import HttpError, Request

_OWN_SITE = ("same-origin", "none")  # "none": typed in the address bar or opened from a bookmark
def check(request: Request, token: str) -> None:
    """HttpError 403 for a cross-site request, 401 without the token, 403 with a wrong one."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site not in _OWN_SITE:
        raise HttpError(403, f"cross-site request refused (Sec-Fetch-Site: {site})")
    origin = request.headers.get("Origin")
    host = request.headers.get("Host", "")
    if origin is not None and origin not in (f"http://{host}", f"https://{host}"):
        raise HttpError(403, f"cross-site request refused (Origin: {origin})")
    given = request.bearer()
    if given is None:
        raise HttpError(401, "no token: open the page at the URL trialkit printed (it ends in ?token=...)")
    if not hmac.compare_digest(given.encode(), token.encode()):
        raise HttpError(403, "wrong token: open the page at the URL trialkit printed")
