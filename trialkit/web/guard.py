"""Who may use the page's API: the holder of the token printed with its URL, from the page's own origin.

The token travels in an Authorization header, which a cross-site form cannot
send and a cross-site script cannot send without a CORS preflight that this
server never approves; the browser's Sec-Fetch-Site and Origin headers are
checked as well, so a request another site makes is refused before the token
is even looked at.
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
    if origin is not None and origin != f"http://{request.headers.get('Host', '')}":
        raise HttpError(403, f"cross-site request refused (Origin: {origin})")
    given = request.bearer()
    if given is None:
        raise HttpError(401, "no token: open the page at the URL trialkit printed (it ends in ?token=...)")
    if not hmac.compare_digest(given.encode(), token.encode()):
        raise HttpError(403, "wrong token: open the page at the URL trialkit printed")
