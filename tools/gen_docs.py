"""The user guide's generated parts, checked in where they show (docs/*.md), so a
page reads the same as a plain file and as the built site; nothing the code
decides is copied into prose by hand:

- between `<!-- generated: NAME -->` and `<!-- end generated -->`: `generate(NAME)`,
  the config reference tables (made from the config schema itself) and the CLI's help;
- after `<!-- include: PATH -->`: a fenced block holding that file of the
  checkout (an example config);
- before `<!-- const module.NAME -->`: the value of that constant in trialkit
  (a grace period, a default, a limit): `25<!-- const trialkit.env.DEFAULT_GRACE_SECONDS -->`.

`python tools/gen_docs.py` rewrites the pages with what the code says now;
tests/test_docs.py fails while a page differs from that (`refresh`).
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

DOCS = ROOT / "docs"
GENERATED = re.compile(r"^<!-- generated: ([\w-]+) -->\n.*?^<!-- end generated -->$", re.MULTILINE | re.DOTALL)
INCLUDE = re.compile(r"^<!-- include: (\S+) -->\n(```+)([\w+-]*)\n.*?^\2$", re.MULTILINE | re.DOTALL)
CONST = re.compile(r"[\w.+-]*<!-- const ([\w.]+) -->")


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


def refresh(markdown: str) -> str:
    """The page with its generated parts as the code and the files make them now."""
    markdown = GENERATED.sub(lambda m: f"<!-- generated: {m.group(1)} -->\n{generate(m.group(1)).rstrip()}\n"
                                       f"<!-- end generated -->", markdown)
    markdown = INCLUDE.sub(lambda m: f"<!-- include: {m.group(1)} -->\n{m.group(2)}{m.group(3)}\n"
                                     f"{(ROOT / m.group(1)).read_text(encoding='utf-8').rstrip()}\n{m.group(2)}", markdown)
    return CONST.sub(lambda m: f"{const(m.group(1))}<!-- const {m.group(1)} -->", markdown)


def main() -> None:
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        if refresh(text) != text:
            page.write_text(refresh(text), encoding="utf-8")
            print(f"rewrote {page.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
