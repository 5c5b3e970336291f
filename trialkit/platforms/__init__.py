"""Platforms as the control plane sees them: one module each, loaded by name.

Every platform module offers:
  parse_section(section: dict, where: str) -> its config object (UserError on bad input)
  Platform(config, experiment_dir): a trialkit.platforms.base.Platform, the
      interface the experiment loop drives: submit(spec) -> handle,
      status(handle) -> PlatformStatus, stop(handle, grace) (graceful, SIGTERM
      path), kill(handle), and the optional hooks on_end (called the moment a
      trial ends), on_waiting (a submitted trial held back, and why), reattach
      and undelivered_records (on resume: watch a trial that still runs,
      collect what an ended one could not deliver). Platforms
      inherit base.PlatformBase, whose defaults are what the loop does without
      a hook: a status sweep every few seconds, and a trial running at the
      interruption submitted again.
Kubernetes platforms also offer render(config, spec) -> list[dict] and, where
NNI's v1 format had the platform, from_v1(v1_config) -> v2 trainingService dict.
A platform that copies the trial's code dir (local) offers check_context(code_dir,
experiment_dir, trial_command): a dir it cannot take, or one without the script
the command runs, is refused before the experiment starts; and check_code(code_dir,
trial_command), the part a new experiment's config checks with its other keys.
A platform whose trials run on machines of their own (Kubernetes) offers
shared_dirs(config) -> the paths where every trial sees the same files (PBT's
all_checkpoint_dir goes there: control/config.py's checkpoint_handover); one
whose trials may run elsewhere (Ray) offers trials_see_this_machine(config) ->
bool (where not, a search that hands one trial's checkpoint to another needs
an object store of checkpoints).
"""
from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from trialkit import schema
from trialkit.errors import UserError

if TYPE_CHECKING:
    from trialkit.platforms.base import Platform

MODULES = {
    "local": "trialkit.platforms.local",
    "kubeflow": "trialkit.platforms.kubernetes.kubeflow",
    "frameworkcontroller": "trialkit.platforms.kubernetes.frameworkcontroller",
    "adaptdl": "trialkit.platforms.kubernetes.adaptdljob",
    "ray": "trialkit.platforms.ray",
}
ALIASES = {"adl": "adaptdl"}


def canonical_name(name: str, where: str = "trainingService.platform") -> str:
    key = ALIASES.get(name.lower(), name.lower()) if isinstance(name, str) else None
    if key not in MODULES:
        raise UserError(f"unknown platform {schema.show(name)}", where, "use one of: " + ", ".join(sorted(MODULES)))
    return key


# The engine package each platform drives, and trialkit's extra that installs it; the demo installs neither.
ENGINES = {"kubeflow": "kubernetes", "frameworkcontroller": "kubernetes", "adaptdl": "kubernetes", "ray": "ray"}


def load(name: str) -> ModuleType:
    return importlib.import_module(MODULES[canonical_name(name)])


def create(platform: str, training_service: object, experiment_dir: Path) -> Platform:
    """The experiment's platform (its config's trainingService as parsed), ready to be driven; UserError when
    its engine package is not installed (a cluster's client or Ray: the modules import them only when they
    first talk to it, so without this a first call would end in a traceback)."""
    name = canonical_name(platform)
    engine = ENGINES.get(name)
    if engine is not None and importlib.util.find_spec(engine) is None:
        raise UserError(f"the {name} platform needs the {engine!r} package, which is not installed here",
                        "trainingService.platform",
                        f"install trialkit's {engine} extra: pip install 'trialkit[{engine}]', or "
                        f".venv/bin/pip install -e '.[{engine}]' in a checkout")
    return load(name).Platform(training_service, experiment_dir)
