"""The trial context: the code directory that goes with every trial.

A platform that needs the user's code beside the trial takes it from here:
the local platform copies it into the trial dir (`copy_into`), Ray and others
ship it as bytes (`pack`, then `unpack` where it runs). What goes in is
`collect(code_dir)`:

- `.trialignore` files, in gitignore syntax, drop what training does not need.
  As in git, one may sit in any directory and speaks of the paths beneath it,
  relative to itself; a deeper file overrides a higher one, and within a file
  the last matching line wins. A directory that is ignored is not entered, so
  nothing under it can be brought back by a `!` line (git's rule too).
  Determined's `.detignore` is read as well, as if its lines came first in the
  same directory's `.trialignore`: a Determined project needs no change. A
  line gitignore rejects (a lone `!`, a trailing backslash, `[z-a]`) is a
  UserError naming the file and line.
- `__pycache__/`, `*.pyc`, `*.pyo` and `.git/` are always left out; no
  `.trialignore` line brings them back (Determined's `.detignore` rule).
- `startup-hook.sh` at the top is always kept, whatever the ignore rules say:
  run.sh runs it before the trial, so a broad pattern (`*.sh`) that dropped it
  would silently change what the trial does.
- Symlinks are never followed. One that resolves to a collected file, or to a
  directory holding collected files (not one of its own ancestors, which
  would make a loop), is kept as a symlink, rewritten relative so that it
  points into the copy. Any other (outside the directory, dangling, to
  something ignored) is left out, so nothing outside the directory leaks in.
- Only regular files, symlinks and the directories on their way are taken;
  empty directories, FIFOs, sockets and devices are not.
- The collected files may total at most `LIMIT_BYTES` (Determined's 95 MB,
  counted in MiB as every size here); more is a UserError that names the
  largest files and points at `.trialignore`.
"""
from __future__ import annotations

import difflib
import gzip
import io
import os
import re
import shlex
import shutil
import stat
import tarfile
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple, Union

import pathspec

from trialkit.errors import UserError
from trialkit.launch import grammar

IGNORE_FILE = ".trialignore"
# Read too, before .trialignore in the same directory, so a Determined user's
# project needs no change (and a .trialignore line can override it).
DETERMINED_IGNORE_FILE = ".detignore"
STARTUP_HOOK = "startup-hook.sh"
LIMIT_BYTES = 95 * 1024 * 1024
DEFAULT_IGNORES = ("__pycache__/", "*.pyc", "*.pyo", ".git/")
_MIB = 1024 * 1024

PathLike = Union[str, "os.PathLike[str]"]


def collect(code_dir: PathLike) -> List[str]:
    """The context's entries: relative POSIX paths of files and kept symlinks, sorted.

    Raises UserError when code_dir is not a directory or its files total more
    than LIMIT_BYTES.
    """
    root = _root(code_dir)
    files, links = _walk(root)
    _check_size(root, files)
    kept = _kept_links(root, links, files)
    return sorted(files + kept)


# `python`, `python3`, `python3.11`: the commands whose script the context must hold; their options that take
# the next word as their value.
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
_VALUED = frozenset({"-W", "-X"})
_ASSIGNMENT = re.compile(r"[A-Za-z_]\w*=.*", re.DOTALL)
# The launchers whose workers run a script of the code dir: their arguments follow the shared grammar.
_LAUNCHERS = frozenset(f"trialkit.launch.{name}" for name in ("torch_distributed", "deepspeed", "horovod"))


def check_script(command: Optional[str], files: List[str], code_dir: PathLike) -> None:
    """Refuse a `python3 SCRIPT.py ...` command whose script the context (`files`, collect's) does not hold:
    every trial would fail alike (a misspelt name ran three trials to the first-failures stop, each naming its
    own copy of the code)."""
    script = _script_of(command)
    if script is None or os.path.isabs(script) or script in files:
        return
    near = difflib.get_close_matches(script, [f for f in files if f.endswith(".py")], n=1)
    ignored = Path(code_dir, script).is_file()  # there, but .trialignore leaves it out
    raise UserError(f"{script} is not in the trial code directory {code_dir}"
                    + (" that trials get (.trialignore leaves it out)" if ignored else ""), "trialCommand",
                    f"did you mean {near[0]}?" if near and not ignored else
                    "give the script's path relative to trialCodeDirectory")


def _script_of(command: Optional[str]) -> Optional[str]:
    """The .py script a plain `python ... SCRIPT.py` command runs, `env NAME=VALUE ...` in front or not (a
    Determined config's entrypoint is run so), or that a trialkit launcher's workers run; None for any other
    command (-m, -c, a shell's `cd dir && ...`)."""
    try:
        argv = shlex.split(command or "")
    except ValueError:
        return None
    while argv and (argv[0] == "env" or _ASSIGNMENT.fullmatch(argv[0])):  # a Determined entrypoint's own env too
        argv = argv[1:]
    if not argv or not _PYTHON.fullmatch(os.path.basename(argv[0])):
        return None
    words = iter(argv[1:])
    for word in words:
        if word == "-m":
            module = next(words, "")
            return _launched_script(list(words)) if module in _LAUNCHERS else None
        if word in ("-c", "-"):
            return None
        if word in _VALUED:
            next(words, None)
        elif not word.startswith("-"):
            return os.path.normpath(word).replace(os.sep, "/") if word.endswith(".py") else None
    return None


def _launched_script(argv: List[str]) -> Optional[str]:
    """The .py script of `python -m trialkit.launch.NAME [[OVERRIDES...] --] SCRIPT.py ...`, its arguments
    split as the launcher splits them; None where it runs no .py script or refuses its arguments itself."""
    try:
        launch = grammar.parse(argv, "the engine")
    except UserError:
        return None
    script = launch.script[0] if launch.script else ""
    return os.path.normpath(script).replace(os.sep, "/") if script.endswith(".py") else None


def copy_into(code_dir: PathLike, dest: PathLike) -> Path:
    """Copy the context into dest (created if missing) with modes and mtimes; returns dest."""
    root, out_root = _root(code_dir), Path(dest)
    out_root.mkdir(parents=True, exist_ok=True)  # an empty context (no file, or dangling links only) too
    for rel in collect(root):
        src, out = root / rel, out_root / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        _clear(out)
        if src.is_symlink():
            os.symlink(_link_text(root, rel), out)
        else:
            shutil.copy2(src, out)  # copy2: mode bits and mtime too
    return out_root


def pack(code_dir: PathLike) -> bytes:
    """The context as a tar.gz: same tree, same bytes (sorted, no times, no owners)."""
    root = _root(code_dir)
    buf = io.BytesIO()
    # mtime=0 in the gzip header and in every tar member: the bytes depend on
    # content and modes only, so a package can be cached by its hash.
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=6) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for rel in collect(root):
                _add(tar, root, rel)
    return buf.getvalue()


def unpack(data: bytes, dest: PathLike) -> Path:
    """Extract a `pack` result into dest (created if missing); returns dest.

    The bytes may have crossed a network, so tarfile's "data" filter refuses
    members that would land or point outside dest; it also drops setuid,
    setgid, sticky and group/other write bits, the only modes not restored.
    """
    out_root = Path(dest)
    out_root.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(out_root, filter="data")
    return out_root


# ---------------------------------------------------------------- walking


# One ignore line: (True to ignore / False to keep, pathspec's regex for it).
_Line = Tuple[bool, "re.Pattern[str]"]


def _compile(lines: Iterable[str]) -> List[_Line]:
    """An ignore file's lines, last first (the last line that names a path wins).

    pathspec translates git's wildmatch into regexes, and its own check_file
    matches a path through its ancestors too (a line naming a directory
    matches all beneath it). That suits a flat list of paths, not this walk,
    where the ancestors were already decided: with `#z` then `!a`, git ignores
    `a/#z/` though `!a` matches it through `a/`. So `_names` asks of each
    regex whether its line names the path itself.
    """
    spec = pathspec.GitIgnoreSpec.from_lines(map(_git_reading, lines))
    return [(p.include, p.regex) for p in reversed(spec.patterns) if p.include is not None]  # not blank, not a comment


def _git_reading(line: str) -> str:
    # pathspec reads `dir/**/` as `dir/`, dir itself included; git means the
    # directories inside dir, at any depth, which `dir/**/*/` says to both.
    return line + "*/" if line.endswith("/**/") else line


def _verdict(lines: List[_Line], probe: str) -> Optional[bool]:
    """What the last line naming probe says: True ignores, False keeps; None when no line does."""
    for ignores, regex in lines:
        if _names(regex, probe):
            return ignores
    return None


def _names(regex: "re.Pattern[str]", probe: str) -> bool:
    match = regex.search(probe)
    if match is None:
        return False
    if regex.groups:
        # pathspec's one group is the slash after the name it matched: the
        # probe's own trailing slash, or none, when the name is the probe; a
        # slash before the end when the name is an ancestor's.
        return match.lastindex is None or match.end(match.lastindex) == len(probe)
    # No group: a `**` line (`runs/**`), whose regex matches a prefix of all
    # beneath runs, and which git does not read as naming runs itself.
    return not (probe.endswith("/") and regex.fullmatch(probe))


_ALWAYS_OUT = _compile(DEFAULT_IGNORES)


class _Rules:
    """The `.trialignore` files met so far, by the directory that holds them."""

    def __init__(self) -> None:
        self.files: Dict[str, List[_Line]] = {}

    def read(self, root: Path, rel_dir: str) -> None:
        lines: List[str] = []
        for name in (DETERMINED_IGNORE_FILE, IGNORE_FILE):
            path = root / rel_dir / name
            if path.is_file() and not path.is_symlink():
                lines += path.read_text(encoding="utf-8", errors="surrogateescape").splitlines()
        if lines:
            try:
                self.files[rel_dir] = _compile(lines)
            except (ValueError, re.error):  # pathspec's word on a line git rejects; re's on a range like [z-a]
                _refuse_bad_line(root / rel_dir)
                raise

    def ignored(self, rel: str, is_dir: bool) -> bool:
        # A trailing slash is how gitignore tells a directory: `data/` names
        # only a directory named data.
        probe = rel + "/" if is_dir else rel
        if _verdict(_ALWAYS_OUT, probe):
            return True
        if rel == STARTUP_HOOK and not is_dir:
            return False
        for base in _parents(rel):  # deepest first: a deeper file overrides
            lines = self.files.get(base)
            verdict = _verdict(lines, probe[len(base) + 1:] if base else probe) if lines else None
            if verdict is not None:
                return verdict
        return False


def _refuse_bad_line(folder: Path) -> None:
    """The UserError naming the first line of folder's ignore files that gitignore rejects."""
    for name in (DETERMINED_IGNORE_FILE, IGNORE_FILE):
        path = folder / name
        if not path.is_file() or path.is_symlink():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="surrogateescape").splitlines(), 1):
            try:
                _compile([line])
            except (ValueError, re.error) as err:
                why = f" ({err.msg})" if isinstance(err, re.error) else ""  # re's says where: a range backwards
                shown = f"'{line}'" if line.isprintable() else repr(line)  # as written: `foo\`, not 'foo\\'
                raise UserError(f"{shown} is not a pattern gitignore takes{why}", f"{path}:{number}",
                                "fix the line or remove it") from None


def _walk(root: Path) -> Tuple[List[str], List[str]]:
    """Regular files and symlinks not ignored, as relative POSIX paths."""
    files: List[str] = []
    links: List[str] = []
    rules = _Rules()
    for dirpath, dirnames, filenames in os.walk(root, onerror=_raise):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir
        rules.read(root, rel_dir)
        entered = []
        for name in sorted(dirnames + filenames):
            rel = f"{rel_dir}/{name}" if rel_dir else name
            mode = os.lstat(root / rel).st_mode
            is_dir = stat.S_ISDIR(mode)
            if rules.ignored(rel, is_dir):
                continue
            if is_dir:
                entered.append(name)
            elif stat.S_ISLNK(mode):
                links.append(rel)
            elif stat.S_ISREG(mode):
                files.append(rel)
        dirnames[:] = entered  # os.walk enters only these
    return files, links


def _raise(err: OSError) -> None:
    # An unreadable directory would otherwise vanish from the context unseen.
    raise err


def _kept_links(root: Path, links: List[str], files: List[str]) -> List[str]:
    """The symlinks that land on a collected file or a directory holding some."""
    wanted = set(files)
    holders = {parent for rel in files for parent in _parents(rel)}
    kept = []
    for rel in links:
        target = _link_target(root, rel)
        if target is None:
            continue
        # A link to the top or to one of its own ancestors would be a loop.
        loops = target == "" or rel.startswith(f"{target}/")
        if target in wanted or (target in holders and not loops):
            kept.append(rel)
    return kept


def _link_target(root: Path, rel: str) -> Optional[str]:
    """Where a symlink finally lands, relative to root; None when outside or dangling."""
    real = Path(os.path.realpath(root / rel))
    if not real.exists():
        return None
    try:
        target = real.relative_to(root).as_posix()
    except ValueError:
        return None
    return "" if target == "." else target


def _link_text(root: Path, rel: str) -> str:
    """A kept symlink's new text: relative, so it points into whichever copy holds it."""
    target = root / str(_link_target(root, rel))  # collect kept it: it lands inside
    return Path(os.path.relpath(target, (root / rel).parent)).as_posix()


def _parents(rel: str) -> List[str]:
    """The directories holding rel, deepest first, ending with "" (the top)."""
    parts = rel.split("/")[:-1]
    return ["/".join(parts[:i]) for i in range(len(parts), -1, -1)]


def _root(code_dir: PathLike) -> Path:
    # Resolved, so that symlink targets compare against the real directory.
    root = Path(os.path.realpath(code_dir))
    if not root.is_dir():
        raise UserError("the trial code directory does not exist or is not a directory",
                        where=str(code_dir), fix="set trialCodeDirectory to the directory of the training code")
    return root


# ---------------------------------------------------------------- size limit


def _check_size(root: Path, files: List[str]) -> None:
    sizes = [(os.lstat(root / rel).st_size, rel) for rel in files]
    total = sum(size for size, _ in sizes)
    if total <= LIMIT_BYTES:
        return
    largest = ", ".join(f"{rel} ({_mb(size)})" for size, rel in sorted(sizes, key=lambda s: (-s[0], s[1]))[:5])
    raise UserError(
        f"the trial context is {_mb(total)} in {len(files)} files, over the {_mb(LIMIT_BYTES)} limit;"
        f" largest: {largest}",
        where=str(root),
        fix=f"list what training does not need, such as data sets and checkpoints, in {IGNORE_FILE} at the top of the"
        " directory, in gitignore syntax, and read data from outside the context",
    )


def _mb(size: int) -> str:
    return f"{size / _MIB:.1f} MB"


# ---------------------------------------------------------------- copying


def _clear(out: Path) -> None:
    # A second copy into the same trial dir (a resumed trial) must not trip
    # over a read-only file or a symlink left by the first.
    if out.is_symlink() or out.is_file():
        out.unlink()


def _add(tar: tarfile.TarFile, root: Path, rel: str) -> None:
    info = tarfile.TarInfo(rel)  # owner 0, mtime 0: deterministic bytes
    st = os.lstat(root / rel)
    if stat.S_ISLNK(st.st_mode):
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, _link_text(root, rel), 0o777
        tar.addfile(info)
        return
    info.size, info.mode = st.st_size, stat.S_IMODE(st.st_mode)
    with open(root / rel, "rb") as src:
        tar.addfile(info, src)
