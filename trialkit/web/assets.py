"""The page's files: index.html, app.js and app.css from trialkit/web/static, plotly.js from the plotly package.

Read once when the page is installed. plotly.min.js (about 5 MB) is served
under a name holding its hash, cached by the browser for good; the page's own
files are revalidated by ETag (a 304 when unchanged), so a new trialkit shows
at once.
"""
from __future__ import annotations

import hashlib
import importlib.util
from importlib.resources import files
from pathlib import Path
from typing import Dict, Mapping, Optional, Tuple

from trialkit.manager.server import HttpError, Raw

PLOTLY_PLACEHOLDER = b"{{plotly}}"
PLOTLY_MISSING = "/static/plotly-missing.js"  # 404: the page then says how to install plotly
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8"}
# The page's scripts are its own files; plotly needs eval (its WebGL code) and inline styles.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self' 'unsafe-eval'; style-src 'self' 'unsafe-inline'; "
                               "img-src 'self' data: blob:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
                               "form-action 'none'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def plotly_path() -> Optional[Path]:
    """plotly.min.js inside the installed plotly package (found without importing it), if there is one."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "package_data" / "plotly.min.js"
    return path if path.is_file() else None


class _File:
    def __init__(self, body: bytes, content_type: str, cache: str):
        self.body = body
        self.content_type = content_type
        self.etag = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'
        self.cache = cache

    def answer(self, request_headers: Mapping[str, str], extra: Optional[Dict[str, str]] = None) -> Tuple[int, Raw]:
        headers = {"ETag": self.etag, "Cache-Control": self.cache, "X-Content-Type-Options": "nosniff", **(extra or {})}
        if request_headers.get("If-None-Match") == self.etag:
            return 304, Raw(b"", self.content_type, headers)
        return 200, Raw(self.body, self.content_type, headers)


class Assets:
    def __init__(self):
        static = files("trialkit.web") / "static"
        self._files: Dict[str, _File] = {}
        plotly = plotly_path()
        plotly_url = PLOTLY_MISSING
        if plotly is not None:
            script = _File(plotly.read_bytes(), _TYPES[".js"], "public, max-age=31536000, immutable")
            name = f"plotly-{script.etag.strip(chr(34))}.min.js"
            self._files[name] = script
            plotly_url = f"/static/{name}"
        for item in static.iterdir():
            suffix = Path(item.name).suffix
            if suffix in _TYPES:
                body = item.read_bytes().replace(PLOTLY_PLACEHOLDER, plotly_url.encode())
                self._files[item.name] = _File(body, _TYPES[suffix], "no-cache")

    def page(self, request_headers: Mapping[str, str]) -> Tuple[int, Raw]:
        return self._files["index.html"].answer(request_headers, PAGE_HEADERS)

    def file(self, name: str, request_headers: Mapping[str, str]) -> Tuple[int, Raw]:
        found = self._files.get(name)
        if found is None or name == "index.html":
            hint = " (install plotly: pip install 'trialkit[control]')" if name == Path(PLOTLY_MISSING).name else ""
            raise HttpError(404, f"no file {name!r}{hint}")
        return found.answer(request_headers)
