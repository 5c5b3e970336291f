"""Test-wide rules: no process a test started may outlive it.

Every test runs with a fresh TRIALKIT_TEST_TAG in its environment; everything
it starts inherits the tag (subprocess environments are built from
os.environ), even processes that left their group or were orphaned. After the
test, any live process that carries the tag fails the test; it is then killed
by its pid so that one failure does not cascade. Session-wide fixtures that
start long-lived services (a Ray cluster) give them their own tag.
"""
from __future__ import annotations

import os
import signal
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import leftovers  # noqa: E402  (tools/: the same sweep serves the GPU check)

TAG = "TRIALKIT_TEST_TAG"
PYTHON = sys.executable
# Trials run their command on the user's PATH (as NNI's do); the tests' user
# works in the project's environment, as `./bootstrap.sh demo` does.
os.environ["PATH"] = os.path.dirname(PYTHON) + os.pathsep + os.environ.get("PATH", os.defpath)

# A shell without job control (a script's `./bootstrap.sh test &`) starts a background command with SIGINT and
# SIGQUIT ignored, an ignored signal stays ignored across exec, and Python then installs no KeyboardInterrupt
# handler: every process a test starts would shrug off the Ctrl-C the test sends it. Handled again here, so what
# the tests start begins with the default (a handler, unlike SIG_IGN, is reset at exec).
for _signum, _handler in ((signal.SIGINT, signal.default_int_handler), (signal.SIGQUIT, signal.SIG_DFL)):
    if signal.getsignal(_signum) == signal.SIG_IGN:
        signal.signal(_signum, _handler)

# Ray 2.60 turns token authentication on for any cluster started while ~/.ray/auth_token
# exists (a local `ray.init()` anywhere on the machine writes one), and a node or driver
# started before it then cannot join. The tests' clusters are on loopback: no tokens.
os.environ["RAY_AUTH_MODE"] = "disabled"

# The session's one Ray cluster (`ray_cluster`), shared by every Ray test module; the trial images
# (`image`, `torch_image`, built once a session) and the `containers` fixture of the container tests.
pytest_plugins = ["ray_cluster", "containers_util"]

# What a session holds once per worker (pytest-xdist: `./bootstrap.sh test` runs several) and must not hold twice
# at once: the Ray cluster (two nodes, each of 2 CPUs, on a machine that may have 2 in all), and podman's image
# builds and pods (one image cache under ~/.cache/trialkit). Each test that uses one joins its group, and
# `--dist loadgroup` runs a group's tests in one worker, one after another.
WORKER_GROUPS = {"ray": {"ray_cluster"}, "podman": {"image", "torch_image", "user_image", "containers"}}


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups (a worker's hook, called first else)
def pytest_collection_modifyitems(items):
    for item in items:
        uses = set(item.fixturenames)
        groups = [group for group, fixtures in WORKER_GROUPS.items() if uses & fixtures]
        if item.get_closest_marker("containers"):
            groups.append("podman")
        if groups:
            assert len(set(groups)) == 1, f"{item.nodeid} is in groups {sorted(set(groups))}: a test runs in one"
            item.add_marker(pytest.mark.xdist_group(groups[0]))


def tagged_processes(tag: str):
    return leftovers.tagged(TAG, tag)


@pytest.fixture(autouse=True)
def no_process_left(request):
    tag = uuid.uuid4().hex
    old = os.environ.get(TAG)
    os.environ[TAG] = tag
    yield tag
    if old is None:
        del os.environ[TAG]
    else:
        os.environ[TAG] = old
    left = leftovers.end(TAG, tag, 5.0)
    if left:
        pytest.fail("processes left running after the test: " + "; ".join(left))


@pytest.fixture(autouse=True)
def own_home(tmp_path, monkeypatch):
    """Each test its own TRIALKIT_HOME (a module's `home` fixture may name another): the resource pool's
    leases (platforms/pools.py) are per home, and tests run beside each other must not share slots."""
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "trialkit-home"))


@pytest.fixture
def trial_env(tmp_path):
    """An environment for a keeper run in a fresh trial dir."""
    env = dict(os.environ)
    env["TRIALKIT_TRIAL_DIR"] = str(tmp_path / "trial")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def t1_manager(tmp_path):
    """A real manager on loopback over a store on disk that knows trial t1 (token `token-1`)."""
    from trialkit.manager.server import ManagerServer
    from trialkit.manager.store import Store

    store = Store.in_dir(tmp_path / "exp")
    store.create_experiment("exp")
    store.add_trial("exp", "t1", sequence=0, parameters={}, token="token-1")
    manager = ManagerServer(store).start()
    yield manager
    manager.stop()
    store.close()


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """TRIALKIT_HOME (experiments, pools, the page's token) in the test's own tmp_path; its path. A module that
    wants it for every test says `pytestmark = pytest.mark.usefixtures("home")`."""
    monkeypatch.setenv("TRIALKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"

