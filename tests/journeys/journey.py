"""The steps a user takes, shared by the journeys: a journey is a page of these.

A `User` has a home (TRIALKIT_HOME) and a folder of their own files; each
step is what that person does through a public face: the `trialkit` command
(`run` and `resume` watched line by line as a terminal shows them, Ctrl-C
as a terminal sends it: SIGINT to the run's process group), the files they
write and read, and the page in headless Chromium read by its DOM. Nothing
here reads a store or an internal table.

A journey's actions run once, in a module-scoped fixture (`User.acting()`
gives them a process tag of their own, as a long-lived service has in
conftest); its steps are the module's test functions, each asserting one
thing the user expects to see.
"""
from __future__ import annotations

import csv
import io
import json
import os
import re
import signal
import subprocess
import threading
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest
import requests

from conftest import PYTHON, TAG, tagged_processes
from experiment_util import cli
from harness import wait_until

WAIT = 120.0  # an upper bound for a loaded machine; never waited for on success
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CONSOLE = str(Path(PYTHON).parent / "trialkit")  # the console script the README puts on PATH


class Day:
    """What the user did, and what their terminal showed at each point (a journey's fixture fills it)."""


class DayBroken(Exception):
    """The journey's actions could not go on: its steps cannot be judged."""


class User:
    """One person: their TRIALKIT_HOME, and the project folder where they write their config and code
    (`folder`, beside the home: trialkit copies a code dir for each trial and refuses one that holds the
    home); `notes` is a folder of theirs outside the code. `console`: they type `trialkit` (the console script the
    README puts on PATH) in `folder`, else `python -m trialkit.cli` (in `folder` for a terminal of its own)."""

    def __init__(self, base: Path, console: bool = False):
        self.console = console
        self.folder = base / "project"
        self.folder.mkdir()
        self.notes = base / "notes"
        self.notes.mkdir()
        self.home = base / "trialkit-home"
        self.tag = f"journey-{base.name}-{uuid.uuid4().hex}"  # unique: two sessions on one machine share base names

    def env(self) -> Dict[str, str]:
        """The environment of the user's shell, now (the running test's process tag included)."""
        return dict(os.environ, TRIALKIT_HOME=str(self.home))

    def write(self, name: str, text: str) -> Path:
        path = self.folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    @contextmanager
    def acting(self) -> Iterator["User"]:
        """The journey's actions, under the day's own process tag: they outlive one test function.
        A day that cannot be lived to its end breaks every step (DayBroken), never passes for one of the
        failures a step expects (those are AssertionErrors)."""
        old = os.environ.get(TAG)
        os.environ[TAG] = self.tag
        try:
            yield self
        except AssertionError as err:
            raise DayBroken(f"the day stopped short: {err}") from err
        finally:
            if old is None:
                del os.environ[TAG]
            else:
                os.environ[TAG] = old

    def left_running(self) -> List[str]:
        """What the day started that still runs (after a short grace for exits in flight)."""
        try:
            wait_until(lambda: not tagged_processes(self.tag), 10, "the day's processes to end")
        except AssertionError:
            pass
        return [" ".join(proc.cmdline())[:120] for proc in tagged_processes(self.tag)]

    def stop_leftovers(self) -> None:
        for proc in tagged_processes(self.tag):
            try:
                proc.kill()
            except Exception:  # noqa: BLE001 - gone meanwhile
                pass

    # -- the terminal ------------------------------------------------------------------------------
    def trialkit(self, *args: Any, timeout: float = WAIT) -> subprocess.CompletedProcess:
        """`trialkit ARGS...` typed in the user's shell, to completion."""
        if not self.console:
            return cli(*args, timeout=timeout, env=self.env())
        return subprocess.run([CONSOLE, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                              env=self.env(), cwd=self.folder)

    def start(self, *args: Any) -> "Terminal":
        """`trialkit ARGS...` in a terminal of its own (its own process group, as a shell's foreground job)."""
        argv = [CONSOLE] if self.console else [PYTHON, "-m", "trialkit.cli"]
        return Terminal([*argv, *map(str, args)], self.env(), self.folder)

    def resume(self, experiment: str) -> "Terminal":
        """`trialkit experiment resume ID` in a terminal, to its end (its exit code in `.code`)."""
        resumed = self.start("experiment", "resume", experiment)
        resumed.finish()
        return resumed

    def trial_list(self, experiment: str) -> Dict[str, Dict[str, str]]:
        """`trialkit trial list`: its table, a row per trial id, each cell as printed."""
        done = self.trialkit("trial", "list", experiment)
        assert done.returncode == 0, done.stderr
        return {row["trial"]: row for row in table(done.stdout)}

    def export(self, experiment: str, *options: str) -> List[Dict[str, Any]]:
        """`trialkit experiment export` as JSON (the default)."""
        done = self.trialkit("experiment", "export", experiment, *options)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def export_csv(self, experiment: str) -> List[Dict[str, str]]:
        done = self.trialkit("experiment", "export", experiment, "--format", "csv")
        assert done.returncode == 0, done.stderr
        return list(csv.DictReader(io.StringIO(done.stdout)))

    def logs(self, trial: str, *options: str, started: bool = True) -> str:
        """`trialkit trial logs`; "" for a trial that may never have started (`started=False`): it has none."""
        done = self.trialkit("trial", "logs", trial, *options)
        if not started and done.returncode == 2 and "no log of trial" in done.stderr:
            return ""
        assert done.returncode == 0, done.stderr
        return done.stdout

    def plot(self, experiment: str, name: str, *options: str) -> bytes:
        """`trialkit experiment plot ... -o NAME`: the picture it wrote in the user's folder."""
        done = self.trialkit("experiment", "plot", experiment, "-o", self.folder / name, *options)
        assert done.returncode == 0, done.stderr
        picture = (self.folder / name).read_bytes()
        assert picture[:8] == PNG_SIGNATURE and len(picture) > 1000, f"{name} is no picture"
        return picture

    @contextmanager
    def viewing(self, page: "Page", experiment: str, where: str = "", ready: str = "overview") -> Iterator["Page"]:
        """`trialkit ui EXPERIMENT`, its printed address opened in the browser, then the view `where`
        (`trials`, `trial/ID`; "" the overview) until it is shown; Ctrl-C to the server when done."""
        with self.serving("ui", experiment) as url:
            page.open(url, "overview")
            if where:
                page.view(f"#/exp/{experiment}/{where}", ready)
            yield page

    @contextmanager
    def serving(self, *args: str) -> Iterator[str]:
        """A command that serves the page (`ui ...`), in a terminal: the URL it prints; Ctrl-C at the end."""
        server = self.start(*args)
        try:
            yield re.search(r"https?://\S+", server.wait_for(r"https?://\S+")).group(0)
        finally:
            server.interrupt()
            server.finish()

    @contextmanager
    def page_after(self, run: "Terminal") -> Iterator[Optional[str]]:
        """The page once a run ended, as its terminal tells the user to reach it: the address it printed
        if that still opens, else the address of the `trialkit ui ...` its last lines name; None if neither."""
        printed = printed_page(run)
        if answers(printed):
            yield printed
            return
        named = command_named_at_the_end(run)
        if named is None:
            yield None
            return
        with self.serving(*named) as url:
            yield url if answers(url) else None


class Terminal:
    """A command whose output the user watches as it comes (stdout and stderr, one stream of lines)."""

    def __init__(self, argv: List[str], env: Dict[str, str], cwd: Path):
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                     cwd=cwd, start_new_session=True)
        self.lines: List[str] = []
        self.code: Optional[int] = None  # its exit code, once finished
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, count: int = 1, timeout: float = WAIT) -> str:
        """The `count`-th line matching `pattern`, once the terminal shows it."""
        def found() -> List[str]:
            return [line for line in list(self.lines) if re.search(pattern, line)]
        wait_until(lambda: len(found()) >= count or self.proc.poll() is not None and not self._reader.is_alive(),
                   timeout, f"{count} line(s) like {pattern!r}")
        lines = found()
        assert len(lines) >= count, f"the command ended without {pattern!r}:\n{self.text}"
        return lines[count - 1]

    def interrupt(self) -> None:
        """Ctrl-C: SIGINT to the terminal's foreground process group."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)

    def ctrl_c(self) -> int:
        """Ctrl-C, and the command's exit code once it ended."""
        self.interrupt()
        return self.finish()

    def finish(self, timeout: float = WAIT) -> int:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            self._reader.join(10)
        self.code = self.proc.returncode
        return self.code


# -- what the user reads ---------------------------------------------------------------------------
def table(text: str) -> List[Dict[str, str]]:
    """The rows of a table the CLI prints (a header line, a line of dashes, rows), cut where the dashes are."""
    lines = text.splitlines()
    rule = next(i for i, line in enumerate(lines) if line.startswith("-") and set(line) <= {"-", " "})
    spans = [match.span() for match in re.finditer(r"-+", lines[rule])]
    spans[-1] = (spans[-1][0], None)

    def cells(line: str) -> List[str]:
        return [line[start:end].strip() for start, end in spans]
    names = cells(lines[rule - 1])
    rows = []
    for line in lines[rule + 1:]:
        if not line.strip():
            break
        rows.append(dict(zip(names, cells(line))))
    return rows


def experiment_id(terminal: Terminal) -> str:
    """The id `trialkit run` starts with ("started experiment ID")."""
    return terminal.wait_for(r"^started experiment ").split()[-1]


def printed_page(terminal: Terminal) -> str:
    """The page address a run printed last (a resume prints its own)."""
    return [line.split()[-1] for line in terminal.lines
            if line.startswith("page: ") and line.split()[-1].startswith("http")][-1]


def answers(url: str) -> bool:
    """Whether an address the terminal printed still opens (HTTP 200)."""
    try:
        return requests.get(url, timeout=10).status_code == 200
    except requests.ConnectionError:
        return False


def command_named_at_the_end(terminal: Terminal) -> Optional[List[str]]:
    """The `trialkit ui ...` command the last lines of a run name to open its page, as arguments."""
    for line in reversed(terminal.lines[-15:]):
        found = re.search(r"trialkit (ui\b[^`'\")\n]*)", line)
        if found:
            return found.group(1).split()
    return None


def max_at_once(intervals: List[tuple]) -> int:
    """The most (start, end) intervals open at one time."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = now = 0
    for _, change in edges:
        now += change
        most = max(most, now)
    return most


# -- the page, in headless Chromium ----------------------------------------------------------------
def needs_chromium() -> Any:
    from web_util import CHROMEDRIVER, CHROMIUM
    return pytest.mark.skipif(not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
                              reason="needs Debian's chromium and chromium-driver (bootstrap.sh installs them)")


# What a chart draws: each series' name and the points it plots (uPlot keeps its instance on the chart's
# node; a null is a gap). The one place that knows the charting library.
DRAWN = """
const node = document.getElementById(arguments[0]);
const u = node && node.uplot;
if (!u) return null;
const xs = u.data[0] || [];
return u.series.slice(1).map((s, i) => {
  const ys = u.data[i + 1] || [];
  const points = [];
  for (let j = 0; j < ys.length; j++) {
    if (ys[j] !== null && ys[j] !== undefined && Number.isFinite(+ys[j])) points.push([xs[j], +ys[j]]);
  }
  return {name: String(s.label || ''), points: points};
});
"""

# A control that chooses what a chart shows, found by its words (a select's option, a button, a label,
# a tab), outside the tables; chosen as a user would (picked, or clicked).
CHOOSE = """
const key = arguments[0];
const main = document.getElementById('main');
const outside = (e) => !e.closest('table');
for (const select of main.querySelectorAll('select')) {
  if (!outside(select)) continue;
  const option = [...select.options].find((o) => o.textContent.trim() === key || o.value === key);
  if (option) {
    select.value = option.value;
    select.dispatchEvent(new Event('change', {bubbles: true}));
    return 'picked';
  }
}
const words = [...main.querySelectorAll('button, label, a, [role=tab], [role=option], [role=radio]')]
  .filter(outside).find((e) => e.textContent.trim() === key);
if (words) { words.click(); return 'clicked'; }
return null;
"""


class Page:
    """The page as the user sees it in a browser tab."""

    def __init__(self, driver: Any):
        self.driver = driver
        self.base = ""

    def open(self, url: str, ready: str) -> None:
        """Open an address a terminal printed; wait until its view is shown."""
        self.base = re.match(r"https?://[^/]+", url).group(0)
        self.driver.get(url)
        self.wait_ready(ready)

    def view(self, where: str, ready: str) -> None:
        """Go to a view of the page opened last (`#/exp/ID/trials`, ...)."""
        self.driver.get(f"{self.base}/{where}")
        self.driver.refresh()  # a change of the hash alone would not load the view anew
        self.wait_ready(ready)

    def wait_ready(self, ready: str) -> None:
        self.wait(f"return document.body.dataset.ready === {json.dumps(ready)}", f"the {ready} view")

    def wait(self, script: str, what: str, timeout: float = 60) -> Any:
        answer: List[Any] = []

        def check() -> bool:
            answer[:] = [self.driver.execute_script(script)]
            return bool(answer[0])
        try:
            wait_until(check, timeout, what, every=0.1)
        except AssertionError:
            raise AssertionError(f"timed out waiting for {what}; the page says: {self.text()[:2000]!r}") from None
        return answer[0]

    def text(self) -> str:
        """What the view says, as the user reads it."""
        return self.driver.execute_script("return document.getElementById('main').innerText") or ""

    def drawn(self, chart: str) -> List[Dict[str, Any]]:
        """The series a chart draws (see DRAWN); [] while it draws none."""
        return self.driver.execute_script(DRAWN, chart) or []

    def choose(self, key: str) -> bool:
        """Choose `key` where the view offers it (a metric key, say); whether the view offers it."""
        return self.driver.execute_script(CHOOSE, key) is not None

    def wait_drawn(self, chart: str, good: Callable[[List[Dict[str, Any]]], bool], what: str,
                   timeout: float = 20) -> List[Dict[str, Any]]:
        """The chart's series once `good` holds of them; what it drew last if it never does."""
        seen: List[Any] = []

        def check() -> bool:
            seen[:] = [self.drawn(chart)]
            return good(seen[0])
        try:
            wait_until(check, timeout, what, every=0.2)
        except AssertionError:
            pass
        return seen[0]


@pytest.fixture(scope="module")
def page():
    """One headless Chromium for a journey's page steps (web_util's, under its own process tag)."""
    from web_util import Browser

    started = Browser()
    yield Page(started.driver)
    left = started.close()
    assert not left, f"browser processes left running: {left}"
