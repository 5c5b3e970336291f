"""The user guide cannot rot: it builds, its links resolve, and its examples run.

Each fenced block in docs/ (but the pages other owners keep: OWNED_ELSEWHERE)
carries an HTML comment on the line before it saying how it is tested:

    <!-- test: run -->              bash: run in the page's workspace; `exit=N` expects status N,
                                    `cwd=repo` runs at the top of the checkout (read-only use)
    <!-- test: output -->           text: each line appears, in order, in the last run's output
                                    ("…" matches anything); `exact`: the output is these lines, no others
    <!-- test: file=PATH -->        any: written to PATH in the workspace (add `config` to validate it)
    <!-- test: config -->           yaml: trialkit.control.config.parse_config accepts it; a cluster
                                    platform's config is also rendered as `trialkit render` does;
                                    `fragment`: a trainingService section, checked inside a minimal config;
                                    `name=N` / `same-as=N`: two configs that must load equal (v1 beside v2)
    <!-- test: python -->           python: run with this interpreter in the workspace (`exit=N`)
    <!-- test: parse -->            bash: each command is parsed by the tool's own parser, not run
                                    (for what needs a cluster); configs it names are loaded
    <!-- test: skip REASON -->      not tested, and REASON says why

Run blocks of a page share one workspace (a temp dir with its own
TRIALKIT_HOME) and run in order; a shell variable a block assigns at the start
of a line is there for the next blocks. Commands inside backticks in prose and
tables (`trialkit ...`, `adaptdl-ray ...`, `python -m trialkit...`) are parsed
too. Every example stays small: trivial trials, a few of them.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
sys.path.insert(0, str(ROOT / "tools"))

import gen_docs  # noqa: E402
import gen_config_reference  # noqa: E402

OWNED_ELSEWHERE = {"ARCHITECTURE.md", "launchers.md"}  # kept by other owners: built and link-checked only
BIN = Path(sys.executable).parent
RUN_TIMEOUT = 90.0
MARKER = re.compile(r"^<!-- test: (.*?) -->\s*$")
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)(.*)$")
INCLUDE = re.compile(r"^<!-- include: (\S+) -->\s*$")
UNMARKED_OK = {"text", ""}  # sample output and diagrams may stand without a test


# ---------------------------------------------------------------- reading pages


@dataclass
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    body: str
    marker: Optional[str]  # the text after "test:", None when unmarked
    source: Optional[Path] = None  # the checkout's file the block holds (`<!-- include: PATH -->` above it)

    @property
    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"

    def options(self) -> Tuple[List[str], Dict[str, str]]:
        words = shlex.split(self.marker or "")
        flags = [w for w in words if "=" not in w]
        values = dict(w.split("=", 1) for w in words if "=" in w)
        return flags, values


def pages() -> List[str]:
    return sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))


def own_pages() -> List[str]:
    return [p for p in pages() if p not in OWNED_ELSEWHERE]


def blocks(page: str) -> List[Block]:
    lines = (DOCS / page).read_text(encoding="utf-8").splitlines()
    out: List[Block] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, lang = match.group(2), match.group(3)
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        marker = source = None
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        if k >= 0 and INCLUDE.match(lines[k].strip()):
            source = ROOT / INCLUDE.match(lines[k].strip()).group(1)
            k -= 1
        if k >= 0 and MARKER.match(lines[k].strip()):
            marker = MARKER.match(lines[k].strip()).group(1)
        indent = len(match.group(1))
        body = "\n".join(line[indent:] for line in lines[i + 1 : j])
        out.append(Block(page, i + 1, lang, body, marker, source))
        i = j + 1
    return out


def prose(page: str) -> str:
    """The page's Markdown without its fenced blocks."""
    text = (DOCS / page).read_text(encoding="utf-8")
    return re.sub(r"^(```+|~~~+).*?^\1\s*$", "", text, flags=re.MULTILINE | re.DOTALL)


# ---------------------------------------------------------------- the build


def test_strict_build(tmp_path):
    """mkdocs build --strict: a broken link, anchor, nav entry or docstring reference fails it."""
    result = subprocess.run([str(BIN / "mkdocs"), "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "reference" / "config" / "index.html").exists()
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert "report_intermediate_result" in api and "should_preempt" in api


def test_every_page_is_in_the_nav():
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text().replace("!!python", "#"))["nav"]
    listed = set()

    def walk(entry):
        if isinstance(entry, str):
            listed.add(entry)
        elif isinstance(entry, dict):
            for value in entry.values():
                walk(value)
        elif isinstance(entry, list):
            for value in entry:
                walk(value)

    walk(nav)
    assert set(pages()) == listed


# ---------------------------------------------------------------- links


def _slugs(page: str) -> set:
    from markdown.extensions.toc import slugify

    seen: Dict[str, int] = {}
    out = set()
    for line in prose(page).splitlines():
        match = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        text = re.sub(r"`([^`]*)`", r"\1", match.group(2))
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
        slug = slugify(text, "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}_{count}")
    return out


@pytest.mark.parametrize("page", pages())
def test_internal_links_resolve(page):
    """Relative .md links point at pages that exist, and their anchors at headings there."""
    bad = []
    for text, target in re.findall(r"\[([^\]]*)\]\(([^)\s]+)\)", prose(page)):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if path and not path.endswith(".md"):
            bad.append(f"{target}: link to a page (.md), not a file outside the guide")
        elif not (DOCS / dest).is_file():
            bad.append(f"{target}: no page {dest}")
        elif anchor and anchor not in _slugs(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest}")
    assert not bad, f"docs/{page}: " + "; ".join(bad)


# ---------------------------------------------------------------- generated reference


def test_config_reference_describes_every_key():
    """Each key the parsers read has a description, and no description outlives its key."""
    assert gen_config_reference.missing_descriptions() == [], (
        "add a line for these keys to DESCRIPTIONS in tools/gen_config_reference.py")
    assert gen_config_reference.stale_descriptions() == [], (
        "these keys are gone from the parsers: remove them from DESCRIPTIONS in tools/gen_config_reference.py")


def test_config_reference_lists_the_schema():
    from trialkit.control import config
    from trialkit.platforms.kubernetes import kubeflow
    from trialkit.platforms import local, ray

    text = (DOCS / "reference" / "config.md").read_text()
    for key in config.V2_KEYS + tuple(local._OPTIONS) + tuple(ray._OPTIONS) + kubeflow.ROLES:
        assert f"`{key}`" in text, key
    everything = "".join((DOCS / page).read_text() for page in pages())
    for name in list(gen_config_reference.GENERATED) + list(gen_docs.OWN):
        assert f"<!-- generated: {name} -->" in everything, f"no page shows the generated {name!r}"
    # The v1 mapping is what convert_v1 does: every v1 key lands on a key the v2 parser reads.
    v2_paths = set()
    for table in gen_config_reference.k8s_tables():
        for key in table.keys:
            head, _, _ = key.path.rpartition(".")
            v2_paths |= {f"trainingService.{head + '.' if head else ''}{name}" for name in (key.path.rpartition(".")[2],
                                                                                           *key.aliases)}
    v2_paths |= {f"trainingService.{k}" for k in local._OPTIONS}
    for platform in gen_config_reference.V1_PLATFORMS:
        for v1_key, v2_keys in gen_config_reference.v1_mapping(platform):
            for v2 in v2_keys:
                head = v2.split(".")[0]
                assert head in config.V2_KEYS, (platform, v1_key, v2)
                if head == "trainingService":
                    normal = re.sub(r"trainingService\.(master|worker|ps)\.", "trainingService.<role>.", v2)
                    assert normal in v2_paths, (platform, v1_key, v2)


def test_concepts_name_every_variable_and_status():
    """Every TRIALKIT_* name in trialkit/env.py and every trial status is on the concepts page."""
    from trialkit import env, statuses

    text = (DOCS / "concepts.md").read_text()
    names = {v for v in vars(env).values() if isinstance(v, str) and v.startswith("TRIALKIT_")}
    names |= set(env.NNI.values()) | set(env.ADAPTDL.values()) | {env.ADAPTDL_OLD_TENSORBOARD}
    assert not sorted(n for n in names if f"`{n}`" not in text), "describe these in docs/concepts.md"
    statuses = {v for k, v in vars(statuses).items() if k.isupper() and isinstance(v, str)}
    assert not sorted(s for s in statuses if f"`{s}`" not in text)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_the_checkpointing_recipe_saves_on_a_stop_and_on_ctrl_c_of_its_keeper(tmp_path, signum):
    """concepts.md's train.py, under a keeper: SIGTERM, or the SIGINT a Ctrl-C of the keeper forwards (with a
    SIGTERM handler alone it died of KeyboardInterrupt, exit 130, no checkpoint: newcomer19), saves and is
    PREEMPTED."""
    (script,) = [b.body for b in blocks("concepts.md") if b.marker == "file=train.py" and "should_preempt" in b.body]
    (tmp_path / "train.py").write_text(script)
    keeper = subprocess.Popen([sys.executable, "-m", "trialkit.keeper", "--grace", "10", "--trial-dir", "run1", "--",
                               sys.executable, "train.py"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
    log = tmp_path / "run1" / "stdout.log"
    try:
        deadline = time.monotonic() + 60
        while "starting at step" not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
            time.sleep(0.05)
        keeper.send_signal(signum)
        assert keeper.wait(timeout=60) == 143
    finally:
        if keeper.poll() is None:
            keeper.kill()
            keeper.wait()
    assert "checkpointed at step" in log.read_text()
    assert json.loads((tmp_path / "run1" / ".trialkit" / "status.json").read_text())["status"] == "PREEMPTED"


def test_the_readme_tells_a_distributed_user_how_to_get_the_engines_the_demo_lacks():
    """Where the README names the launchers: the demo's venv lacks deepspeed and horovod, and the install that
    the launchers' own line says (newcomer19: nothing pointed from there to `./bootstrap.sh test` or a pip line)."""
    from trialkit.launch import deepspeed

    (row,) = [line for line in (ROOT / "README.md").read_text().splitlines()
              if line.startswith("| `python -m trialkit.launch.")]
    assert "./bootstrap.sh test" in row and deepspeed.NEEDS[1] in row and "tools/build_horovod.sh" in row, row


def test_sdk_page_names_every_public_function():
    import trialkit

    text = (DOCS / "sdk.md").read_text()
    assert not [name for name in trialkit.__all__ if f"trialkit.{name}" not in text]


@pytest.mark.parametrize("page", pages())
def test_generated_parts_of_the_page_are_current(page):
    """Generated tables, included files and constants are checked in, so the page reads as the site does."""
    text = (DOCS / page).read_text(encoding="utf-8")
    assert "--8<--" not in text and "{{ const" not in text, "write <!-- include: PATH --> or <!-- const NAME -->"
    assert gen_docs.refresh(text) == text, f"docs/{page} is stale: run python tools/gen_docs.py"


# ---------------------------------------------------------------- markers


@pytest.mark.parametrize("page", own_pages())
def test_every_block_says_how_it_is_tested(page):
    known = {"run", "output", "exact", "config", "python", "parse", "skip", "fragment"}
    bad = []
    for block in blocks(page):
        if block.marker is None:
            if block.lang not in UNMARKED_OK:
                bad.append(f"{block.where}: a {block.lang} block with no <!-- test: ... --> line before it")
            continue
        flags, values = block.options()
        if not flags and "file" not in values:
            bad.append(f"{block.where}: empty marker")
        if flags and flags[0] == "skip":
            if len(flags) < 2:
                bad.append(f"{block.where}: skip needs a reason")
            continue
        for flag in flags:
            if flag not in known:
                bad.append(f"{block.where}: unknown marker word {flag!r}")
    assert not bad, "\n".join(bad)


# ---------------------------------------------------------------- the examples


class Workspace:
    """One page's examples: a temp dir, its own TRIALKIT_HOME, shell variables kept between blocks."""

    def __init__(self, root: Path):
        self.dir = root / "work"
        self.dir.mkdir()
        self.state = root / "state.sh"
        self.state.write_text("")
        self.env = dict(os.environ)
        self.env.update({
            "TRIALKIT_HOME": str(root / "home"),
            "PATH": f"{BIN}{os.pathsep}{self.env.get('PATH', '')}",
            "PYTHONUNBUFFERED": "1",
            "COLUMNS": "120",
        })
        for name in ("TRIALKIT_TRIAL_DIR", "TRIALKIT_MANAGER_URL", "TRIALKIT_TOKEN", "TRIALKIT_PARAMETERS",
                     "NNI_PLATFORM", "NNI_SYS_DIR", "RANK"):
            self.env.pop(name, None)
        self.configs: Dict[str, object] = {}
        self.last_output = ""

    def run_bash(self, block: Block, cwd: Path, expect: int, timeout: float) -> None:
        names = re.findall(r"^([A-Za-z_][A-Za-z0-9_]*)=", block.body, flags=re.MULTILINE)
        # `VAR=value command` sets nothing in the shell: then there is nothing to declare.
        save = "".join(f"\ndeclare -p {name} >> {shlex.quote(str(self.state))} 2>/dev/null || true"
                       for name in names)
        script = f"source {shlex.quote(str(self.state))}\nset -euo pipefail\n{block.body}\n{save}\n"
        self._run(["bash", "-c", script], cwd, expect, timeout, block)

    def run_python(self, block: Block, expect: int, timeout: float) -> None:
        path = self.dir / f"_block_{block.line}.py"
        path.write_text(block.body)
        self._run([sys.executable, str(path)], self.dir, expect, timeout, block)

    def _run(self, argv: List[str], cwd: Path, expect: int, timeout: float, block: Block) -> None:
        try:
            # One pipe for both, as a terminal shows them: interleaved in the order written.
            result = subprocess.run(argv, cwd=cwd, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired as err:
            pytest.fail(f"{block.where}: still running after {timeout:g} s\n"
                        f"{(err.stdout or b'').decode(errors='replace')[-3000:]}")
        self.last_output = result.stdout.decode(errors="replace")
        assert result.returncode == expect, (
            f"{block.where}: exit status {result.returncode}, expected {expect}\n{self.last_output[-4000:]}")


def _output_matches(expected: str, output: str) -> Optional[str]:
    """None when every line of `expected` is found in `output`, in order; else the first line missing."""
    at = 0
    for line in expected.splitlines():
        if not line.strip():
            continue
        # "…" is anything; a run of spaces is any run of spaces (table columns widen with their contents).
        parts = [r"\s+".join(re.escape(word) for word in re.split(r"\s+", part))
                 for part in re.split(r"…|\.\.\.", line.strip())]
        match = re.compile(r".*?".join(parts)).search(output, at)
        if match is None:
            return line
        at = match.end()
    return None


def check_config(block: Block, ws: Workspace, values: Dict[str, str], flags: List[str]) -> None:
    from trialkit.control.config import load_config, parse_config

    path = block.source
    if path is not None:
        config = load_config(path)
    else:
        data = yaml.safe_load(block.body)
        if "fragment" in flags:
            data = {"searchSpace": {"x": {"_type": "choice", "_value": [1, 2]}}, "trialCommand": "python3 train.py",
                    "tuner": {"name": "Random"}, **data}
        if "file" in values:
            path = ws.dir / values["file"]
            config = load_config(path)
        else:
            config = parse_config(data, ws.dir, source=block.where)
    from trialkit import platforms

    if hasattr(platforms.load(config.platform), "render"):
        render_config(config)
    if "name" in values:
        ws.configs[values["name"]] = config
    if "same-as" in values:
        assert config == ws.configs[values["same-as"]], f"{block.where}: loads differently from {values['same-as']}"


def render_config(config) -> List[dict]:
    """What `trialkit render` prints for the first trial, without a cluster."""
    from trialkit.cli import RENDER_EXPERIMENT_ID, REDACTED
    from trialkit.control.specs import build_spec
    from trialkit.control.tuners import build_tuner
    from trialkit.platforms.kubernetes.render import render_trial

    tuner = build_tuner(config.tuner.name, config.tuner.class_args, config.search_space, seed=0)
    parameter_id, parameters = tuner.ask()
    spec = build_spec(config, RENDER_EXPERIMENT_ID, 0, parameter_id, parameters, "http://127.0.0.1:8080", REDACTED)
    objects = render_trial(config.training_service, spec)
    assert objects and all(obj.get("kind") for obj in objects)
    return objects


# Command parsers, by how a command line starts: each takes the arguments after that.
def _trialkit(args: List[str], cwd: Path) -> None:
    from trialkit.cli import build_parser

    opts = build_parser().parse_args(args)
    if args[:1] in (["run"], ["render"]) and (cwd / opts.config).is_file():
        from trialkit.control.config import load_config

        load_config(cwd / opts.config)


def _keeper(args: List[str], cwd: Path) -> None:
    from trialkit.keeper.main import parse_args

    parse_args(args)


def _adaptdl_ray(args: List[str], cwd: Path) -> None:
    from trialkit.ray.adaptdl_ray import parse_args

    parse_args(args)


def _launcher(name: str):
    def parse(args: List[str], cwd: Path) -> None:
        from trialkit.launch import grammar, wrap_rank

        if name == "wrap_rank":
            wrap_rank.parse_args(args)
            return
        assert (ROOT / "trialkit" / "launch" / f"{name}.py").is_file(), f"no launcher {name}"
        grammar.parse(args, name)
    return parse


def _ray_horovod(args: List[str], cwd: Path) -> None:
    from trialkit.launch import grammar
    from trialkit.ray import horovod

    horovod.parse_options(grammar.parse(args, horovod.ENGINE).overrides, {})


def _bootstrap(args: List[str], cwd: Path) -> None:
    assert args and f"\n  {args[0]})" in (ROOT / "bootstrap.sh").read_text(), f"bootstrap.sh has no {args[0]!r}"


def command_parser(words: List[str]):
    """(parser, the arguments it takes) for a trialkit command line; None for another tool's."""
    if not words:
        return None
    head = words[0]
    if head == "trialkit":
        return _trialkit, words[1:]
    if head == "trialkit-keeper":
        return _keeper, words[1:]
    if head == "adaptdl-ray":
        return _adaptdl_ray, words[1:]
    if head == "./bootstrap.sh":
        return _bootstrap, words[1:]
    if re.fullmatch(r"python3?", head) and words[1:2] == ["-m"] and len(words) > 2:
        module = words[2]
        if module in ("trialkit.keeper", "trialkit.keeper.main"):
            return _keeper, words[3:]
        if module == "trialkit.ray.adaptdl_ray":
            return _adaptdl_ray, words[3:]
        if module == "trialkit.ray.horovod":
            return _ray_horovod, words[3:]
        if module.startswith("trialkit.launch."):
            return _launcher(module.rsplit(".", 1)[1]), words[3:]
    return None


def parse_command(line: str, cwd: Path, where: str, name_only_ok: bool = False) -> None:
    words = shlex.split(line, comments=True)
    while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):  # VAR=value before the command
        words = words[1:]
    found = command_parser(words)
    assert found is not None, f"{where}: {line!r} is not a trialkit command this test knows how to parse"
    parse, args = found
    from trialkit.errors import UserError

    try:
        with contextlib.redirect_stdout(io.StringIO()):
            parse(args, cwd)
    except UserError as err:
        # In prose, `trialkit trial kill` names a command; its arguments are said around it.
        if not (name_only_ok and err.what.startswith("the following arguments are required")):
            pytest.fail(f"{where}: {line!r}: {err.line()}")
    except SystemExit as err:  # --help
        assert err.code in (0, None), f"{where}: {line!r} exits {err.code}"


def logical_lines(body: str) -> List[str]:
    return [line for line in re.sub(r"\\\n\s*", " ", body).splitlines() if line.strip() and not
            line.strip().startswith("#")]


@pytest.mark.parametrize("page", own_pages())
def test_examples(page, tmp_path):
    """Run, load and parse every marked block of the page, in order."""
    ws = Workspace(tmp_path)
    for block in blocks(page):
        if block.marker is None:
            continue
        flags, values = block.options()
        if flags[:1] == ["skip"]:
            continue
        expect = int(values.get("exit", 0))
        timeout = float(values.get("timeout", RUN_TIMEOUT))
        cwd = ROOT if values.get("cwd") == "repo" else ws.dir
        if "file" in values:
            target = ws.dir / values["file"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.body + "\n")
        if "config" in flags:
            check_config(block, ws, values, flags)
        if "run" in flags:
            ws.run_bash(block, cwd, expect, timeout)
        elif "python" in flags:
            ws.run_python(block, expect, timeout)
        elif "output" in flags:
            missing = _output_matches(block.body, ws.last_output)
            assert missing is None, (f"{block.where}: {missing!r} is not in the output of the block before it:\n"
                                     f"{ws.last_output[-4000:]}")
            if "exact" in flags:  # no line left out either: the example shows all there is
                assert ws.last_output.split() == block.body.split(), (
                    f"{block.where}: the output of the block before it is not exactly this:\n{ws.last_output[-4000:]}")
        elif "parse" in flags:
            for line in logical_lines(block.body):
                parse_command(line, cwd, block.where)


MESSAGE_PREFIXES = ("trialkit: error: ", "trialkit: ", "trialkit-keeper: ", "trialkit-manager: ", "[trialkit-keeper] warning: ",
                    "[trialkit-keeper] ", "run.sh: ")
MIN_FRAGMENT = 12  # shorter pieces ("trial", "FAILED (") are glue between the values a message holds


def _source_text() -> str:
    files = sorted((ROOT / "trialkit").rglob("*.py")) + sorted((ROOT / "scripts").glob("*.sh"))
    return "\n".join(path.read_text(encoding="utf-8") for path in files)


def test_messages_in_tables_are_what_trialkit_prints():
    """In a table marked `<!-- test: messages -->`, each message in the second column is made of
    pieces that trialkit's source prints literally (… stands for what varies)."""
    source = _source_text()
    checked, bad = 0, []
    for page in own_pages():
        lines = (DOCS / page).read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if line.strip() != "<!-- test: messages -->":
                continue
            for row in lines[i + 3:]:
                if not row.startswith("|"):
                    break
                cells = re.split(r"(?<!\\)\|", row)
                for message in re.findall(r"`([^`]+)`", cells[2]):
                    for prefix in MESSAGE_PREFIXES:
                        if message.startswith(prefix):
                            message = message[len(prefix):]
                            break
                    for piece in re.split(r"…", message):
                        piece = piece.strip(" :;,()")
                        if len(piece) >= MIN_FRAGMENT:
                            checked += 1
                            if piece not in source:
                                bad.append(f"docs/{page}: {piece!r}")
    assert checked > 10
    assert not bad, "not printed by trialkit (the message changed?):\n" + "\n".join(bad)


@pytest.mark.parametrize("page", own_pages())
def test_python_names_exist(page):
    """`trialkit.name` and `trialkit.module.Name` in the text are real: a module, or an attribute of one."""
    import importlib

    missing = []
    for dotted in sorted(set(re.findall(r"`(trialkit(?:\.[A-Za-z_]\w*)+)(?:\(\w*\))?`", prose(page)))):
        parts = dotted.split(".")
        if parts[-1] in ("db", "py", "sh", "yml", "yaml", "json", "log"):
            continue  # a file name (trialkit.db), not Python
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for name in parts[cut:]:
                    obj = getattr(obj, name)
            except AttributeError:
                missing.append(dotted)
            break
    assert not missing, f"docs/{page}: no such Python name: {missing}"


INLINE_COMMAND = re.compile(r"`((?:trialkit|trialkit-keeper|adaptdl-ray|python3? -m trialkit\.[\w.]+) [^`]*)`")


@pytest.mark.parametrize("page", own_pages())
def test_commands_in_prose_parse(page):
    """`trialkit ...` and friends in running text and tables are commands that parse (synopses with
    [optional] parts or `|` alternatives are skipped)."""
    for command in INLINE_COMMAND.findall(prose(page)):
        if re.search(r"[\[\]|{}<>]|\.\.\.|…", command):
            continue
        parse_command(command, ROOT, f"docs/{page}", name_only_ok=True)
