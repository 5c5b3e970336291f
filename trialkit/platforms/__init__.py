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
experiment_dir): a dir it cannot take is refused before the experiment starts.
"""
from __future__ import annotations

import importlib
from types import ModuleType

from trialkit import schema
from trialkit.errors import UserError

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


def load(name: str) -> ModuleType:
    return importlib.import_module(MODULES[canonical_name(name)])
