"""Platforms as the control plane sees them: one module each, loaded by name.

Every platform module offers:
  parse_section(section: dict, where: str) -> its config object (UserError on bad input)
  Platform(config, experiment_dir): submit(spec) -> handle, status(handle) -> PlatformStatus,
      stop(handle, grace) (graceful, SIGTERM path), kill(handle)
Kubernetes platforms also offer render(config, spec) -> list[dict] and, where
NNI's v1 format had the platform, from_v1(v1_config) -> v2 trainingService dict.
A Platform may also offer what the experiment loop uses when present:
  on_end: a callback(handle) it calls the moment a trial ends (else the loop
      finds out from status() every few seconds),
  reattach(handle) -> bool, undelivered_records(handle) -> list[dict]: on
      resume, watch a trial that still runs, or collect what an ended one
      could not deliver (else a trial running at the interruption is submitted again).
"""
from __future__ import annotations

import importlib
from types import ModuleType

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
    key = ALIASES.get(str(name).lower(), str(name).lower())
    if key not in MODULES:
        raise UserError(f"unknown platform {name!r}", where, "use one of: " + ", ".join(sorted(MODULES)))
    return key


def load(name: str) -> ModuleType:
    return importlib.import_module(MODULES[canonical_name(name)])
