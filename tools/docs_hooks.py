"""MkDocs hooks for the user guide (mkdocs.yml: `hooks: [tools/docs_hooks.py]`).

Two substitutions in each page's Markdown, so that nothing the code decides is
copied into prose by hand:

- `<!-- generated: NAME -->` becomes `gen_config_reference.render(NAME)`: the
  config reference tables, made from the config schema itself;
- `{{ const module.NAME }}` becomes the value of that constant in trialkit
  (a grace period, a default, a limit): `{{ const trialkit.env.DEFAULT_GRACE_SECONDS }}`
  reads `25`.

tests/test_docs.py expands pages the same way (`expand`).
"""
from __future__ import annotations

import contextlib
import importlib
import io
import os
import re
import sys
from pathlib import Path
from typing import Callable, Dict, List, Sequence

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "tools"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import gen_config_reference  # noqa: E402  (after the path is set)

GENERATED = re.compile(r"^<!-- generated: ([\w-]+) -->$", re.MULTILINE)
CONST = re.compile(r"\{\{ const ([\w.]+) \}\}")


def const(dotted: str):
    """The value of `package.module.NAME`."""
    module_name, _, name = dotted.rpartition(".")
    value = getattr(importlib.import_module(module_name), name)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def help_text(main: Callable[[Sequence[str]], object], argv: List[str]) -> str:
    """What `PROG ARGV --help` prints, at a fixed width."""
    out = io.StringIO()
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        with contextlib.redirect_stdout(out):
            try:
                main(argv + ["--help"])
            except SystemExit:
                pass
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old
    return out.getvalue().rstrip()


def cli_commands() -> List[List[str]]:
    """Every `trialkit` command path, from the parser itself: [], ["run"], ["experiment", "list"], ..."""
    import argparse

    from trialkit.cli import build_parser

    found: List[List[str]] = []

    def walk(parser: argparse.ArgumentParser, path: List[str]) -> None:
        found.append(path)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, path + [name])

    walk(build_parser(), [])
    return found


def render_cli() -> str:
    from trialkit.cli import main as trialkit_main
    from trialkit.keeper.main import parse_args as keeper_args
    from trialkit.ray.adaptdl_ray import parse_args as adaptdl_ray_args

    parts = []
    for path in cli_commands():
        title = " ".join(["trialkit"] + path)
        parts.append(f"### {title}\n\n```text\n{help_text(trialkit_main, path)}\n```\n")
    parts.append(f"## trialkit-keeper\n\nAlso `python -m trialkit.keeper`.\n\n```text\n{help_text(keeper_args, [])}\n```\n")
    parts.append(f"## adaptdl-ray\n\nAlso `python -m trialkit.ray.adaptdl_ray`.\n\n```text\n{help_text(adaptdl_ray_args, [])}\n```\n")
    return "\n".join(parts)


OWN: Dict[str, Callable[[], str]] = {"cli": render_cli}


def generate(name: str) -> str:
    return (OWN.get(name) or (lambda: gen_config_reference.render(name)))()


def expand(markdown: str) -> str:
    markdown = GENERATED.sub(lambda m: generate(m.group(1)).rstrip("\n"), markdown)
    return CONST.sub(lambda m: str(const(m.group(1))), markdown)


def on_page_markdown(markdown, page, config, files):
    return expand(markdown)
