"""The one shape of a user's mistake.

Code anywhere raises UserError with what was wrong, where, and how to fix it;
only the command-line boundary (`report_and_exit`) turns it into one line on
stderr and exit status 2. Internal bugs are never dressed up as UserError.
"""
from __future__ import annotations

import argparse
import os
import sys

TYPE_CHECKING = False  # no typing at run time: it costs every start 1.6 ms (tests/test_start_imports.py)
if TYPE_CHECKING:
    from typing import NoReturn, Optional

USAGE_EXIT = 2


class UserError(Exception):
    """A mistake the user can fix: bad config, bad argument, missing file."""

    def __init__(self, what: str, where: Optional[str] = None, fix: Optional[str] = None, at: Optional[str] = None):
        self.what = what
        self.where = where
        self.fix = fix
        self.at = at  # the file (`bad.yml`), or the file and line (`bad.yml:7`), where the key `where` names is
        super().__init__(self.line())

    def line(self) -> str:
        # One line, whatever the parts held; a word no one reads whole (a 5,000-character argument echoed back)
        # by its ends, each part clipped on its own: a long `where` reads the same with or without what follows.
        text = ": ".join(_words(part) for part in filter(None, [self.at, self.where, self.what]))
        return f"{text} ({_words(self.fix)})" if self.fix else text


LONGEST_WORD = 240


def _words(text: str) -> str:
    return " ".join(_clip(word) for word in text.split())


def _clip(word: str) -> str:
    if len(word) <= LONGEST_WORD:
        return word
    return f"{word[:120]}...[{len(word) - 160:,} characters]...{word[-40:]}"


def report_and_exit(prog: str, err: UserError) -> NoReturn:
    print(f"{prog}: error: {err.line()}", file=sys.stderr)
    raise SystemExit(USAGE_EXIT)


def _terminal_columns() -> int:
    """shutil.get_terminal_size().columns: $COLUMNS, else the terminal's, else 80."""
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80
    except (AttributeError, ValueError, OSError):  # no stdout, or not a terminal
        return 80


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's, sized as it sizes itself but without importing shutil (and with it bz2, lzma,
    zlib): every parser makes a formatter while adding arguments, on the keeper's way in."""

    def __init__(self, prog: str, **options: object):
        if options.get("width") is None:
            options["width"] = _terminal_columns() - 2
        super().__init__(prog, **options)  # type: ignore[arg-type]


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose mistakes are UserErrors: one line, exit 2, no usage dump."""

    def __init__(self, *args: object, **options: object):
        options.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **options)  # type: ignore[arg-type]

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        raise UserError(message, fix=f"see {self.prog} --help")
