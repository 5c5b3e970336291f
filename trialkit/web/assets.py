"""The page's files: index.html, app.js and app.css from trialkit/web/static, uPlot and two plotly.js bundles.

The page comes whole in one answer: index.html with app.css and uPlot's
styles in its <style> and app.js in its <script> (allowed by the script's
hash in the page's Content-Security-Policy), so that the first view's data
is asked for as soon as the page is parsed rather than after one more round
of requests (bench/bench_web.py). The curves are drawn by uPlot (50 KB,
vendored in trialkit/web/vendor with its README naming the source and
version), a deferred script of the page: on a cold page plotly's basic
bundle (1.2 MB) was half the time to the curves, its drawing a third more.
A trial's GPU chart uses plotly's basic bundle (scatter, bar, pie; 0.4 MB
gzipped, vendored too), fetched only by a trial view that has GPU samples;
parallel coordinates need the full bundle (4.8 MB), which comes from the
installed plotly package and is fetched only by the view that draws them.

Read once when the page is installed. A vendored file is served under a name
holding its hash, cached by the browser for good; the page is revalidated by
ETag (a 304 when unchanged), so a new trialkit shows at once.
Every file goes out gzipped to a browser that accepts it.
"""
from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.util
import threading
from importlib.resources import files
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

from trialkit.manager.server import HttpError, Raw

UPLOT_PLACEHOLDER = b"{{uplot}}"  # the curves
STYLES_PLACEHOLDER, SCRIPT_PLACEHOLDER = b"{{styles}}", b"{{script}}"  # the page's own, inline
PLOTLY_PLACEHOLDER = b"{{plotly}}"  # the basic bundle: enough for a trial's GPU chart
PLOTLY_FULL_PLACEHOLDER = b"{{plotly-full}}"  # every trace type: parallel coordinates
PLOTLY_MISSING = "/static/plotly-missing.js"  # 404: the page then says how to install plotly
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8"}
_FOREVER = "public, max-age=31536000, immutable"
SMALL = 256 << 10  # bytes: a file this small is gzipped (or unzipped) in a millisecond or two (uPlot: 50 KB)
# The page's scripts are its own: its inline one by its hash (SCRIPT_HASH), the rest its files; plotly needs eval
# (its WebGL code) and inline styles.
CSP = ("default-src 'self'; script-src 'self' 'unsafe-eval' 'sha256-{SCRIPT_HASH}'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data: blob:; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'none'")
PAGE_HEADERS = {
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


def accepts_gzip(request_headers: Mapping[str, str]) -> bool:
    """Whether Accept-Encoding admits gzip (listed, or through `*`, with a q above 0)."""
    for part in (request_headers.get("Accept-Encoding") or "").split(","):
        coding, _, params = part.partition(";")
        if coding.strip().lower() not in ("gzip", "x-gzip", "*"):
            continue
        name, _, value = params.strip().partition("=")
        try:
            return name.strip().lower() != "q" or float(value) > 0
        except ValueError:
            return False
    return False


class _File:
    """One file, plain and gzipped; either form is made from the other when first asked for.

    The full plotly bundle is gzipped on its first request (~0.2 s, once) rather
    than when the page is installed, so that the manager starts at once.
    """

    def __init__(self, content_type: str, cache: str, plain: Optional[bytes] = None,
                 gzipped: Optional[bytes] = None):
        self.content_type = content_type
        self.cache = cache
        self._plain = plain
        self._gzipped = gzipped
        self._lock = threading.Lock()
        self.tag = hashlib.sha256(plain if plain is not None else gzipped).hexdigest()[:20]
        self.size = len(plain if plain is not None else gzipped)  # of the form given

    def _body(self, gzip_it: bool) -> bytes:
        with self._lock:
            if gzip_it and self._gzipped is None:
                self._gzipped = gzip.compress(self._plain, compresslevel=6, mtime=0)
            if not gzip_it and self._plain is None:
                self._plain = gzip.decompress(self._gzipped)
            return self._gzipped if gzip_it else self._plain

    def body(self) -> bytes:
        return self._body(False)

    def answer(self, request_headers: Mapping[str, str], extra: Optional[Dict[str, str]] = None) -> Tuple[int, Raw]:
        gzip_it = accepts_gzip(request_headers)
        # Each form has its own tag: a cache must not answer one with the other.
        etag = f'"{self.tag}-gz"' if gzip_it else f'"{self.tag}"'
        headers = {"ETag": etag, "Cache-Control": self.cache, "Vary": "Accept-Encoding",
                   "X-Content-Type-Options": "nosniff", **(extra or {})}
        if gzip_it:
            headers["Content-Encoding"] = "gzip"
        if request_headers.get("If-None-Match") == etag:
            return 304, Raw(b"", self.content_type, headers)
        return 200, Raw(self._body(gzip_it), self.content_type, headers)


class Assets:
    def __init__(self):
        web = files("trialkit.web")
        self._files: Dict[str, _File] = {}
        vendor = web / "vendor"
        places = {
            UPLOT_PLACEHOLDER: self._vendored("uplot", ".js", _File(_TYPES[".js"], _FOREVER,
                                                                     plain=(vendor / "uplot.min.js").read_bytes())),
            PLOTLY_PLACEHOLDER: self._vendored("plotly-basic", ".js", _File(
                _TYPES[".js"], _FOREVER, gzipped=(vendor / "plotly-basic.min.js.gz").read_bytes())),
        }
        full_path = plotly_path()
        places[PLOTLY_FULL_PLACEHOLDER] = PLOTLY_MISSING if full_path is None else self._vendored(
            "plotly", ".js", _File(_TYPES[".js"], _FOREVER, plain=full_path.read_bytes()))
        for item in (web / "static").iterdir():
            suffix = Path(item.name).suffix
            if suffix in _TYPES:
                body = item.read_bytes()
                for placeholder, url in places.items():
                    body = body.replace(placeholder, url.encode())
                self._files[item.name] = _File(_TYPES[suffix], "no-cache", plain=body)
        script = self._files["app.js"].body()
        if b"</script" in script.lower() or b"<!--" in script:  # would end the inline script early
            raise ValueError("app.js holds '</script' or '<!--': it cannot be put inline")
        page = self._files["index.html"].body().replace(
            STYLES_PLACEHOLDER, self._files["app.css"].body() + b"\n" + (vendor / "uplot.min.css").read_bytes())
        self._files["index.html"] = _File(_TYPES[".html"], "no-cache", plain=page.replace(SCRIPT_PLACEHOLDER, script))
        digest = base64.b64encode(hashlib.sha256(script).digest()).decode()
        self._page_headers = {"Content-Security-Policy": CSP.replace("{SCRIPT_HASH}", digest), **PAGE_HEADERS}

    def _vendored(self, stem: str, suffix: str, content: _File) -> str:
        """Serve a vendored file under a name holding its hash; returns its URL."""
        name = f"{stem}-{content.tag}.min{suffix}"
        self._files[name] = content
        return f"/static/{name}"

    def small(self) -> List[str]:
        """The files but the page whose every form is made in a millisecond or two (all but the plotly bundles)."""
        return [name for name, found in self._files.items() if name != "index.html" and found.size < SMALL]

    def page(self, request_headers: Mapping[str, str]) -> Tuple[int, Raw]:
        return self._files["index.html"].answer(request_headers, self._page_headers)

    def file(self, name: str, request_headers: Mapping[str, str]) -> Tuple[int, Raw]:
        found = self._files.get(name)
        if found is None or name == "index.html":
            hint = " (install plotly: pip install 'trialkit[control]')" if name == Path(PLOTLY_MISSING).name else ""
            raise HttpError(404, f"no file {name!r}{hint}")
        return found.answer(request_headers)
