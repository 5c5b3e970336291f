"""The trial context: what `collect` takes, checked against git's own ignore rules.

Each ignore case builds the same tree twice, once with `.trialignore` files for
trialkit and once with `.gitignore` files for `git ls-files --others
--exclude-standard`, and asserts that both keep the same files.
"""
from __future__ import annotations

import io
import os
import stat
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from experiment_util import cli
from trialkit.errors import UserError
from trialkit.platforms.context import IGNORE_FILE, LIMIT_BYTES, collect, copy_into, pack, unpack

Files = List[str]
Ignores = Dict[str, List[str]]  # directory ("" is the top) -> lines of its ignore file


def build(root: Path, files: Files, ignores: Ignores, ignore_name: str) -> None:
    for rel in files:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"content of {rel}\n")
    for rel_dir, lines in ignores.items():
        path = root / rel_dir / ignore_name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(line + "\n" for line in lines))


def git_keeps(root: Path) -> Set[str]:
    """The files git would offer to add: untracked and not ignored."""
    # No user's or system's config (an excludesFile) may leak in.
    env = {**os.environ, "HOME": str(root), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    git = ["git", "-C", str(root), "-c", f"core.excludesFile={os.devnull}"]
    subprocess.run([*git, "init", "-q", "--template="], env=env, check=True)
    out = subprocess.run([*git, "ls-files", "--others", "--exclude-standard", "-z"],
                         env=env, check=True, capture_output=True).stdout
    return {name.decode() for name in out.split(b"\0") if name}


def both(files: Files, ignores: Ignores) -> Tuple[Set[str], Set[str]]:
    """(collect's set, git's set) for the same tree, ignore files named the same."""
    with tempfile.TemporaryDirectory() as ours, tempfile.TemporaryDirectory() as theirs:
        build(Path(ours), files, ignores, IGNORE_FILE)
        build(Path(theirs), files, ignores, ".gitignore")
        git = {rel.replace(".gitignore", IGNORE_FILE) for rel in git_keeps(Path(theirs))}
        return set(collect(ours)), git


def ignore_files(ignores: Ignores) -> Set[str]:
    return {f"{d}/{IGNORE_FILE}" if d else IGNORE_FILE for d in ignores}


# ---------------------------------------------------------------- .trialignore against git

CASES = {
    "negation": (
        ["a.log", "keep.log", "sub/keep.log", "sub/b.log", "main.py"],
        {"": ["*.log", "!keep.log"]},
        {"a.log", "sub/b.log"},
    ),
    "negation cannot reach into an ignored directory": (
        ["logs/a.log", "logs/keep.log", "main.py"],
        {"": ["logs/", "!logs/keep.log"]},
        {"logs/a.log", "logs/keep.log"},
    ),
    "trailing slash matches directories only": (
        ["data/x", "sub/data/y", "other/data", "main.py"],
        {"": ["data/"]},
        {"data/x", "sub/data/y"},
    ),
    "double star": (
        ["cache/1", "deep/er/cache/2", "a/z.txt", "a/b/c/z.txt", "b/a/z.txt", "runs/1/2", "runs.txt"],
        {"": ["**/cache", "a/**/z.txt", "runs/**"]},
        {"cache/1", "deep/er/cache/2", "a/z.txt", "a/b/c/z.txt", "runs/1/2"},
    ),
    "leading slash anchors": (
        ["build/o", "src/build/o", "build.py"],
        {"": ["/build"]},
        {"build/o"},
    ),
    "middle slash anchors": (
        ["doc/a.md", "x/doc/a.md", "doc/sub/b.md"],
        {"": ["doc/*.md"]},
        {"doc/a.md"},
    ),
    "comments and blank lines": (
        ["# comment", "x.tmp", "y.py"],
        {"": ["# comment", "", "*.tmp", ""]},
        {"x.tmp"},
    ),
    "escaped hash and bang": (
        ["#notes", "!bang", "notes", "bang"],
        {"": ["\\#notes", "\\!bang"]},
        {"#notes", "!bang"},
    ),
    "nested ignore files override the top one": (
        ["a.bin", "keep.bin", "sub/keep.bin", "sub/x.bin", "sub/local.txt", "sub/deep/local.txt", "local.txt"],
        {"": ["*.bin"], "sub": ["!keep.bin", "/local.txt"]},
        {"a.bin", "keep.bin", "sub/x.bin", "sub/local.txt"},
    ),
    "re-include a directory's child with dir/*": (
        ["out/a", "out/keep/b", "out/keep/c"],
        {"": ["/out/*", "!/out/keep/"]},
        {"out/a"},
    ),
}


@pytest.mark.parametrize("files, ignores, dropped", CASES.values(), ids=list(CASES))
def test_trialignore_agrees_with_git(files, ignores, dropped):
    ours, git = both(files, ignores)
    assert ours == git
    assert ours == (set(files) | ignore_files(ignores)) - dropped


NAMES = ["a", "b", "data", "keep.log", "x.log", "y.py", "#z"]
SEGMENTS = ["a", "b", "data", "*", "**", "*.log", "keep.log", "?", "[ab]", "\\#z", "x*"]


rule_line = st.one_of(
    st.builds(
        lambda bang, lead, segs, trail: bang + lead + "/".join(segs) + trail,
        st.sampled_from(["", "!"]),
        st.sampled_from(["", "/"]),
        st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=3),
        st.sampled_from(["", "/"]),
    ),
    st.just("# a comment"),
    st.just(""),
)


@st.composite
def contexts(draw) -> Tuple[Files, Ignores]:
    """A small tree of files, and ignore files in some of its directories."""
    paths = draw(st.lists(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3), min_size=1, max_size=12))
    files: Set[str] = set()
    dirs: Set[str] = {""}
    for parts in paths:
        rel = "/".join(parts)
        parents = {"/".join(parts[:i]) for i in range(1, len(parts))}
        # One name cannot be both a file and a directory.
        if rel in dirs or parents & files:
            continue
        files.add(rel)
        dirs |= parents
    ignores = draw(st.dictionaries(st.sampled_from(sorted(dirs)), st.lists(rule_line, max_size=6), max_size=3))
    return sorted(files), ignores


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(context=contexts())
def test_random_trialignore_agrees_with_git(context):
    ours, git = both(*context)
    assert ours == git


# ---------------------------------------------------------------- what is always out, always in


def test_defaults_are_always_out_even_when_unignored(tmp_path):
    build(tmp_path, ["m.py", "m.pyc", "m.pyo", "__pycache__/m.cpython-311.pyc", "sub/__pycache__/x",
                     ".git/HEAD", "sub/.git/config"], {"": ["!*.pyc", "!__pycache__/", "!.git/"]}, IGNORE_FILE)
    assert collect(tmp_path) == [IGNORE_FILE, "m.py"]


def test_startup_hook_at_the_top_is_kept_whatever_the_rules(tmp_path):
    build(tmp_path, ["startup-hook.sh", "sub/startup-hook.sh", "run.sh"], {"": ["*.sh"]}, IGNORE_FILE)
    assert collect(tmp_path) == [IGNORE_FILE, "startup-hook.sh"]


def test_missing_code_dir_is_a_user_error(tmp_path):
    with pytest.raises(UserError) as err:
        collect(tmp_path / "nope")
    assert str(tmp_path / "nope") in err.value.line()


def test_fifos_are_not_taken(tmp_path):
    build(tmp_path, ["train.py"], {}, IGNORE_FILE)
    os.mkfifo(tmp_path / "pipe")
    assert collect(tmp_path) == ["train.py"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
def test_unreadable_directory_is_an_error_not_a_silent_gap(tmp_path):
    build(tmp_path, ["train.py", "lib/util.py"], {}, IGNORE_FILE)
    (tmp_path / "lib").chmod(0)
    try:
        with pytest.raises(PermissionError):
            collect(tmp_path)
    finally:
        (tmp_path / "lib").chmod(0o755)


# ---------------------------------------------------------------- size limit


def sparse(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)  # a hole: the size without the disk or the time


def test_over_the_limit_is_refused_naming_the_largest_files(tmp_path):
    mib = 1024 * 1024
    sizes = {"data/big.bin": 60, "data/mid.bin": 20, "w1.pt": 9, "w2.pt": 8, "w3.pt": 7, "tiny.pt": 1}
    for rel, size in sizes.items():
        sparse(tmp_path / rel, size * mib)
    (tmp_path / "train.py").write_text("print('hi')\n")
    with pytest.raises(UserError) as err:
        collect(tmp_path)
    line = err.value.line()
    assert "\n" not in line
    assert "105.0 MB" in line and "95.0 MB" in line
    assert "data/big.bin (60.0 MB), data/mid.bin (20.0 MB), w1.pt (9.0 MB), w2.pt (8.0 MB), w3.pt (7.0 MB)" in line
    assert "tiny.pt" not in line
    assert IGNORE_FILE in line

    (tmp_path / IGNORE_FILE).write_text("data/\n")
    assert "train.py" in collect(tmp_path)  # the suggested fix works


def test_exactly_the_limit_is_accepted(tmp_path):
    sparse(tmp_path / "weights.pt", LIMIT_BYTES)
    assert collect(tmp_path) == ["weights.pt"]


def test_ignored_files_do_not_count(tmp_path):
    sparse(tmp_path / "data/huge.bin", 2 * LIMIT_BYTES)
    (tmp_path / IGNORE_FILE).write_text("*.bin\n")
    assert collect(tmp_path) == [IGNORE_FILE]


# ---------------------------------------------------------------- symlinks


@pytest.fixture
def linked(tmp_path) -> Path:
    """A context with symlinks of every kind, and a secret beside it."""
    outside = tmp_path / "secret.txt"
    outside.write_text("not for the trial\n")
    root = tmp_path / "code"
    build(root, ["train.py", "lib/util.py", "data/big.bin"], {"": ["data/"]}, IGNORE_FILE)
    links = {
        "to_file": "train.py",                 # inside, to a file: kept
        "lib/to_file_up": "../train.py",       # inside, relative through ..: kept
        "to_dir": str(root / "lib"),           # inside, absolute, to a directory: kept, made relative
        "to_outside": str(outside),            # outside: skipped
        "to_outside_dir": str(tmp_path),       # outside, a directory: skipped, not entered
        "to_ignored": "data/big.bin",          # to something ignored: skipped
        "dangling": "nowhere.py",              # dangling: skipped
        "lib/to_top": "..",                    # a loop: skipped
    }
    for rel, target in links.items():
        os.symlink(target, root / rel)
    return root


def test_symlinks_inside_are_kept_and_outside_skipped(linked):
    assert collect(linked) == [IGNORE_FILE, "lib/to_file_up", "lib/util.py", "to_dir", "to_file", "train.py"]


def test_copied_symlinks_point_into_the_copy(linked, tmp_path):
    dest = copy_into(linked, tmp_path / "trial")
    assert os.readlink(dest / "to_dir") == "lib"
    assert os.readlink(dest / "lib/to_file_up") == "../train.py"
    assert (dest / "to_dir/util.py").read_text() == "content of lib/util.py\n"
    assert not (dest / "to_outside").exists() and not (dest / "to_outside").is_symlink()


def test_symlinks_survive_pack_and_unpack(linked, tmp_path):
    dest = unpack(pack(linked), tmp_path / "unpacked")
    assert os.readlink(dest / "to_file") == "train.py"
    assert os.readlink(dest / "to_dir") == "lib"
    assert (dest / "lib/to_file_up").read_text() == "content of train.py\n"


# ---------------------------------------------------------------- copy_into, pack, unpack


MODES = {
    "run.sh": 0o755, "train.py": 0o644, "secret.key": 0o600, "tool": 0o700, "ro.cfg": 0o444, "sub/deep/x.bin": 0o640,
}


@pytest.fixture
def moded(tmp_path) -> Path:
    root = tmp_path / "code"
    for rel, mode in MODES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(3000) + rel.encode())
        path.chmod(mode)
    return root


def tree_of(root: Path) -> Dict[str, tuple]:
    """Every file's (bytes, permission bits), by relative path."""
    return {
        p.relative_to(root).as_posix(): (p.read_bytes(), stat.S_IMODE(p.lstat().st_mode))
        for p in root.rglob("*") if p.is_file() and not p.is_symlink()
    }


def test_copy_into_preserves_bytes_and_modes_and_can_run_twice(moded, tmp_path):
    dest = tmp_path / "trial"
    assert copy_into(moded, dest) == dest
    assert tree_of(dest) == tree_of(moded)
    copy_into(moded, dest)  # a resumed trial copies again, over read-only files
    assert tree_of(dest) == tree_of(moded)


def test_pack_round_trip_preserves_bytes_and_modes(moded, tmp_path):
    dest = unpack(pack(moded), tmp_path / "unpacked")
    # tarfile's "data" filter gives the owner write (ro.cfg: 0o444 -> 0o644); all else is kept.
    assert tree_of(dest) == {rel: (data, mode | 0o200) for rel, (data, mode) in tree_of(moded).items()}


def test_pack_is_deterministic(moded, tmp_path):
    first = pack(moded)
    os.utime(moded / "train.py", (0, 1_000_000))  # times are not part of the package
    assert pack(moded) == first


def test_unpack_refuses_members_that_escape(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escaped")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(tarfile.FilterError):
        unpack(buf.getvalue(), tmp_path / "dest")
    assert not (tmp_path / "escaped").exists()


def test_a_determined_detignore_is_read_and_a_trialignore_overrides_it(tmp_path):
    # Determined users bring a .detignore: it drops files as a .trialignore would,
    # and the .trialignore beside it has the last word.
    build(tmp_path, ["train.py", "data/big.bin", "notes.txt", "keep.log", "other.log"],
          {"": ["data/", "*.log", "notes.txt"]}, ".detignore")
    assert set(collect(tmp_path)) == {"train.py", ".detignore"}
    (tmp_path / IGNORE_FILE).write_text("!keep.log\n")
    assert set(collect(tmp_path)) == {"train.py", ".detignore", IGNORE_FILE, "keep.log"}


@pytest.mark.parametrize("line, shown", [("!", "'!'"), ("data\\", "'data\\'"), ("[z-a]", "'[z-a]'"),
                                         ("a\x1bb\\", "'a\\x1bb\\\\'")])  # as written; a control character escaped
@pytest.mark.parametrize("ignore_name, rel_dir", [(".detignore", ""), (IGNORE_FILE, "sub")])
def test_an_ignore_line_gitignore_rejects_is_one_line_naming_the_file_and_line(tmp_path, line, shown, ignore_name,
                                                                                rel_dir):
    build(tmp_path, ["train.py", "sub/x.py"], {rel_dir: ["# a comment", "*.log", line]}, ignore_name)
    with pytest.raises(UserError) as caught:
        collect(tmp_path)
    assert caught.value.where == f"{tmp_path / rel_dir / ignore_name}:3", caught.value.line()
    assert caught.value.what.startswith(f"{shown} is not a pattern gitignore takes"), caught.value.line()


def test_a_determined_run_with_a_bad_detignore_line_stops_before_any_trial(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('trained')\n")
    (code / ".detignore").write_text("*.log\n[z-a]\n")
    (code / "exp.yaml").write_text("entrypoint: python3 train.py\nsearcher: {name: single, metric: loss}\n")
    done = cli("run", code / "exp.yaml", code, env={**os.environ, "TRIALKIT_HOME": str(tmp_path / "home")})
    assert (done.returncode, done.stdout) == (2, ""), done.stdout + done.stderr
    assert done.stderr == f"trialkit: error: {code / '.detignore'}:2: '[z-a]' is not a pattern gitignore takes " \
                          "(bad character range z-a) (fix the line or remove it)\n"
