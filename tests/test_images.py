"""The trial images, checked statically: no Docker engine runs here.

What a build would trip on or a pod would depend on: every file a COPY takes
exists in the build context (the repository root), the entrypoint is run.sh
at the path the Kubernetes platforms run, the user is not root, and the base
images and the packages installed by name are pinned.
"""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from trialkit.platforms.kubernetes import render as k8s

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILES = sorted((ROOT / "images").glob("Dockerfile.*"))


def instructions(path: Path):
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            yield word.upper(), rest.strip()


def test_there_is_a_cpu_and_a_gpu_image():
    assert [p.name for p in DOCKERFILES] == ["Dockerfile.cpu", "Dockerfile.gpu"]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_copied_files_exist_in_the_build_context(path):
    copies = [shlex.split(args) for word, args in instructions(path) if word == "COPY"]
    assert copies
    for words in copies:
        sources = [w for w in words if not w.startswith("--")][:-1]
        for source in sources:
            if any(char in source for char in "*?["):
                continue  # a pattern takes what the context has: the offline build's wheels/, or nothing
            assert (ROOT / source).exists(), f"{path.name}: COPY {source}: no such file"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_entrypoint_is_run_sh_where_the_platforms_run_it(path):
    steps = list(instructions(path))
    entrypoints = [json.loads(args) for word, args in steps if word == "ENTRYPOINT"]
    assert entrypoints == [k8s.RUN_COMMAND]  # exec form: the keeper gets signals as PID 1
    # run.sh and cleanup.sh are copied to that directory.
    copied = [shlex.split(args) for word, args in steps if word == "COPY" and "scripts/run.sh" in args]
    assert copied and copied[0][-1].rstrip("/") == k8s.SCRIPTS_DIR and "scripts/cleanup.sh" in copied[0]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_runs_as_a_non_root_user(path):
    users = [args for word, args in instructions(path) if word == "USER"]
    assert users, "no USER: the image would run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_versions_are_pinned(path):
    steps = list(instructions(path))
    defaults = dict(args.split("=", 1) for word, args in steps if word == "ARG" and "=" in args)
    for word, args in steps:
        if word == "FROM":
            image = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], args.split()[0])
            tag = image.rpartition(":")[2]
            assert ":" in image and tag != "latest" and re.search(r"\d+\.\d+", tag), f"unpinned base image {image}"
        if word == "RUN" and "pip install" in args:
            for command in re.split(r"&&|;", args):
                if "pip install" not in command:
                    continue
                words = shlex.split(command.split("pip install", 1)[1])
                skip_next = False
                for item in words:
                    if skip_next:
                        skip_next = False
                        continue
                    if item in ("-c", "--index-url"):
                        skip_next = True
                        continue
                    if item.startswith("-") or item.startswith("/") or item.startswith('"$') or item.startswith("$"):
                        continue  # options, local paths, a wheel built in the step
                    assert re.search(r"(==|<)", item), f"{path.name}: unpinned package {item!r}"
