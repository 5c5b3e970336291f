"""The layers hold: every import in trialkit/ points down the flow of DESIGN.md,
and the keeper's on-disk names are spelled in one module (and the same in the
two shell scripts).

    contract (env, records, statuses, layout, errors, process, channel, schema, gpus)
      <- trial side (the SDK face, sdk, keeper/, launch/, trial, adaptdl, shims/)
      <- what runs inside a Ray cluster (ray/: it starts keepers)
    contract <- manager/ (the HTTP server keepers ship to, the store, paths)
    contract, manager, trial side, ray <- platforms/ <- control/ <- web/ <- faces (cli, experiment)

Imports inside functions count: a lazy import is still an arrow. And no two
modules import each other, directly or through others (names imported only
for type checkers, under `if TYPE_CHECKING:`, are no import at run time).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, Iterator, Set, Tuple

import pytest

from trialkit import layout

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "trialkit"

CONTRACT = {"env", "records", "statuses", "layout", "errors", "process", "channel", "schema", "gpus"}
TRIAL = {"", "sdk", "keeper", "launch", "trial", "adaptdl", "shims", "checkpoints"}  # "" is the SDK face, trialkit/__init__.py
FACES = {"cli", "experiment"}

# Which layers each layer may import (itself included).
ALLOWED: Dict[str, Set[str]] = {
    "contract": {"contract"},
    "trial": {"contract", "trial"},
    "manager": {"contract", "manager"},
    "ray": {"contract", "trial", "ray"},
    "platforms": {"contract", "trial", "manager", "ray", "platforms"},
    "control": {"contract", "trial", "manager", "platforms", "control"},
    "web": {"contract", "manager", "control", "web"},
    "faces": {"contract", "trial", "manager", "ray", "platforms", "control", "web", "faces"},
}


# The one arrow up, lazy and by design: trialkit's `nni.experiment` (a fallback package, trial side: it ships to
# pods) serves the Python API of NNI's notebooks from trialkit.experiment, in the user's Python only, on first use.
EXCEPTIONS = {("trialkit.shims.nni.experiment", "trialkit.experiment")}


def layer_of(module: str) -> str:
    parts = module.split(".")
    assert parts[0] == "trialkit", module
    top = parts[1] if len(parts) > 1 else ""
    if top in CONTRACT:
        return "contract"
    if top in TRIAL:
        return "trial"
    if top in FACES:
        return "faces"
    if top in ALLOWED:
        return top
    raise AssertionError(f"trialkit.{top} belongs to no layer: add it to tests/test_layering.py")


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> Iterator[Tuple[int, str]]:
    """(line, imported trialkit module) for every import in the file, lazy ones too."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "trialkit":
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != "trialkit":
                continue
            for alias in node.names:
                # `from trialkit.platforms import base` names a module; `from trialkit.env import X` a member.
                sub = f"{node.module}.{alias.name}"
                is_module = (PACKAGE.parent / (sub.replace(".", "/") + ".py")).exists() or (
                    PACKAGE.parent / sub.replace(".", "/")).is_dir()
                yield node.lineno, sub if is_module else node.module


def sources() -> Iterator[Path]:
    return (p for p in sorted(PACKAGE.rglob("*.py")) if "static" not in p.parts)


def test_every_import_points_down_the_layers():
    against = []
    for path in sources():
        source = layer_of(module_name(path))
        for line, target in imports(path):
            target_layer = layer_of(target)
            if target_layer not in ALLOWED[source] and (module_name(path), target) not in EXCEPTIONS:
                against.append(f"{path.relative_to(ROOT)}:{line}: {source} imports {target} ({target_layer})")
    assert against == []


def test_the_layer_check_catches_an_arrow_against_the_flow(tmp_path):
    # The checker itself: a keeper module that imports the platforms is an arrow up.
    assert layer_of("trialkit.keeper.main") == "trial"
    assert "platforms" not in ALLOWED[layer_of("trialkit.keeper.main")]
    assert "web" not in ALLOWED[layer_of("trialkit.control.config")]
    fake = PACKAGE / "keeper" / "main.py"
    tree_imports = list(imports(fake))
    assert all(layer_of(t) in ALLOWED["trial"] for _, t in tree_imports)
    assert (1, "trialkit.platforms.base") in list(_imports_of("from trialkit.platforms import base\n", tmp_path))
    assert (1, "trialkit.statuses") in list(_imports_of("from trialkit.statuses import FAILED\n", tmp_path))


def _imports_of(text: str, tmp_path: Path) -> Iterator[Tuple[int, str]]:
    return imports(_probe(text, tmp_path))


# Literals that name the keeper's files: only trialkit/layout.py may spell them.
LAYOUT_LITERALS = {layout.HOME, layout.STATUS, layout.PIDFILE}


def test_the_keepers_file_names_are_spelled_only_in_layout():
    spelled = []
    for path in sources():
        if path == PACKAGE / "layout.py":
            continue
        tree = ast.parse(path.read_text())
        prose = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}  # docstrings explain, not name
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
                if node.value in LAYOUT_LITERALS or f"/{layout.HOME}/" in node.value:
                    spelled.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert spelled == []


@pytest.mark.parametrize("script", ["run.sh", "cleanup.sh"])
def test_the_shell_scripts_spell_the_same_layout(script):
    text = (ROOT / "scripts" / script).read_text()
    named = set(re.findall(r"/\.trialkit/([\w.]+)", text))
    known = {layout.STATUS, layout.SPOOL, layout.PIDFILE, layout.CHANNEL, layout.STOP, layout.TRIALSIDE, layout.FETCH_OUT}
    assert named and named <= known, f"{script} names {named - known} that trialkit/layout.py does not"
    assert f"/{layout.HOME}" in text


def test_the_scripts_use_the_layouts_own_names_and_margin():
    run = (ROOT / "scripts" / "run.sh").read_text()
    cleanup = (ROOT / "scripts" / "cleanup.sh").read_text()
    assert f'"$trial_dir/{layout.HOME}/{layout.STATUS}"' in run
    assert f"pidfile=$trial_dir/{layout.HOME}/{layout.PIDFILE}" in cleanup
    # cleanup.sh waits grace + the margin that pods' termination grace is sized by.
    assert f"print g + {layout.CLEANUP_MARGIN_SECONDS} " in cleanup


def _cycles(graph: Dict[str, Set[str]]) -> Set[Tuple[str, str]]:
    """Pairs of modules each of which imports the other, directly or through others of the graph."""
    reach: Dict[str, Set[str]] = {}
    for start in graph:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        reach[start] = seen
    return {(a, b) for a in graph for b in reach[a] if a < b and a in reach.get(b, ())}


def runtime_imports(path: Path) -> Iterator[Tuple[int, str]]:
    """imports(), less those under `if TYPE_CHECKING:`: names for type checkers, which the interpreter never
    imports (a layer still counts them: test_every_import_points_down_the_layers)."""
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {inner.lineno for node in ast.walk(tree)
                   if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
                   for stmt in node.body for inner in ast.walk(stmt) if hasattr(inner, "lineno")}
    return ((line, target) for line, target in imports(path) if line not in typing_only)


def import_graph() -> Dict[str, Set[str]]:
    """Each trialkit module -> the trialkit modules it imports, at module level or inside a function."""
    return {module_name(p): {t for _, t in runtime_imports(p)} - {module_name(p)} for p in sources()}


def test_no_two_modules_import_each_other():
    # A loop makes each module's meaning depend on the other's load order, and a change to one a change to both:
    # the lower one holds what both need (the manager's routes: manager/routes.py, below server.py).
    loops = sorted(_cycles(import_graph()))
    assert loops == [], "modules that import each other (directly or through others): " + "; ".join(
        f"{a} <-> {b}" for a, b in loops)


def test_the_loop_check_sees_a_lazy_import_and_not_a_type_checkers(tmp_path):
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == {("a", "b"), ("a", "c"), ("b", "c")}
    lazy = "def f():\n    from trialkit.platforms import base\n"
    typing_only = "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    from trialkit.manager import store\n"
    assert list(runtime_imports(_probe(lazy + typing_only, tmp_path))) == [(2, "trialkit.platforms.base")]


def _probe(text: str, tmp_path: Path) -> Path:
    path = tmp_path / "probe.py"
    path.write_text(text)
    return path
