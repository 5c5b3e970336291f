"""Checks shared by every config section: keys, types, durations.

Keys match as NNI matches them: case-insensitively, underscores ignored, so
`maxTrialNumber`, `max_trial_number` and `MaxTrialNumber` are one key. Every
check raises UserError naming the key path, the bad value and the fix.
"""
from __future__ import annotations

import difflib
import math
import re
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

from trialkit.errors import UserError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?)\s*$", re.IGNORECASE)
_PLAIN_KEY = re.compile(r"[\w-]+")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def fold(key: str) -> str:
    """The form two spellings of one key share (NNI's case_insensitive)."""
    return key.lower().replace("_", "")


def camel(name: str) -> str:
    """`max_trial_number` -> `maxTrialNumber`."""
    head, *rest = name.split("_")
    return head + "".join(word.title() for word in rest)


def path(where: Optional[str], key: Any) -> str:
    """`where.key`; a key that is not a plain word is quoted, so the path stays one readable line."""
    name = key if isinstance(key, str) and _PLAIN_KEY.fullmatch(key) else repr(key)
    return f"{where}.{name}" if where else name


def show(value: Any, limit: int = 60) -> str:
    """repr() short enough for a one-line error."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def suggest(word: str, choices: Iterable[str]) -> Optional[str]:
    by_fold = {fold(c): c for c in choices}
    close = difflib.get_close_matches(fold(word), list(by_fold), n=1, cutoff=0.6)
    return by_fold[close[0]] if close else None


def unknown(kind: str, name: Any, choices: Sequence[str], where: str, hint: str = "") -> UserError:
    """The error for a name that is not one of `choices`, with a did-you-mean."""
    near = suggest(name, choices) if isinstance(name, str) else None
    fix = f"did you mean {near!r}?" if near else hint + "use one of: " + ", ".join(choices)
    return UserError(f"unknown {kind} {show(name)}", where, fix)


def mapping(value: Any, where: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise UserError(f"expected a mapping of keys to values, got {show(value)}", where,
                        "write it as `key: value` lines")
    return value


def normalize_keys(section: Any, known: Sequence[str], where: str, hint: str = "") -> Dict[str, Any]:
    """Return `section` keyed by the names in `known` (camelCase) whatever the spelling.

    Unknown keys and two spellings of one key are errors; `hint` leads the fix
    when no known key is close.
    """
    by_fold = {fold(k): k for k in known}
    out: Dict[str, Any] = {}
    for key, value in mapping(section, where).items():
        name = by_fold.get(fold(key)) if isinstance(key, str) else None
        if name is None:
            raise unknown("key", key, known, path(where, key), hint)
        if name in out:
            raise UserError(f"{key!r} is given twice (as {name!r} too)", path(where, key), "keep one spelling")
        out[name] = value
    return out


def as_bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise UserError(f"expected true or false, got {show(value)}", where, "write true or false")
    return value


def as_str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise wrong_value("a non-empty string", value, where, "write a string")
    return value


def as_int(value: Any, where: str, minimum: Optional[int] = None, maximum: Optional[int] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(f"expected a whole number, got {show(value)}", where, "write a whole number like 4")
    if minimum is not None and value < minimum:
        raise UserError(f"{value} is too small", where, f"use {minimum} or more")
    if maximum is not None and value > maximum:
        raise UserError(f"{show(value)} is too large", where, f"use {maximum} or less")
    return value


def as_number(value: Any, where: str, minimum: Optional[float] = None, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"expected a finite number, got {show(value)}", where, "write a number like 0.5")
    if positive and value <= 0:
        raise UserError(f"{value} must be greater than 0", where, "use a positive number")
    if minimum is not None and value < minimum:
        raise UserError(f"{value} is too small", where, f"use {minimum} or more")
    return float(value)


def as_choice(value: Any, choices: Sequence[str], where: str) -> str:
    """One of `choices`, matched case-insensitively; returns the canonical spelling."""
    if isinstance(value, str):
        for choice in choices:
            if choice.lower() == value.lower():
                return choice
    raise unknown("value", value, choices, where)


def as_duration(value: Any, where: str) -> float:
    """Seconds from a number (seconds) or a string with a unit: 90, "90s", "1.5h", "2d"."""
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match:
            value = float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()]
        else:
            raise UserError(f"cannot read duration {show(value)}", where,
                            "write seconds or a number with a unit s, m, h or d, like 30m or 1.5h")
    return as_number(value, where, positive=True)


def lookup(kind: str, name: Any, known: Sequence[str], unavailable: Sequence[str], where: str) -> str:
    """The entry of `known` that `name` spells (case and underscores aside).

    `unavailable` are NNI's names trialkit does not carry: the error says so
    rather than suggesting a look-alike.
    """
    if isinstance(name, str):
        for entry in known:
            if fold(entry) == fold(name):
                return entry
        for entry in unavailable:
            if fold(entry) == fold(name):
                raise UserError(f"NNI's {kind} {entry!r} is not available in trialkit", where,
                                "use one of: " + ", ".join(known))
    raise unknown(kind, name, known, where)


# -- placeholders, v1 names, every problem at once -------------------------------------------


def placeholder(value: Any) -> Optional[str]:
    """`{your_nfs_server}` as NNI's docs write it (YAML reads a one-key mapping with no value); None otherwise."""
    if isinstance(value, dict) and len(value) == 1 and None in value.values():
        return "{" + str(next(iter(value))) + "}"
    return None


def wrong_value(expected: str, value: Any, where: str, fix: Optional[str] = None) -> UserError:
    """The error for a value of the wrong kind; an unfilled placeholder is named as one."""
    filler = placeholder(value)
    if filler is not None:
        return UserError(f"{filler} is a placeholder left unfilled", where, f"replace it with your value, {expected}")
    return UserError(f"expected {expected}, got {show(value)}", where, fix)


def rename_path(where: str, prefixes: Sequence[Tuple[str, str]]) -> str:
    """`where` with the first matching prefix replaced: (v2 path, v1 path) pairs name what a v1 config wrote."""
    for new, old in prefixes:
        if where == new or where.startswith((new + ".", new + "[")):
            return old + where[len(new):]
    return where


class ConfigProblems(UserError):
    """Several mistakes in one config, reported together on one line."""

    def __init__(self, problems: Sequence[UserError]):
        self.problems = list(problems)
        super().__init__(f"{len(self.problems)} problems: " + "; ".join(p.line() for p in self.problems))


_problems: ContextVar[Optional[List[UserError]]] = ContextVar("trialkit_config_problems", default=None)


@contextmanager
def every_problem() -> Iterator[None]:
    """Collect what report() is given inside, and a UserError raised there; then raise them as one.

    A raised error at the place of one already reported is left out: it is
    most likely that one's consequence (a placeholder, then "server missing").
    """
    problems: List[UserError] = []
    token = _problems.set(problems)
    try:
        yield
    except UserError as err:
        _add(problems, err)
    finally:
        _problems.reset(token)
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise ConfigProblems(problems)


def report(err: UserError) -> None:
    """A problem: kept for the end of every_problem() when one collects, raised at once otherwise."""
    problems = _problems.get()
    if problems is None:
        raise err
    _add(problems, err)


def _add(problems: List[UserError], err: UserError) -> None:
    for one in err.problems if isinstance(err, ConfigProblems) else [err]:
        if not any(known.where == one.where for known in problems):
            problems.append(one)
