"""Real containers for the tests marked `containers`: the trial image, podman, and what a run leaves.

Registered as a plugin by conftest.py (one session-wide build): use the
fixtures by name, do not import them (an import makes a second fixture).

- `image` (session fixture): the CPU trial image, built once by images/build.sh
  (cached under ~/.cache/trialkit, keyed by its inputs); `torch_image` the same
  with torch; `user_image` an image made as a user makes their own (their
  base, trialkit installed by pip, scripts/run.sh as the entrypoint, no
  trialkit variable set), on the same Debian base. The tests are skipped, with the reason, where podman, runc or
  debootstrap is missing (`./bootstrap.sh test` installs them).
- `podman(*args)`: images/podman.sh, the project's own podman settings.
- `Containers` (fixture `containers`): starts containers labelled with the
  test's tag, removes them afterwards, and fails the test when any container,
  conmon or container process, overlay or shm mount, or cgroup of them is left.
- `running(config)`, `ended(proc, runner, timeout)`: a background `trialkit run`
  of a test whose pods a pod_runner.PodRunner runs, and its end.
"""
from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import psutil
import pytest

from experiment_util import experiment_id, start_cli

ROOT = Path(__file__).resolve().parent.parent
PODMAN = str(ROOT / "images" / "podman.sh")
LABEL = "trialkit.test"
MISSING = [tool for tool in ("podman", "runc", "debootstrap") if shutil.which(tool) is None]
needs_podman = pytest.mark.skipif(bool(MISSING), reason=f"{', '.join(MISSING)} not installed: "
                                                        "`./bootstrap.sh test` installs them (Debian packages)")


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    done = subprocess.run([PODMAN, *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
    return done


def build(torch: bool = False) -> str:
    """The trial image's name, built by images/build.sh (seconds when its inputs are unchanged)."""
    done = subprocess.run([str(ROOT / "images" / "build.sh"), *(["--torch"] if torch else [])],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def image() -> str:
    if MISSING:
        pytest.skip(f"{', '.join(MISSING)} not installed: `./bootstrap.sh test` installs them")
    return build()


@pytest.fixture(scope="session")
def torch_image() -> str:
    if MISSING:
        pytest.skip(f"{', '.join(MISSING)} not installed: `./bootstrap.sh test` installs them")
    return build(torch=True)


# A user's own image, as docs/images.md describes one: no trialkit variable, nothing of this project's Dockerfiles.
USER_CONTAINERFILE = """FROM {base}
COPY wheels /tmp/wheels
RUN python3 -m venv /venv && /venv/bin/pip install -q --no-index --find-links /tmp/wheels trialkit && rm -rf /tmp/wheels
ENV PATH=/venv/bin:$PATH
COPY run.sh /run.sh
WORKDIR /work
ENTRYPOINT ["/bin/sh", "/run.sh"]
"""


@pytest.fixture(scope="session")
def user_image(tmp_path_factory) -> str:
    if MISSING:
        pytest.skip(f"{', '.join(MISSING)} not installed: `./bootstrap.sh test` installs them")
    base = subprocess.run([str(ROOT / "images" / "build.sh"), "--base"], capture_output=True, text=True, timeout=900)
    assert base.returncode == 0, base.stderr
    context = tmp_path_factory.mktemp("user-image")
    (context / "Containerfile").write_text(USER_CONTAINERFILE.format(base=base.stdout.strip().splitlines()[-1]))
    shutil.copy(ROOT / "scripts" / "run.sh", context / "run.sh")
    pip = [str(ROOT / ".venv" / "bin" / "python"), "-m", "pip"]
    for step in (["wheel", "-q", "--no-deps", "-w", str(context / "wheels"), str(ROOT)],  # trialkit, as pip builds it
                 ["download", "-q", "-c", str(ROOT / "constraints.txt"), "-d", str(context / "wheels"),
                  "psutil", "requests", "PyYAML"]):  # its dependencies, for the offline build
        done = subprocess.run(pip + step, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
    tag = f"localhost/trialkit-user-test:{uuid.uuid4().hex[:12]}"
    podman("build", "-q", "--network", "none", "-f", str(context / "Containerfile"), "-t", tag, str(context),
           timeout=600)
    yield tag
    podman("rmi", "-f", tag, check=False)


class Containers:
    """The containers one test runs, all labelled with its tag."""

    def __init__(self, tag: str):
        self.tag = tag
        self.ids: List[str] = []
        self.rootfs: List[str] = []  # each container's overlay mount point

    def start(self, image: str, *options: str, command: Sequence[str] = (), env: Optional[Dict[str, str]] = None,
              name: str = "") -> str:
        """`podman run -d` and the container's id; the container is kept after it ends, to be inspected."""
        name = name or f"tk-test-{uuid.uuid4().hex[:10]}"
        env_args = [arg for key, value in (env or {}).items() for arg in ("-e", f"{key}={value}")]
        done = podman("run", "-d", "--name", name, "--label", f"{LABEL}={self.tag}", *env_args, *options,
                      image, *command)
        container = done.stdout.strip().splitlines()[-1]
        self.ids.append(container)
        # A container that has already ended (run.sh failing at once) is unmounted: it has no MergedDir.
        merged = self.inspect(container)["GraphDriver"]["Data"].get("MergedDir")
        if merged:
            self.rootfs.append(merged)
        return container

    def wait(self, container: str, timeout: float = 60) -> int:
        """The container's exit code once it has ended."""
        return int(podman("wait", container, timeout=timeout).stdout.strip().splitlines()[-1])

    def run(self, image: str, *options: str, **kwargs) -> int:
        return self.wait(self.start(image, *options, **kwargs))

    def logs(self, container: str) -> str:
        done = podman("logs", container)
        return done.stdout + done.stderr

    def inspect(self, container: str) -> dict:
        return json.loads(podman("inspect", container).stdout)[0]

    def remove_all(self) -> None:
        podman("rm", "-f", "-t", "0", "--filter", f"label={LABEL}={self.tag}", check=False)
        for container in self.ids:
            podman("rm", "-f", "-t", "0", container, check=False)

    def leftovers(self) -> List[str]:
        """What the test's containers left on the host: containers, processes, mounts, cgroups."""
        found = []
        listed = podman("ps", "-a", "-q", "--filter", f"label={LABEL}={self.tag}").stdout.split()
        found += [f"container {c}" for c in listed]
        for proc in psutil.process_iter(["pid", "cmdline"]):
            line = " ".join(proc.info["cmdline"] or [])
            if any(c in line for c in self.ids):
                found.append(f"process {proc.pid} {line[:100]}")
        with open("/proc/self/mountinfo") as mounts:
            for line in mounts:
                point = line.split()[4]
                if any(c in point for c in self.ids) or point in self.rootfs:
                    found.append(f"mount {point}")
        for container in self.ids:
            found += [f"cgroup {path}" for path in Path("/sys/fs/cgroup").glob(f"**/libpod-{container}*")]
        return found


@pytest.fixture
def containers(no_process_left) -> Containers:
    """Containers started for this test; after it, none of them, nor anything of theirs, may be left."""
    box = Containers(no_process_left)
    yield box
    box.remove_all()
    deadline = time.monotonic() + 10
    left = box.leftovers()
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = box.leftovers()
    assert not left, f"left on the host: {left}"


@contextlib.contextmanager
def running(config: Path) -> Iterator[Tuple[subprocess.Popen, str]]:
    """`trialkit run` in the background: (process, the experiment's id); killed on the way out if it still runs."""
    proc = start_cli("run", config)
    try:
        first = proc.stdout.readline()
        if not first:
            proc.wait()
            raise AssertionError(proc.stderr.read())
        yield proc, experiment_id(first)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def ended(proc: subprocess.Popen, runner, timeout: float) -> Tuple[str, str]:
    """The (stdout, stderr) of a `trialkit run` once it has ended; past `timeout` the pods' side (the
    runner's account) as the failure, the run killed."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as late:
        raise AssertionError(f"not done after {timeout} s: {late.output}\n{runner.describe()}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
