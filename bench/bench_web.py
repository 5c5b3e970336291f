"""The web page on a big experiment (1,000 trials x 100 intermediate results), raced against its floor.

    python bench/bench_web.py [--trials 1000] [--steps 100] [--samples 7]

Filled straight into a store, served by a real ManagerServer with the page,
opened in headless Chromium at the trials view with 10 trials selected. Three
loads race in every sample, in an order that rotates from sample to sample so
that load on the shared machine falls on all alike:
  cold:   an empty browser cache (uPlot and the page's script fetched and compiled anew);
  warm:   everything cached;
  floor:  a bare static HTML table of the same trials (every one of them, no
          script, no chart), served from loopback: what a browser needs at least.
Each is timed by the DOM from navigation start: the page marks when its table
is built and when table and curves are drawn (they come in one answer and are
shown together: the two marks are close); the floor marks the end of its
table. Those marks come before the browser's own part (style, layout, paint:
the floor's mark leaves all of its 1,000 rows' out), so each page also marks the
end of the frame after its mark (`painted`: requestAnimationFrame, then a task),
what a user sees, reported beside the goal. The bench waits for those marks
without polling the page (a poll is a task on the page's main thread).
Goal (issue 40): the cold page with table and curves within 3x the static
table, as the ratio of the medians and as the median of each round's ratio
(load on the shared machine drifts within a run). The manager's answers the
view needs are timed too (issue 9: under 50 ms).

History (2026-11-29, 2 CPUs shared with other engineers: say the load with
every figure; at load 10 and more an A/A race of one page against itself
differs by up to 9%, and one run's rounds range 0.3-11x). A lever is raced
old page against new in one harness: both managers on one store, one
Chromium, both pages cold and this floor rotating, 15-25 rounds.
- plotly drew the curves: 1.0-1.05 s, 5.3x. Kept since, each a gain: uPlot
  draws them; the page comes whole in one answer; no Intl format as it loads
  (the first in a fresh renderer was 20-65 ms); the view's table and curves
  come in one answer and are laid out once; the page keeps its width (its
  curves were drawn twice); the curves of chosen trials rank no more trials
  than it takes to say whether the best is among them; the Trials view asks
  for its answer before it builds its frame, builds that frame out of sight
  until the answer is in (laid out and painted empty, it held the answer back
  15-30 ms: 0.86-0.93x) and clones its rows from one (~5.4 -> ~2.8 ms); the
  experiment's ranking is kept until its store changes (the chosen trials'
  leader near the best scanned every trial's final record on each answer: the
  answer 12.7 -> 8.9 ms, the cold page 0.95x, 0.92x round by round, load 9-12).
- Where a cold page's main thread goes (its own CPU time in a Chromium trace,
  which the load does not inflate: ~47 ms to the ready mark): the navigation's
  commit ~5 ms, app.js ~7, two frames before the answer ~8.5 (the header's, and
  the load event's style and layout with uPlot's evaluation), the answer's
  table ~3 and chart ~13 (uPlot's functions compiled as it first calls them,
  its drawing, the style recalculation it forces), JSON and small tasks ~5. The
  renderer uses as much CPU in all per load as the floor's (~170 ms, most of it
  Chromium's own: a new renderer process per navigation); the floor's first
  script runs 30-40 ms after its HTML. By the Performance API at load 8 (medians
  of 9): the HTML is in at 16 ms, the answer asked at 57 and in at 82, and the
  page's script and uPlot's evaluation hold the main thread to 86: the renderer,
  not the manager, is the critical path.
- Tried and dropped, each slower or no gain: asking for the first view's data
  from a script at the top of the head (1.04-1.37x at load 8-14; with the kept
  ranking, three races at load 10-12: 0.88x, 0.97x, 1.07x, round by round
  0.95-1.00x; never measured quiet: the load stayed over 8); uPlot inlined;
  a larger SQLite cache; V8's compile hint (//# allFunctionsCalledOnLoad) on
  uPlot (1.07-1.16x at load 9-15: its compile took cores from app.js before the
  data was asked for) or on app.js (more main-thread CPU); uPlot loaded once the
  first view had asked (1.14x: the curves waited for it); the header hidden with
  the view until the answer (no less CPU); the curves' reports in one query for
  all trials (the time is each record's Python); the experiment ranked on a
  thread when the page's HTML is asked for, so that a running experiment's
  first answer finds it kept (1.26x, 1.32x round by round, load 8-9: it takes a
  core from the renderer as the page parses); the table and curves built out of
  sight and shown after (1.09-1.13x at load 13-14).
- Quiet (load 0.7-1.5), before the kept ranking: cold 71-92 ms against floors of
  26-34 ms, 2.51-2.98x, MET in six runs of eight (two missed round by round, at
  3.04x and 3.09x). Under load the page's time and the floor's both swing: at
  load 9-10, 97-149 ms against 41-55 ms, 1.97-2.70x.
- With it, six runs at load 10-13: cold 207, 217, 201 ms against floors of 62,
  166, 78 ms: 3.37x (2.66x round by round) MISSED, 1.31x (1.85x) MET, 2.57x
  (2.19x) MET; then 131, 123, 127 ms against 38, 50, 43 ms: 3.41x (3.19x)
  MISSED, 2.48x (2.99x) MET, 2.94x (2.97x) MET.
Needs Debian's chromium and chromium-driver (bootstrap.sh installs them).
"""
from __future__ import annotations

import argparse
import html
import importlib.util
import os
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, List
from urllib.parse import parse_qs, urlsplit

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from trialkit.manager.server import ManagerServer  # noqa: E402
from trialkit.manager.store import Store  # noqa: E402
from trialkit.web import install, page_url  # noqa: E402

if importlib.util.find_spec("selenium") is None:  # the browser's driver, which tests/web_util.py drives
    sys.stderr.write(f"{Path(__file__).name}: the page's race needs selenium (and Debian's chromium), which this "
                     "Python lacks: run it with the venv that `./bootstrap.sh test` makes (.venv/bin/python)\n")
    sys.exit(2)
from web_util import Browser, fill  # noqa: E402

EXPERIMENT = "bench1"
TOKEN = "bench-token"
PAGE_GOAL = 3.0  # the cold page with table and curves, against the static table of every trial
ANSWER_GOAL = 0.050  # seconds, each answer the view needs


def verdict(met: bool) -> str:
    return "MET" if met else "MISSED"


def load_now() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def answer_times(url: str, token: str, runs: int) -> Dict[str, List[float]]:
    session = requests.Session()  # keep-alive, as the page's fetches are
    session.headers["Authorization"] = f"Bearer {token}"
    base = f"{url}/api/ui/experiments/{EXPERIMENT}"
    asks = {
        "trials list (sequence)": f"{base}/trials?limit=50",
        "trials list (by metric)": f"{base}/trials?limit=50&sort=metric&order=desc",
        "trials list (filtered)": f"{base}/trials?limit=50&p:optimizer==adam&metric=>0.3&sort=p:lr",
        "curves of 10": f"{base}/curves",
        "overview": base,
    }
    out: Dict[str, List[float]] = {name: [] for name in asks}
    for _ in range(runs):
        for name, ask in asks.items():  # round-robin: load on the shared machine falls on all alike
            started = time.perf_counter()
            answer = session.get(ask, timeout=30)
            out[name].append(time.perf_counter() - started)
            answer.raise_for_status()
    return out


def floor_page(url: str, token: str) -> bytes:
    """Every trial as one static table, from the same answer the page reads; a mark at its end."""
    trials: List[Dict] = []
    while True:  # the answer comes in pages
        answer = requests.get(f"{url}/api/ui/experiments/{EXPERIMENT}/trials",
                              params={"limit": 500, "offset": len(trials)},
                              headers={"Authorization": f"Bearer {token}"}, timeout=30)
        answer.raise_for_status()
        page = answer.json()
        trials += page["rows"]
        if len(trials) >= page["total"]:
            break
    params = page["parameters"]
    cells = lambda row: "".join(f"<td>{html.escape(str(v))}</td>" for v in row)  # noqa: E731
    head = cells(["trial", "#", "status", "metric", *params, "restarts", "duration"]).replace("td>", "th>")
    rows = "\n".join("<tr>" + cells([t["id"], t["sequence"], t["status"], t["metric"],
                                     *[(t["parameters"] or {}).get(p) for p in params], t["restarts"], t["duration"]])
                     + "</tr>" for t in trials)
    return (f"<!doctype html><html><head><meta charset=utf-8><title>floor</title></head><body>"
            f"<table><thead><tr>{head}</tr></thead><tbody>\n{rows}\n</tbody></table>"
            "<script>document.body.dataset.readyAt = String(performance.now());"
            "requestAnimationFrame(() => setTimeout(() => { document.body.dataset.paintedAt = String(performance.now()) }))"
            "</script>"
            "</body></html>").encode()


def serve_floor(body: bytes) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# Waits without polling: a poll is a task on the page's main thread, which the page's own work would wait behind.
WAIT_READY = """
const [ready, done] = [new Function(arguments[0]), arguments[arguments.length - 1]];
if (ready()) { done(true); return; }
new MutationObserver((_, seen) => { if (ready()) { seen.disconnect(); done(true); } })
  .observe(document.documentElement, {attributes: true, subtree: true});
"""


def wait_ready(driver, script: str) -> None:
    from selenium.common.exceptions import TimeoutException

    driver.set_script_timeout(60)
    try:
        driver.execute_async_script(WAIT_READY, script)
    except TimeoutException:
        problem = driver.execute_script("const p = document.getElementById('problem'); return p && p.textContent")
        raise RuntimeError(f"the page did not get ready in 60 s: {problem}") from None


def open_page(driver, url: str, cold: bool) -> Dict[str, float]:
    driver.get("about:blank")
    if cold:
        driver.execute_cdp_cmd("Network.clearBrowserCache", {})
    driver.get(url)
    wait_ready(driver, "return document.body && document.body.dataset.ready === 'trials' && document.body.dataset.paintedAt")
    curves = driver.execute_script("const u = document.getElementById('curves').uplot; return u ? u.series.length - 1 : 0")
    rows = driver.execute_script("return document.querySelectorAll('#trials tbody tr').length")
    if curves != 10 or rows != 50:
        raise RuntimeError(f"the page drew {rows} rows and {curves} curves, not 50 and 10")
    table, ready, painted, sent = driver.execute_script(
        "return [document.body.dataset.tableAt, document.body.dataset.readyAt, document.body.dataset.paintedAt,"
        " performance.getEntries().reduce((n, e) => n + (e.transferSize || 0), 0)]")
    return {"table": float(table) / 1000, "table and curves": float(ready) / 1000, "painted": float(painted) / 1000,
            "bytes": float(sent)}


def open_floor(driver, url: str) -> Dict[str, float]:
    driver.get("about:blank")
    driver.get(url)
    wait_ready(driver, "return document.body && document.body.dataset.paintedAt")
    rows = driver.execute_script("return document.querySelectorAll('tbody tr').length")
    table, painted = driver.execute_script("return [document.body.dataset.readyAt, document.body.dataset.paintedAt]")
    return {"table": float(table) / 1000, "painted": float(painted) / 1000, "rows": rows}


def race(driver, page: str, floor: str, samples: int) -> Dict[str, Dict[str, List[float]]]:
    loads = {"cold": lambda: open_page(driver, page, True), "warm": lambda: open_page(driver, page, False),
             "floor": lambda: open_floor(driver, floor)}
    open_page(driver, page, True)  # the first warm sample must find a filled cache
    names = list(loads)
    found: Dict[str, Dict[str, List[float]]] = {name: {} for name in names}
    for sample in range(samples):
        for name in names[sample % len(names):] + names[:sample % len(names)]:
            for measure, value in loads[name]().items():
                found[name].setdefault(measure, []).append(value)
    return found


def report(found: Dict[str, Dict[str, List[float]]], samples: int) -> bool:
    med = {name: {m: statistics.median(v) for m, v in measures.items()} for name, measures in found.items()}
    print(f"page, headless Chromium, median of {samples} samples each (order rotating), {load_now()}:")
    for name in ("cold", "warm"):
        row = med[name]
        print(f"  {name:6s} table {row['table'] * 1e3:7.1f} ms   table and curves {row['table and curves'] * 1e3:7.1f} ms"
              f"   (max {max(found[name]['table and curves']) * 1e3:7.1f} ms)   {row['bytes'] / 1024:7.0f} KiB sent")
    print(f"  floor  table {med['floor']['table'] * 1e3:7.1f} ms   (a static table of all {int(med['floor']['rows'])} "
          "trials, no script)")
    cold, warm, floor = med["cold"]["table and curves"], med["warm"]["table and curves"], med["floor"]["table"]
    print(f"  cold/warm {cold / warm:5.2f}x   cold/floor {cold / floor:5.2f}x   warm/floor {warm / floor:5.2f}x")
    # Load on the shared machine drifts within a run: each round's cold page against that round's floor too.
    rounds = sorted(page / base for page, base in zip(found["cold"]["table and curves"], found["floor"]["table"]))
    paired = statistics.median(rounds)
    print(f"  cold/floor round by round: median {paired:.2f}x (from {rounds[0]:.2f}x to {rounds[-1]:.2f}x)")
    # The marks above come before the browser's own part (style, layout, paint), which the floor's mark leaves out
    # entirely: the frame after each mark tells what a user sees, for both alike.
    shown = sorted(page / base for page, base in zip(found["cold"]["painted"], found["floor"]["painted"]))
    print(f"  painted (the frame after the mark): cold {med['cold']['painted'] * 1e3:.1f} ms, floor "
          f"{med['floor']['painted'] * 1e3:.1f} ms: {med['cold']['painted'] / med['floor']['painted']:.2f}x, "
          f"round by round {statistics.median(shown):.2f}x")
    met = cold < PAGE_GOAL * floor and paired < PAGE_GOAL
    print(f"  goal: cold page with table and curves within {PAGE_GOAL:.0f}x the static table: {cold / floor:.2f}x "
          f"({cold * 1e3:.0f} against {floor * 1e3:.0f} ms), {paired:.2f}x round by round, {verdict(met)}")
    return met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--samples", type=int, default=7, help="samples of each load (median taken; default 7)")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trialkit-bench-web-") as tmp:
        store = Store.in_dir(Path(tmp) / EXPERIMENT)
        ids = fill(store, EXPERIMENT, opts.trials, opts.steps, running=opts.trials // 50)
        print(f"{opts.trials} trials x {opts.steps} intermediate results; {os.cpu_count()} CPUs; {load_now()}")
        server = ManagerServer(store).start()
        install(server, store, admin_token=TOKEN, read_only=False)
        chosen = ",".join(ids[:: max(1, len(ids) // 10)][:10])
        page = page_url(server, TOKEN, EXPERIMENT) + f"/trials?sel={chosen}"
        token = parse_qs(urlsplit(page).query)["token"][0]  # the page's own token, as the page sends it
        floor = serve_floor(floor_page(server.url, token))
        met = True
        try:
            print(f"manager answers (HTTP, loopback), median of {opts.samples * 4}, {load_now()}:")
            for name, samples in answer_times(server.url, token, opts.samples * 4).items():
                median = statistics.median(samples)
                met &= median < ANSWER_GOAL
                print(f"  {name:26s} {median * 1e3:6.1f} ms   (goal < {ANSWER_GOAL * 1e3:.0f} ms: "
                      f"{verdict(median < ANSWER_GOAL)})")
            browser = Browser()
            try:
                found = race(browser.driver, page, f"http://127.0.0.1:{floor.server_port}/", opts.samples)
                met &= report(found, opts.samples)
            finally:
                left = browser.close()
                if left:
                    print(f"browser processes left (killed): {left}", file=sys.stderr)
        finally:
            floor.shutdown()
            floor.server_close()
            server.stop()
            store.close()
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
