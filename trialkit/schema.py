"""Checks shared by every config section: keys, types, durations.

Keys match as NNI matches them: case-insensitively, underscores ignored, so
`maxTrialNumber`, `max_trial_number` and `MaxTrialNumber` are one key. Every
check raises UserError naming the key path, the bad value and the fix.
"""
from __future__ import annotations

import ast
import difflib
import json
import math
import os
import re
import stat
import sys
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, TypeVar

import yaml

from trialkit.errors import UserError
from trialkit.records import INT64_MAX, INT64_MIN

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
    """repr() short enough for a one-line error; a long whole number by its length, and a value repr()
    cannot write (a number past 4,300 digits inside, nesting past the interpreter's stack) by its type."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * limit:
        return f"a whole number of about {int(value.bit_length() * 0.30103)} digits"
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        return f"a {type(value).__name__} too large to show"
    if len(text) <= limit:
        return text
    # The closing quote or bracket stays: 'qqq...' reads as a string cut short, 'qqq... as a quote left open.
    closing = text[-1] if text[-1] in "'\")]}>" else ""
    return text[: limit - 3 - len(closing)] + "..." + closing


def suggest(word: str, choices: Iterable[str], cutoff: float = 0.6) -> Optional[str]:
    by_fold = {fold(c): c for c in choices}
    close = difflib.get_close_matches(fold(word), list(by_fold), n=1, cutoff=cutoff)
    return by_fold[close[0]] if close else None


def unknown(kind: str, name: Any, choices: Sequence[str], where: str, hint: str = "",
            also: Sequence[str] = ()) -> UserError:
    """The error for a name that is not one of `choices`, with a did-you-mean (of `choices` or `also`: other
    spellings a lookup takes)."""
    near = suggest(name, [*choices, *also]) if isinstance(name, str) else None
    fix = f"did you mean {near!r}?" if near else hint + "use one of: " + ", ".join(choices)
    return UserError(f"unknown {kind} {show(name)}", where, fix)


def mapping(value: Any, where: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise UserError(f"expected a mapping of keys to values, got {show(value)}", where,
                        "write it as `key: value` lines")
    return value


class Misspelt(UserError):
    """An unknown key close to a known one that the mapping lacks: a problem found at the known key's place (it
    is missing), or at that key of a mapping inside (a role's own, a section-wide one absent), is this one's
    consequence, left out where problems are collected (every_problem), whichever was found first."""

    def __init__(self, err: UserError, meant: str):
        super().__init__(err.what, err.where, err.fix)
        self.meant = meant

    def explains(self, err: UserError) -> bool:
        if err.where is None or err is self:
            return False
        within, _, key = self.meant.rpartition(".")
        return err.where == self.meant or (err.where.startswith(f"{within}.") and err.where.endswith(f".{key}"))


def unknown_key(key: Any, known: Sequence[str], section: Mapping, where: str, hint: str = "") -> UserError:
    """The error for `key` of the mapping `section` (at `where`), which is none of `known`: a did-you-mean,
    a Misspelt when the key it resembles is not in `section`."""
    err = unknown("key", key, known, path(where, key), hint)
    near = suggest(key, known) if isinstance(key, str) else None
    if near is None or any(isinstance(k, str) and fold(k) == fold(near) for k in section):
        return err
    return Misspelt(err, path(where, near))


def normalize_keys(section: Any, known: Sequence[str], where: str, hint: str = "") -> Dict[str, Any]:
    """Return `section` keyed by the names in `known` (camelCase) whatever the spelling.

    Unknown keys and two spellings of one key are reported (report): left
    out, the rest checked on; `hint` leads the fix when no known key is close.
    """
    by_fold = {fold(k): k for k in known}
    out: Dict[str, Any] = {}
    for key, value in mapping(section, where).items():
        name = by_fold.get(fold(key)) if isinstance(key, str) else None
        if name is None:
            report(unknown_key(key, known, section, where, hint))
        elif name in out:
            report(UserError(f"{key!r} is given twice (as {name!r} too)", path(where, key), "keep one spelling"))
        else:
            out[name] = value
    return out


def as_bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise UserError(f"expected true or false, got {show(value)}", where, "write true or false")
    return value


def as_str(value: Any, where: str) -> str:
    """A non-empty string that a process's environment, a command line and a file name can carry: no NUL, no
    lone surrogate (UTF-8 cannot encode one: every trial would fail to start)."""
    if not isinstance(value, str) or not value.strip():
        raise wrong_value("a non-empty string", value, where, "write a string")
    if "\x00" in value:
        raise UserError(f"{show(value)} holds a NUL character", where, "remove it")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise UserError(f"{show(value)} holds {value[err.start]!r}, half of a UTF-16 pair, which UTF-8 cannot write",
                        where, "remove it, or write the whole character") from None
    return value


def as_int(value: Any, where: str, minimum: int = INT64_MIN, maximum: int = INT64_MAX) -> int:
    """A whole number within [minimum, maximum]; every count a config holds fits in 64 bits, as the store keeps it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(f"expected a whole number, got {show(value)}", where, "write a whole number like 4")
    if value < minimum:
        raise UserError(f"{show(value)} is too small", where, f"use {minimum} or more")
    if value > maximum:
        raise UserError(f"{show(value)} is too large", where, f"use {maximum} or less")
    return value


def _numeral(value: Any) -> bool:
    """Whether `value` is a string that spells a finite number ("0.5": a number quoted)."""
    try:
        return isinstance(value, str) and math.isfinite(float(value))
    except ValueError:
        return False


def as_number(value: Any, where: str, minimum: Optional[float] = None, positive: bool = False) -> float:
    """A finite float; a whole number past a float's range (10**400) is refused, not an OverflowError."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > sys.float_info.max:
        raise UserError(f"{show(value)} is too large", where, f"use a number of at most {sys.float_info.max:.3g}")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"expected a finite number, got {show(value)}", where,
                        f"write it without quotes: {value.strip()}" if _numeral(value) else "write a number like 0.5")
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
        if not match:
            raise UserError(f"cannot read duration {show(value)}", where,
                            "write seconds or a number with a unit s, m, h or d, like 30m or 1.5h")
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()]  # inf past a float's range
        if not math.isfinite(seconds):
            raise UserError(f"duration {show(value)} is too long", where, "write a number of seconds a float holds")
        value = seconds
    return as_number(value, where, positive=True)


def lookup(kind: str, name: Any, known: Sequence[str], where: str, aliases: Optional[Mapping[str, str]] = None,
           refused: Optional[Mapping[str, Tuple[str, str]]] = None) -> str:
    """The entry of `known` that `name` spells (case and underscores aside), itself or through `aliases` (another
    name -> its entry, one of `known` or `refused`).

    `refused` are NNI's names trialkit does not carry (name -> why, what to
    use instead): the error says so rather than suggesting a look-alike. Any
    other name gets the nearest of all these names as a did-you-mean (a
    misspelt alias included: `PBTTunner`).
    """
    aliases, refused = aliases or {}, refused or {}
    if isinstance(name, str):
        spelt = next((entry for entry in [*known, *aliases, *refused] if fold(entry) == fold(name)), None)
        entry = aliases.get(spelt, spelt) if spelt is not None else None
        if entry in known:
            return entry
        if entry in refused:
            why, instead = refused[entry]
            raise UserError(f"NNI's {kind} {entry!r} is not available in trialkit: {why}", where, f"use {instead}")
    raise unknown(kind, name, known, where, also=[*aliases, *refused])


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
    most likely that one's consequence (a placeholder, then "server missing"),
    as is one at the place of the key a reported typo resembles (Misspelt).
    """
    problems: List[UserError] = []
    token = _problems.set(problems)
    try:
        yield
    except UserError as err:
        _add(problems, err)
    finally:
        _problems.reset(token)
    _raise(problems)


def _raise(problems: List[UserError]) -> None:
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


T = TypeVar("T")


def attempt(check: Callable[..., T], *args: Any, default: Optional[T] = None) -> Optional[T]:
    """`check(*args)`; where problems are collected (every_problem), a UserError it raises is reported and
    `default` stands in, so the checks after it run too."""
    try:
        return check(*args)
    except UserError as err:
        report(err)
        return default


def raise_reported() -> None:
    """Raise what every_problem has collected so far: the step after this needs every part before it sound."""
    _raise(list(_problems.get() or []))


def each(check: Callable[..., T], items: Iterable[Sequence[Any]]) -> List[T]:
    """`[check(*item) for item in items]`, every item checked though one fails: their UserErrors raised together
    (as every_problem raises them), wherever this is called."""
    results: List[T] = []
    problems: List[UserError] = []
    for item in items:
        try:
            results.append(check(*item))
        except UserError as err:
            _add(problems, err)
    _raise(problems)
    return results


def renamed(err: UserError, prefixes: Sequence[Tuple[str, str]]) -> UserError:
    """`err` (each of its problems) with its place renamed by rename_path: a config translated into another
    format is refused in the keys its user wrote."""
    if isinstance(err, ConfigProblems):
        return ConfigProblems([renamed(one, prefixes) for one in err.problems])
    if err.where is None:
        return err
    return UserError(err.what, rename_path(err.where, prefixes), err.fix)


def _add(problems: List[UserError], err: UserError) -> None:
    for one in err.problems if isinstance(err, ConfigProblems) else [err]:
        if not any(known.where == one.where or (isinstance(known, Misspelt) and known.explains(one))
                   for known in problems):
            if isinstance(one, Misspelt):  # what it explains was found first (a required key's check ran sooner)
                problems[:] = [known for known in problems if not one.explains(known)]
            problems.append(one)


# -- the files configs are read from ---------------------------------------------------------

MAX_DEPTH = 100  # levels of nesting a config may have (a search space nests a few)
MAX_VALUES = 1_000_000  # values a config may hold once its YAML aliases are expanded (billion laughs)
MAX_FILE_BYTES = 64 << 20  # a config, a search space or an import file larger than this is not one


def read_data_file(path: Path, where: str) -> Any:
    """JSON or YAML from a file, for every config reader (configs, search spaces, job templates, imports);
    YAML as JSON reads it (1e-3 is a number).

    Refused, naming the line: a key given twice in one mapping, nesting deeper
    than MAX_DEPTH, an alias inside the value it names (a value that holds
    itself), a whole number longer than Python reads; and what check_shape
    refuses (aliases of aliases).
    """
    named = "it" if where == str(path) else show(str(path), 160)  # the file, once: "X: cannot read it: ..."
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would hang the read, /dev/zero never end it
            raise UserError(f"{named} is not a regular file", where, "give the path of a config file")
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise UserError(f"{named} is over {MAX_FILE_BYTES >> 20} MiB", where, "give a config file")
        text = data.decode("utf-8")
    except (OSError, ValueError) as err:  # ValueError: a NUL in the path, or text that is not UTF-8
        reason = getattr(err, "strerror", None) or str(err)
        raise UserError(f"cannot read {named}: {reason}", where, "check the path") from None
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError):
        # YAML reads JSON too, and says where a repeated key, too deep a nesting or too long a number is.
        try:
            data = yaml.load(text, Loader=_Loader)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            place = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(err, "problem", None) or "not valid YAML"
            raise UserError(f"cannot parse {named}{place}: {problem}", where, "fix the file there") from None
    check_shape(data, where)
    return data


def placed(err: UserError, path: Path, lacking: bool = True, within: str = "") -> UserError:
    """`err` (each of its problems) placed in the config file at `path`, as compilers place theirs: at `file:LINE`,
    the line of the key it names as the file wrote it (any spelling of it, through `<<:` merges); at `file` for a
    key the file lacks (`lacking`: a place that may name something else, a program, is then kept as it is). A
    place naming a command-line argument (CONTEXT_DIR, --port), the file itself or another file (an absolute
    path) is kept as it is.

    `within`: the key that names the file's whole content (searchSpaceFile: its keys are the search space's)."""
    try:
        text = path.read_text("utf-8")
        root = yaml.compose(_blanks_as_spaces(text), Loader=_Loader)
    except (OSError, ValueError, yaml.YAMLError):  # read once already; changed or gone since: no lines
        root = None
    return _placed(err, root, str(path), lacking, within)


def _blanks_as_spaces(text: str) -> str:
    """A JSON text with its tabs as spaces, which YAML reads (it refuses a tab where JSON's indentation puts one):
    JSON holds a tab only as a blank between tokens (in a string it is written \\t), so no value changes and
    every line keeps its number. Any other text as it is."""
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return text
    return text.replace("\t", " ")


_ARGUMENT = re.compile(r"[A-Z][A-Z0-9_]*|-.*")  # CONTEXT_DIR, --tls-cert: what `where` names besides keys
_PATH_PART = re.compile(r"\.?(?:([\w-]+)|\[(\d+)\]|('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"))")


def _placed(err: UserError, root: Any, file: str, lacking: bool, within: str = "") -> UserError:
    if isinstance(err, ConfigProblems):  # in the file's order, as it is read; the keys it lacks after them
        in_order = sorted(err.problems, key=lambda one: key_line(root, _inside(one.where, within) or "") or math.inf)
        return ConfigProblems([_placed(one, root, file, lacking, within) for one in in_order])
    if err.at is not None or err.where == file or (err.where and _ARGUMENT.fullmatch(err.where)) or \
            (err.where and os.path.isabs(err.where)):  # a file of its own (a code dir's .trialignore:LINE)
        return err
    inside = _inside(err.where, within)
    if within and inside is None:  # not this file's
        return err
    line = key_line(root, inside) if inside else None
    if line is None and not lacking:
        return err
    return UserError(err.what, err.where, err.fix, at=f"{file}:{line}" if line else file)


def _inside(where: Optional[str], within: str) -> Optional[str]:
    """`where` as a path in a file whose whole content `within` names (None: `where` is outside it)."""
    if not within or where is None:
        return where
    if where == within:
        return ""
    return where[len(within) + 1:] if where.startswith((within + ".", within + "[")) else None


def key_line(root: Any, where: str) -> Optional[int]:
    """The line (from 1) of the key that `where` (schema.path's `a.b[0].'c d'`) names in the composed YAML
    `root`: the last key on the way where a value holds a name the file does not (a searchSpaceFile's
    parameters); None where the file lacks the key."""
    node, line = root, None
    for part in _path_parts(where) or ():
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            found = _mapping_item(node, part)
            if found is None:
                return None
            line, node = found[0].start_mark.line + 1, found[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        elif isinstance(node, yaml.ScalarNode):
            return line
        else:
            return None
    return line


def _path_parts(where: str) -> Optional[List[Any]]:
    """`a.b[0].'c d'` -> ["a", "b", 0, "c d"]; None for a text that is not such a path."""
    parts: List[Any] = []
    at = 0
    while at < len(where):
        match = _PATH_PART.match(where, at)
        if match is None or match.end() == at or (at == 0 and where.startswith(".")):
            return None
        word, index, quoted = match.groups()
        try:
            parts.append(word if word is not None else int(index) if index is not None else ast.literal_eval(quoted))
        except (ValueError, SyntaxError):  # quoted as repr() never writes it: not a path of schema.path's
            return None
        at = match.end()
    return parts


def _mapping_item(node: Any, key: str) -> Optional[Tuple[Any, Any]]:
    """(key node, value node) of `key` in a mapping node, spelt as NNI matches keys; a `<<:` merge's too."""
    merged = []
    for key_node, value_node in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            merged += value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
        elif isinstance(key_node, yaml.ScalarNode) and fold(key_node.value) == fold(key):
            return key_node, value_node
    for source in merged:
        found = _mapping_item(source, key) if isinstance(source, yaml.MappingNode) else None
        if found is not None:
            return found
    return None


def _unique_keys(pairs: List[Tuple[Any, Any]]) -> Dict[Any, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("a key is given twice")
    return out


def check_shape(data: Any, where: str) -> None:
    """Refuse data no config holds, wherever it came from (a file, a program): a list or mapping inside
    itself, nesting deeper than MAX_DEPTH (aliases of aliases included), more than MAX_VALUES values
    once every shared value is counted where it appears (billion laughs)."""
    if _measure(data, {}, 0, where)[0] > MAX_VALUES:
        raise UserError(f"it expands to more than {MAX_VALUES:,} values (YAML aliases of aliases)", where,
                        "write the values out, or use fewer nested aliases")


_OPEN = (-1, -1)  # a list or mapping being measured: met again inside itself, it holds itself


def _measure(value: Any, seen: Dict[int, Tuple[int, int]], depth: int, where: str) -> Tuple[int, int]:
    """(values held with every shared value counted where it appears, levels of nesting below); memoized by id,
    so shared values cost once."""
    if not isinstance(value, (dict, list, tuple)):  # a tuple: from a program (Experiment.config)
        return 1, 0
    known = seen.get(id(value))
    if known is _OPEN:
        raise UserError("a list or mapping is inside itself (a YAML alias inside the value it names)", where,
                        "write the values out")
    if known is None:
        if depth >= MAX_DEPTH:
            raise _too_deep(where)
        seen[id(value)] = _OPEN
        size, height = 1, 0
        for item in (value.values() if isinstance(value, dict) else value):
            item_size, item_height = _measure(item, seen, depth + 1, where)
            size, height = min(size + item_size, MAX_VALUES + 1), max(height, item_height + 1)
        known = seen[id(value)] = (size, height)
    if depth + known[1] > MAX_DEPTH:
        raise _too_deep(where)
    return known


def _too_deep(where: str) -> UserError:
    return UserError(f"nested deeper than {MAX_DEPTH} levels", where, "nest less; aliases of aliases nest too")


class _Loader(yaml.SafeLoader):
    """YAML 1.1 as JSON users expect: 1e-3 is a float, 2024-01-01 stays a string; no key twice; nesting bounded;
    no value that holds itself; a number Python cannot read is a YAML error with its line."""

    def __init__(self, stream: Any):
        super().__init__(stream)
        self._open: List[Optional[str]] = []  # the anchors of the nodes being composed, outermost first

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if len(self._open) >= MAX_DEPTH:
            raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels", event.start_mark)
        if isinstance(event, yaml.AliasEvent) and event.anchor in self._open:
            raise yaml.composer.ComposerError(
                None, None, f"the alias *{event.anchor} is inside the value &{event.anchor} names (it would hold "
                            "itself without end)", event.start_mark)
        self._open.append(getattr(event, "anchor", None))
        try:
            return super().compose_node(parent, index)
        finally:
            self._open.pop()

    def construct_mapping(self, node: Any, deep: bool = False) -> Dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            first: Dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *base` merges keys that the mapping's own may override
                key = self.construct_object(key_node, deep=deep)
                try:
                    if key in first:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"the key {key!r} is given twice (first at line {first[key].line + 1})",
                            key_node.start_mark)
                    first[key] = key_node.start_mark
                except TypeError:
                    pass  # an unhashable key: SafeLoader says so itself
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: Any) -> int:
        try:
            return super().construct_yaml_int(node)
        except ValueError:  # past sys.get_int_max_str_digits() decimal digits
            raise yaml.constructor.ConstructorError(
                None, None, f"a whole number of {len(node.value):,} digits is longer than a number can be",
                node.start_mark) from None


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)
