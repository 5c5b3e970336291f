"""Trial classes: training code as a class, run in every worker by `--trial`.

    # model_def.py                       python -m trialkit.launch.torch_distributed \\
    import trialkit                          --trial model_def:MyTrial
    class MyTrial(trialkit.Trial):
        def run(self):
            lr = self.parameters["lr"]
            for epoch in range(10):
                ...
                trialkit.report_intermediate_result(accuracy)
                if self.should_stop():
                    return None          # save() follows, then exit 143
            return accuracy              # the final result
        def save(self, directory): ...   # optional: checkpoint on a stop
        def load(self, directory): ...   # optional: resume from a checkpoint

TRIAL is `package.module:Class` (imported from the working directory and
sys.path) or `path/to/file.py:Class` (its directory joins sys.path, so its
sibling modules import). Mistakes in naming it are one-line UserErrors; an
error inside the user's module is theirs and keeps its traceback.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import signal
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple, Type

from trialkit import env
from trialkit.errors import UserError

FORMAT_HINT = "write package.module:Class or path/to/file.py:Class"


class Trial:
    """Subclass it; trialkit builds it with the trial's parameters and calls run() in every worker."""

    def __init__(self, parameters: Dict[str, Any]):
        self.parameters = parameters
        self.rank = env.read().rank  # RANK, HOROVOD_RANK, ... whichever the engine set

    def run(self) -> Any:
        """Train. Return the final metric (a number or a dict with "default"), or None."""
        raise NotImplementedError(f"{type(self).__name__} must define run()")

    def save(self, directory: Path) -> None:
        """Write a checkpoint into `directory` (every rank calls it: write per-rank files,
        or only on rank 0 when the ranks hold the same state). Optional."""

    def load(self, directory: Path) -> None:
        """Restore from the checkpoint in `directory`. Optional."""

    def should_stop(self) -> bool:
        """True once a stop was asked (SIGTERM/SIGINT here, or the keeper's stop): save and return."""
        if _stop_signals:
            return True
        from trialkit.sdk import session

        return session().should_preempt()


def defines(cls: Type[Trial], method: str) -> bool:
    """Whether a trial class has its own `method` (save, load) rather than the base's."""
    return getattr(cls, method) is not getattr(Trial, method)


_stop_signals: List[int] = []  # what catch_stop_signals() caught


def catch_stop_signals() -> None:
    """Turn SIGTERM/SIGINT into should_stop() instead of death: for trials that can save."""
    def note(signum, frame) -> None:
        _stop_signals.append(signum)

    signal.signal(signal.SIGTERM, note)
    signal.signal(signal.SIGINT, note)


def split_spec(spec: str) -> Tuple[str, str]:
    """`where:Class` -> (where, Class); a UserError when it has another shape."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise UserError(f"{spec!r} does not name a class", "--trial", FORMAT_HINT)
    return where, name


def check_spec(spec: str) -> None:
    """The file or module and its class found, without running the user's code (the launcher stays light
    and no engine starts for a name that is not there): the source is read, not imported."""
    where, name = split_spec(spec)
    if where.endswith(".py"):
        if not os.path.isfile(where):
            raise UserError(f"no file {where}", "--trial", f"check the path, relative to {os.getcwd()}")
        source: Optional[str] = where
    elif not all(part.isidentifier() for part in where.split(".")):
        raise UserError(f"{where!r} is not a module name", "--trial", FORMAT_HINT)
    else:
        source = _module_source(where)
    problem = _not_a_trial(source, name) if source is not None else None
    if problem == "missing":
        raise UserError(f"{where} has no class {name}", "--trial", "check the class name")
    if problem is not None:
        raise UserError(f"{where}:{name} is {problem}, not a trialkit.Trial", "--trial",
                        "subclass trialkit.Trial and define its run method")


def _module_source(name: str) -> Optional[str]:
    """The .py file of module `name` (its packages are imported, the module is not); None when not Python source."""
    _cwd_on_path()
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError as err:
        spec, name = None, err.name or name
    except (ImportError, ValueError):
        return None  # a package that fails to import: the import in the worker says why
    if spec is None:
        raise UserError(f"no module named {name}", "--trial", f"run from the directory that holds it, or {FORMAT_HINT}")
    return spec.origin if spec.origin and spec.origin.endswith(".py") else None


_LITERALS = (ast.Constant, ast.List, ast.Dict, ast.Tuple, ast.Set, ast.JoinedStr, ast.ListComp, ast.DictComp)


def _not_a_trial(path: str, name: str) -> Optional[str]:
    """What the file's top level makes `name` when that cannot be a Trial class: "missing", "a function", "a class
    that subclasses nothing", "a value"; None when it may be one (or the source cannot tell)."""
    names = module_names(path)
    if names is None:
        return None
    kinds = names.get(name, set())
    if None in kinds:
        return None
    if not kinds:
        return "missing"
    return kinds.pop() if len(kinds) == 1 else None


def module_names(path: str) -> Optional[Dict[str, Set[Optional[str]]]]:
    """The names the top level of the Python file at `path` binds, in any way (a def, an assignment, an import, a
    loop or `with` target, under a guard or not), read from its source and never imported (the control plane
    runs no user code): each with what its bindings make it ("a function", "a class that subclasses nothing", "a
    value"; None: what may be a Trial class, or the source cannot tell). None when the source cannot tell which
    names it binds: unreadable, not Python, a star import, a module-level __getattr__, a `global` statement."""
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError, RecursionError):
        return None  # importing it will say what is wrong
    if any(isinstance(node, ast.Global) for node in ast.walk(tree)):
        return None
    names: Dict[str, Set[Optional[str]]] = {}
    nodes: List[ast.AST] = list(tree.body)
    while nodes:
        node = nodes.pop()
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name == "__getattr__":
                return None
            kind = _class_kind(node) if isinstance(node, ast.ClassDef) else "a function"
            names.setdefault(node.name, set()).add(kind)
            nodes.extend(node.decorator_list)  # its body is a scope of its own
            continue
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            kind = "a value" if isinstance(node.value, _LITERALS) and len(targets) == 1 else None
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Name):
                        names.setdefault(sub.id, set()).add(kind)
            nodes.extend(ast.iter_child_nodes(node.value) if node.value is not None else ())
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.setdefault(alias.asname or alias.name.split(".")[0], set()).add(None)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):  # for, with, :=, ...
            names.setdefault(node.id, set()).add(None)
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            names.setdefault(node.name, set()).add(None)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.setdefault(node.rest, set()).add(None)
        if not isinstance(node, ast.Lambda):  # a lambda's body is a scope of its own
            nodes.extend(ast.iter_child_nodes(node))
    return names


def _class_kind(node: ast.ClassDef) -> Optional[str]:
    """None for a class that may subclass Trial (it has a base other than object)."""
    bases = [b for b in node.bases if not (isinstance(b, ast.Name) and b.id == "object")]
    return None if bases or node.keywords else "a class that subclasses nothing"


def _cwd_on_path() -> None:
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def load(spec: str) -> Type[Trial]:
    """Import the module or file and return its Trial subclass."""
    check_spec(spec)
    where, name = split_spec(spec)
    module = _import_file(where) if where.endswith(".py") else _import_module(where)
    cls = getattr(module, name, None)
    if cls is None:
        raise UserError(f"{where} has no class {name}", "--trial", "check the class name")
    if not (isinstance(cls, type) and issubclass(cls, Trial)):
        raise UserError(f"{where}:{name} is not a trialkit.Trial", "--trial",
                        "subclass trialkit.Trial and define its run method")
    return cls


def _import_module(name: str):
    _cwd_on_path()
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        # Only the module the user named (or a package on its path) is their
        # naming mistake; a missing import inside it keeps its traceback.
        if err.name and (name == err.name or name.startswith(err.name + ".")):
            raise UserError(f"no module named {err.name}", "--trial",
                            f"run from the directory that holds it, or {FORMAT_HINT}") from None
        raise


def _import_file(path: str):
    path = os.path.abspath(path)
    directory, filename = os.path.split(path)
    if directory not in sys.path:
        sys.path.insert(0, directory)  # so that the file's sibling modules import
    module_name = os.path.splitext(filename)[0]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise UserError(f"cannot load {path} as Python", "--trial", FORMAT_HINT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
