"""The web page on a big experiment: 1,000 trials with 100 intermediate results each.

    python bench/bench_web.py [--trials 1000] [--steps 100] [--runs 5]

Filled straight into a store, served by a real ManagerServer with the page.
Figures (issue 9's goals):
  page:    headless Chromium opens the trials view with 10 trials selected;
           time from navigation start until the table and the curves of the
           10 are drawn (the page marks that moment, and the table's alone),
           cold (empty browser cache: plotly.js is fetched and compiled) and
           warm (cached). Goal: under 1 s.
  answer:  the manager's answer time for the trials list (one page of 50, in
           sequence order and sorted by metric), over HTTP on loopback, with
           the other answers the view needs for reference. Goal: under 50 ms.
Needs Debian's chromium and chromium-driver (bootstrap.sh installs them).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from trialkit.manager.server import ManagerServer  # noqa: E402
from trialkit.manager.store import Store  # noqa: E402
from trialkit.web import install, page_url  # noqa: E402
from web_util import Browser, fill  # noqa: E402

EXPERIMENT = "bench1"
TOKEN = "bench-token"
GOALS = {"page": 1.0, "answer": 0.050}  # seconds


def answer_times(url: str, runs: int) -> Dict[str, List[float]]:
    session = requests.Session()  # keep-alive, as the page's fetches are
    session.headers["Authorization"] = f"Bearer {TOKEN}"
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


def page_times(driver, url: str, runs: int, clear_cache: bool) -> Dict[str, List[float]]:
    times: Dict[str, List[float]] = {"table": [], "table and curves": []}
    for _ in range(runs):
        driver.get("about:blank")
        if clear_cache:
            driver.execute_cdp_cmd("Network.clearBrowserCache", {})
        driver.get(url)
        deadline = time.monotonic() + 60
        while driver.execute_script("return document.body && document.body.dataset.ready") != "trials":
            if time.monotonic() > deadline:
                raise RuntimeError("the page did not get ready in 60 s: " +
                                   str(driver.execute_script("return document.getElementById('problem').textContent")))
            time.sleep(0.01)
        curves = driver.execute_script("return document.querySelectorAll('#curves .scatterlayer .trace').length")
        rows = driver.execute_script("return document.querySelectorAll('#trials tbody tr').length")
        if curves != 10 or rows != 50:
            raise RuntimeError(f"the page drew {rows} rows and {curves} curves, not 50 and 10")
        marks = driver.execute_script("return [document.body.dataset.tableAt, document.body.dataset.readyAt]")
        times["table"].append(float(marks[0]) / 1000)
        times["table and curves"].append(float(marks[1]) / 1000)
    return times


def show(name: str, samples: List[float], goal: float) -> None:
    median = statistics.median(samples)
    worst = max(samples)
    verdict = "ok" if median < goal else "OVER GOAL"
    print(f"  {name:28s} median {median * 1000:7.1f} ms   max {worst * 1000:7.1f} ms   "
          f"(goal < {goal * 1000:.0f} ms: {verdict})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--runs", type=int, default=5)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trialkit-bench-web-") as tmp:
        store = Store.in_dir(Path(tmp) / EXPERIMENT)
        started = time.perf_counter()
        ids = fill(store, EXPERIMENT, opts.trials, opts.steps, running=opts.trials // 50)
        took = time.perf_counter() - started
        print(f"filled {opts.trials} trials x {opts.steps} intermediate results in {took:.1f} s")
        server = ManagerServer(store).start()
        install(server, store, admin_token=TOKEN, read_only=False)
        try:
            print("manager answer times (HTTP, loopback):")
            for name, samples in answer_times(server.url, opts.runs * 4).items():
                show(name, samples, GOALS["answer"])
            chosen = ",".join(ids[:: max(1, len(ids) // 10)][:10])
            url = page_url(server, TOKEN, EXPERIMENT) + f"/trials?sel={chosen}"
            browser = Browser()
            try:
                print("page interactive (table + curves of 10 selected trials), headless Chromium:")
                for cache, clear, runs in [("cold", True, max(2, opts.runs // 2)), ("warm", False, opts.runs)]:
                    for part, samples in page_times(browser.driver, url, runs, clear).items():
                        show(f"{cache}: {part}", samples, GOALS["page"])
            finally:
                left = browser.close()
                if left:
                    print(f"browser processes left (killed): {left}", file=sys.stderr)
        finally:
            server.stop()
            store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
