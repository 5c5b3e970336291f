"""The Python API, NNI 3.0's `nni.experiment.Experiment` member for member:

    from trialkit.experiment import Experiment
    exp = Experiment('local')
    exp.config.search_space = {"lr": {"_type": "loguniform", "_value": [1e-4, 1e-1]}}
    exp.config.trial_command = "python3 train.py"
    exp.config.trial_code_directory = Path(__file__).parent
    exp.config.tuner.name = "TPE"
    exp.config.tuner.class_args["optimize_mode"] = "maximize"
    exp.config.max_trial_number = 10
    exp.config.trial_concurrency = 2
    exp.run(8080)                  # True when it ended DONE or STOPPED
    exp.export_data()              # [TrialResult(parameter, value, trialJobId), ...]
    exp.stop()

`exp.config` is a draft: `validate()` turns it into the same ExperimentConfig a
YAML file gives, through the same checks (relative paths against the current
directory). `start()` runs the experiment as `trialkit run --detach` does: a
manager process of its own (output in the experiment's manager.log) that
outlives this program only in `RunMode.Detach`. The getters read the
experiment's store, so they answer while it runs and after it ended; the
updates and `kill_trial_job` go to the running manager's admin routes.
"""
from __future__ import annotations

import atexit
import copy
import enum
import os
import signal
import subprocess
import time
from contextlib import closing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import psutil

from trialkit import process, records, schema
from trialkit.control import admin, background
from trialkit.control.config import V2_KEYS, parse_config
from trialkit.control.config import ExperimentConfig as ParsedConfig  # NNI's ExperimentConfig is the draft's (below)
from trialkit.control.results import experiment_ran, trial_rows
from trialkit.errors import UserError
from trialkit.manager import paths
from trialkit.manager.store import Store
from trialkit.statuses import FINAL_STATUSES

START_WAIT = 60.0  # how long start() waits for the manager to listen
ENDING_WAIT = 30.0  # stop(): how long a manager whose server closed may take to exit


class ConfigBag:
    """Keys as attributes (or items). Reading a key that is not there makes an
    empty bag, so `ts.storage.server = ...` works without a config class;
    empty bags are left out of to_dict()."""

    def __init__(self, **items: Any):
        object.__setattr__(self, "_items", dict(items))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and friends probe these
            raise AttributeError(name)
        return self._items.setdefault(name, ConfigBag())

    def __setattr__(self, name: str, value: Any) -> None:
        self._items[name] = value

    def __getitem__(self, name: str) -> Any:
        return self._items[name]

    def __setitem__(self, name: str, value: Any) -> None:
        self._items[name] = value

    def __repr__(self) -> str:
        return f"ConfigBag({self.to_dict()!r})"

    def to_dict(self) -> Dict[str, Any]:
        return {k: _plain(v) for k, v in self._items.items() if not _empty(v)}


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, ConfigBag) and not value.to_dict())


def _plain(value: Any) -> Any:
    if isinstance(value, (dict, list, tuple)):
        # A program may hand a value that holds itself or nests without bound: the config files' check first,
        # so that is one line, not a RecursionError here.
        schema.check_shape(value, "Experiment.config")
    return _copy(value)


def _copy(value: Any) -> Any:
    if isinstance(value, ConfigBag):
        return value.to_dict()
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_copy(v) for v in value]
    if isinstance(value, os.PathLike):  # NNI takes a Path wherever it takes a path
        return os.fspath(value)
    return copy.deepcopy(value)


class ExperimentDraft:
    """`exp.config`: the v2 keys as snake_case attributes, None until set."""

    def __init__(self, platform: str):
        for key in V2_KEYS:
            setattr(self, _snake(key), None)
        self.tuner = ConfigBag(name=None, class_args={})
        self.assessor = ConfigBag(name=None, class_args={})
        self.training_service = ConfigBag(platform=platform)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "ExperimentDraft":
        """The draft of a v2 config dict (a stored experiment's)."""
        draft = cls(data["trainingService"]["platform"])
        for key, value in data.items():
            if key in ("tuner", "assessor", "trainingService"):
                value = ConfigBag(**{_snake(k): copy.deepcopy(v) for k, v in value.items()})
            setattr(draft, _snake(key), value)
        return draft

    def __getattr__(self, name: str) -> Any:
        # Only reached for names never set: a typo when reading.
        near = schema.suggest(name, list(vars(self)))
        raise AttributeError(f"experiment config has no {name!r}" + (f"; did you mean {near!r}?" if near else ""))

    def to_dict(self) -> Dict[str, Any]:
        """The v2 config this draft describes; unset keys and nameless algorithms left out."""
        return self._translated()[0]

    def _translated(self) -> Tuple[Dict[str, Any], List[str]]:
        """to_dict(), and a note on each of NNI 2.x's shapes it took in (_nni2_shapes)."""
        out = {}
        for key, value in vars(self).items():
            if isinstance(value, ConfigBag) and key in ("tuner", "assessor") and value.to_dict().get("name") is None:
                continue
            if not _empty(value):
                out[key] = _plain(value)
        return out, _nni2_shapes(out)

    def validate(self, base_dir: Optional[str] = None) -> ParsedConfig:
        """The config, its notes (what trialkit takes differently from NNI) with it. The command's script is
        checked with the other keys (parse_config's check_code, as `trialkit run` does): one refusal lists a
        misspelt script with the config's other mistakes."""
        data, notes = self._translated()
        config = parse_config(data, base_dir or os.getcwd(), source="Experiment.config", check_code=True)
        return replace(config, notes=tuple(notes) + config.notes)


def _snake(key: str) -> str:
    return "".join("_" + ch.lower() if ch.isupper() else ch for ch in key)


KUBEFLOW_ROLES = ("master", "worker", "ps")
NNI_DEFAULT_IMAGE = "msranni/nni:latest"  # NNI's KubeflowRoleConfig.docker_image when a role names none


def _nni2_shapes(config: Dict[str, Any]) -> List[str]:
    """Take in, as NNI 2.x's Kubeflow docs write them, what trialkit's Kubeflow section keeps elsewhere: the
    operator and its API version set on the experiment's config, and a role with no image (NNI's default)."""
    service = config.get("training_service")
    if not isinstance(service, dict) or service.get("platform") != "kubeflow":
        return []
    notes = []
    folded = {schema.fold(key) for key in service if isinstance(key, str)}
    lifted = [key for key in ("operator", "api_version") if key in config and schema.fold(key) not in folded]
    for key in lifted:
        service[key] = config.pop(key)
    if lifted:
        notes.append(f"{' and '.join(lifted)} on the experiment's config (NNI 2.x's place) are the training "
                     "service's" + _version_note(service.get("api_version")))
    if not folded & {"dockerimage", "image"}:  # no image for every role
        for role in KUBEFLOW_ROLES:
            section = service.get(role)
            if isinstance(section, dict) and not {schema.fold(k) for k in section} & {"dockerimage", "image"}:
                section["docker_image"] = NNI_DEFAULT_IMAGE
                notes.append(f"training_service.{role} has no docker_image: it runs NNI's default, "
                             f"{NNI_DEFAULT_IMAGE} (trialkit's trial side is fetched into it as it starts)")
    return notes


def _version_note(api_version: Any) -> str:
    if api_version in (None, "v1"):
        return ""
    return f"; api_version {api_version}: the job is rendered as kubeflow.org/v1, the one version training-operator serves"


# -- NNI 3.0's config classes (nni.experiment), for the platforms trialkit has ---------------
# Each is a bag of its keyword arguments (snake_case or camelCase, as NNI takes them) with
# the key that names its kind set; the checks are the config parser's, when the experiment
# starts or validate() runs, exactly as for a YAML file.


class ExperimentConfig(ExperimentDraft):
    """NNI's: `ExperimentConfig('local')`, or `ExperimentConfig(training_service=LocalConfig(), ...)`."""

    def __init__(self, training_service_platform: Optional[str] = None, **kwargs: Any):
        service = kwargs.pop("training_service", None)
        platform = training_service_platform or (service.platform if isinstance(service, ConfigBag) else None)
        super().__init__(platform or "local")
        if service is not None:
            self.training_service = service
        for key, value in kwargs.items():
            setattr(self, _snake(key), value)


class _Kind(ConfigBag):
    FIXED: Dict[str, Any] = {}

    def __init__(self, **items: Any):
        super().__init__(**{**self.FIXED, **items})


class AlgorithmConfig(_Kind):
    """A tuner or assessor: name=..., class_args={...}."""


class CustomAlgorithmConfig(_Kind):
    """A tuner or assessor of the user's: class_name=..., code_directory=..., class_args={...}."""


class LocalConfig(_Kind):
    FIXED = {"platform": "local"}


class KubeflowConfig(_Kind):
    FIXED = {"platform": "kubeflow"}


class KubeflowRoleConfig(_Kind):
    """One role of a Kubeflow trial (worker, ps, master): replicas, command, docker_image, ..."""


KubeflowRowConfig = KubeflowRoleConfig  # NNI 2.x's name for it, which its Kubeflow docs' example imports


class FrameworkControllerConfig(_Kind):
    FIXED = {"platform": "frameworkcontroller"}


class FrameworkControllerRoleConfig(_Kind):
    """One of task_roles: name, task_number, command, docker_image, framework_attempt_completion_policy, ..."""


class FrameworkAttemptCompletionPolicy(_Kind):
    """min_failed_task_count, min_succeed_task_count."""


class K8sStorageConfig(_Kind):
    """A trial's Kubernetes storage: storage_type and its keys."""


class K8sNfsConfig(K8sStorageConfig):
    FIXED = {"storage_type": "nfs"}


class K8sAzureStorageConfig(K8sStorageConfig):
    FIXED = {"storage_type": "azureStorage"}


# -- what the getters return: NNI's nni.experiment.data shapes, NNI's field names ---------


@dataclass
class TrialResult:
    parameter: Dict[str, Any]
    value: Any  # the final metric: a number or a dict with "default"
    trialJobId: str


@dataclass
class TrialMetricData:
    timestamp: int  # milliseconds
    trialJobId: str
    parameterId: int
    type: str  # PERIODICAL or FINAL
    sequence: int
    data: Any


@dataclass
class TrialHyperParameters:
    parameter_id: int
    parameter_source: str
    parameters: Dict[str, Any]
    parameter_index: int
    placement_constraint: Optional[Dict[str, Any]] = None
    version_info: Optional[Dict[str, Any]] = None


@dataclass
class TrialJob:
    trialJobId: str
    status: str
    hyperParameters: List[TrialHyperParameters]
    logPath: str
    startTime: int  # milliseconds
    endTime: int  # milliseconds; -1 while it runs
    finalMetricData: List[TrialMetricData]
    stderrPath: str
    sequenceId: int
    message: str = "--"
    restartCount: int = 0
    exitCode: Optional[int] = field(default=None)


class RunMode(enum.Enum):
    """NNI's: Background stops the experiment when this program exits; Foreground also shows the
    manager's output here; Detach leaves it running."""

    Background = "background"
    Foreground = "foreground"
    Detach = "detach"


def _not_here(member: str, why: str, fix: str) -> UserError:
    return UserError(why, f"Experiment.{member}", fix)


def _ms(seconds: Optional[float]) -> int:
    return -1 if seconds is None else int(seconds * 1000)


class Experiment:
    """An experiment: configured, then started; or an existing one by id (`Experiment(None, id=...)`)."""

    url_prefix: Optional[str] = None  # NNI's URL prefix: trialkit's manager always serves at its root

    def __init__(self, config_or_platform: Union[ExperimentDraft, ParsedConfig, str, List[str], None] = "local",
                 id: Optional[str] = None):  # noqa: A002 - NNI's name
        if isinstance(config_or_platform, list):
            raise _not_here("__init__", "got a list of training services (NNI's hybrid mode), which trialkit "
                            "does not run", "pick one platform")
        if isinstance(config_or_platform, str):
            self.config: Optional[ExperimentDraft] = ExperimentDraft(config_or_platform)
        elif isinstance(config_or_platform, ParsedConfig):
            self.config = ExperimentDraft.from_dict(config_or_platform.to_dict())
        else:
            self.config = config_or_platform
        self.id = id or paths.new_experiment_id()
        self.port: Optional[int] = None
        self.url: Optional[str] = None  # the manager's (or view()'s page server's) URL while it runs
        self._child: Optional[Any] = None  # the manager we started (a process.Child)
        self._viewer: Optional[subprocess.Popen] = None

    # -- running ----------------------------------------------------------------------------
    def start(self, port: int = 8080, debug: bool = False, run_mode: RunMode = RunMode.Background) -> None:
        """Start the experiment in the background; return once its manager listens (port 0: any free port)."""
        _no_debug(debug, "start")
        if self.config is None:
            raise _not_here("start", "needs a config", "pass one to Experiment(), or use resume() for a stored one")
        config = self.config.validate()
        experiment_dir = paths.create_experiment_dir(self.id, config.experiment_working_directory)
        config_file = experiment_dir / "experiment-config.json"
        config_file.write_text(records.dumps(config.to_dict()))
        self._launch(["run", str(config_file), "--experiment-id", self.id], port, run_mode, experiment_dir)
        for note in config.notes:  # as `trialkit run` says them; the manager's own output goes to its log
            print(f"note: {note}", flush=True)

    def run(self, port: int = 8080, wait_completion: bool = True, debug: bool = False) -> Optional[bool]:
        """Start it; with wait_completion, wait for its end: True when DONE or STOPPED, False on ERROR.

        Ctrl-C stops the experiment (and returns None), as NNI's does.
        """
        return self._run(lambda: self.start(port, debug), wait_completion)

    def resume(self, port: Optional[int] = None, wait_completion: bool = True,
               debug: bool = False) -> Optional[bool]:
        """Go on with a stopped or interrupted experiment: `Experiment(None, id=ID).resume()`.

        port None: the port it had, where trials still running deliver.
        `Experiment.resume(ID)` (NNI's older spelling) works too.
        """
        if isinstance(self, str):
            self = Experiment(None, id=self)
        _no_debug(debug, "resume")
        if not self.has_checkpoint():
            raise _not_here("resume", f"finds no experiment {self.id} under {paths.experiments_root()}",
                            "check the id (`trialkit experiment list`), or set TRIALKIT_HOME to where it ran")
        self.load_checkpoint()
        if admin.ended_status(self.id) == "DONE":  # nothing left to run: as NNI's, it ends DONE, and nothing changes
            from trialkit.control.run import done_already

            print(done_already(self.id), flush=True)
            return True
        experiment_dir = paths.experiment_dir(self.id)
        return self._run(lambda: self._launch(["experiment", "resume", self.id], port, RunMode.Background,
                                              experiment_dir), wait_completion)

    def run_or_resume(self, port: int = 8080, wait_completion: bool = True, debug: bool = False) -> Optional[bool]:
        if self.has_checkpoint():
            return self.resume(port, wait_completion, debug)
        return self.run(port, wait_completion, debug)

    def view(self, port: int = 8080, non_blocking: bool = False) -> "Experiment":
        """Serve the page over this stored experiment (`trialkit ui ID`); block until Ctrl-C unless non_blocking."""
        if isinstance(self, str):
            self = Experiment(None, id=self)
        if not self.has_checkpoint():
            raise _not_here("view", f"finds no experiment {self.id}", "check the id (`trialkit experiment list`)")
        self.load_checkpoint()
        self._viewer = subprocess.Popen(process.own_module_argv("trialkit.cli", "ui", self.id, "--port", str(port)),
                                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
        line = self._viewer.stdout.readline()  # `trialkit ui: URL`, once it listens
        if not line.startswith("trialkit ui: "):
            self._viewer.wait()
            self._viewer = None
            raise _not_here("view", f"could not serve the page on port {port}", "see the error above; pick another port")
        self.url = line.split()[-1]
        self.port = int(self.url.split("/")[2].rsplit(":", 1)[1])
        if not non_blocking:
            try:
                self._viewer.wait()
            except KeyboardInterrupt:
                pass
            finally:
                self.stop()
        return self

    @classmethod
    def connect(cls, port: Union[int, str]) -> "Experiment":
        """The running experiment whose manager listens on `port` (or whose id is `port`, a str)."""
        for experiment_dir in paths.all_experiment_dirs():
            info = admin.read_info(experiment_dir)
            if info is None or not info.running():
                continue
            if info.port == port or experiment_dir.name == port:
                experiment = cls(None, id=experiment_dir.name)
                experiment.port, experiment.url = info.port, info.url
                experiment.load_checkpoint()
                return experiment
        raise _not_here("connect", f"finds no running experiment on {port!r}",
                        "see `trialkit experiment list` for the running ones")

    def stop(self) -> None:
        """Stop the experiment (its trials gracefully) and wait for its manager to end; stop view()'s page."""
        atexit.unregister(self.stop)
        if self._viewer is not None:
            self._viewer.send_signal(signal.SIGINT)  # `trialkit ui` ends on Ctrl-C
            try:
                self._viewer.wait(ENDING_WAIT)
            except subprocess.TimeoutExpired:  # it only serves a page: nothing is lost by killing it
                self._viewer.kill()
                self._viewer.wait()
            self._viewer.stdout.close()
            self._viewer = None
        elif self._manager_info() is not None:
            try:
                admin.act(self.id, "experiment", "stop")
            except UserError:
                # An experiment that ended on its own closes its server, then its manager exits.
                if not self._wait_manager(ENDING_WAIT):
                    raise
            self._wait_manager()
        self.port = self.url = None

    def __enter__(self) -> "Experiment":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- checkpoints: the store is written as the experiment goes ---------------------------
    def has_checkpoint(self) -> bool:
        try:
            paths.experiment_dir(self.id)
        except UserError:
            return False
        return True

    def load_checkpoint(self) -> None:
        """Take the stored experiment's config, unless this object was given one."""
        if self.config is None:
            self.config = ExperimentDraft.from_dict(self._stored()["config"])

    def save_checkpoint(self) -> None:
        """Nothing to do: the store holds every trial and result as they happen."""

    # -- the getters ---------------------------------------------------------------------------
    def get_status(self) -> str:
        """RUNNING, PAUSED, DONE, STOPPED, ERROR; INTERRUPTED when its manager died."""
        return background.status(paths.experiment_dir(self.id), self._stored())

    def get_experiment_profile(self) -> Dict[str, Any]:
        """NNI's profile: id, params (the config, camelCase), startTime, endTime, execDuration, logDir, ..."""
        experiment_dir = paths.experiment_dir(self.id)
        stored = self._stored()
        with self._store() as store:
            trials = store.trials(self.id)
            ran = experiment_ran(experiment_dir, stored["status"], store.open_runs(self.id))
        ended = stored["status"] not in ("RUNNING", "PAUSED")
        return {"id": self.id, "params": stored["config"], "startTime": _ms(stored["created"]),
                "endTime": _ms(stored["updated"]) if ended else -1,
                "execDuration": int(ran or 0), "logDir": str(experiment_dir),
                "nextSequenceId": len(trials), "maxSequenceId": len(trials) - 1, "revision": 0}

    def get_experiment_metadata(self, exp_id: str) -> Dict[str, Any]:
        """The entry of `exp_id` in get_all_experiments_metadata(), {} when there is none."""
        return next((meta for meta in self.get_all_experiments_metadata() if meta["id"] == exp_id), {})

    def get_all_experiments_metadata(self) -> List[Dict[str, Any]]:
        """Every experiment under TRIALKIT_HOME, as NNI's experiment manifest lists them."""
        out = []
        for experiment_dir in paths.all_experiment_dirs():
            with closing(Store.reader(experiment_dir / paths.DB_NAME)) as store:  # read only on a full disk
                stored = store.experiment(experiment_dir.name)
            if stored is None:
                continue
            info = admin.read_info(experiment_dir)
            running = info is not None and info.running()
            config = stored["config"]
            out.append({"id": experiment_dir.name, "status": background.status(experiment_dir, stored),
                        "port": info.port if running else None, "pid": info.pid if running else None,
                        "platform": config["trainingService"]["platform"],
                        "experimentName": config.get("experimentName"), "tag": [],
                        "webuiUrl": [info.url] if running else [], "logDir": str(experiment_dir),
                        "startTime": _ms(stored["created"]), "endTime": _ms(stored["updated"]), "prefixUrl": None})
        return out

    def list_trial_jobs(self) -> List[TrialJob]:
        with self._store() as store:
            return [self._trial_job(store, row) for row in trial_rows(store, self.id)]

    def get_trial_job(self, trial_job_id: str) -> TrialJob:
        with self._store() as store:
            for row in trial_rows(store, self.id):
                if row["trial_id"] == trial_job_id:
                    return self._trial_job(store, row)
        raise _not_here("get_trial_job", f"finds no trial {trial_job_id!r} in experiment {self.id}",
                        "see list_trial_jobs()")

    def get_job_statistics(self) -> List[Dict[str, Any]]:
        """[{"trialJobStatus": status, "trialJobNumber": count}, ...]"""
        with self._store() as store:
            trials = store.trials(self.id)
        counts: Dict[str, int] = {}
        for trial in trials:
            counts[trial["status"]] = counts.get(trial["status"], 0) + 1
        return [{"trialJobStatus": status, "trialJobNumber": n} for status, n in counts.items()]

    def get_job_metrics(self, trial_job_id: Optional[str] = None) -> Dict[str, List[TrialMetricData]]:
        """Trial id -> its metrics (intermediate and final, in order); one trial's only when given."""
        with self._store() as store:
            trials = [t for t in store.trials(self.id) if trial_job_id in (None, t["id"])]
            out = {t["id"]: _metrics(store, t["id"]) for t in trials}
        return {trial_id: metrics for trial_id, metrics in out.items() if metrics}

    def export_data(self) -> List[TrialResult]:
        """Every trial with a final result: its parameters, that result and its id."""
        with self._store() as store:
            rows = trial_rows(store, self.id)
        return [TrialResult(row["parameters"], row["final"], row["trial_id"]) for row in rows
                if row["final"] is not None]

    # -- changes to a running experiment ------------------------------------------------------
    def update_trial_concurrency(self, value: int) -> None:
        self._update("trialConcurrency", value)

    def update_max_trial_number(self, value: int) -> None:
        self._update("maxTrialNumber", value)

    def update_max_experiment_duration(self, value: Union[str, float]) -> None:
        """`value` as NNI writes it ("1m", "2h") or seconds."""
        self._update("maxExperimentDuration", value)

    def update_search_space(self, value: Dict[str, Any]) -> None:
        """A new search space; the tuner starts over on it, told every trial so far."""
        self._update("searchSpace", value)

    def kill_trial_job(self, trial_job_id: str) -> None:
        admin.act(self.id, "trial", "kill", trial_job_id)

    # -- helpers ---------------------------------------------------------------------------------
    def _launch(self, argv: List[str], port: Optional[int], run_mode: RunMode, experiment_dir: Path) -> None:
        if port:
            argv += ["--port", str(port)]
        child = background.start(argv, experiment_dir, to_log=run_mode is not RunMode.Foreground)
        info = background.wait_listening(child, experiment_dir, START_WAIT)
        if info is None:
            if child.popen.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.popen.wait()
            log = background.log_path(experiment_dir)
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
            raise _not_here("start", f"could not start experiment {self.id}" + (f": {tail[0]}" if tail else ""),
                            f"see {log}")
        self._child, self.port, self.url = child, info.port, info.url
        if run_mode is not RunMode.Detach:
            atexit.register(self.stop)
        from trialkit.web import page_url

        print(f"started experiment {self.id}   manager: {info.url}   log: {background.log_path(experiment_dir)}\n"
              f"page: {page_url(info.url, info.token, self.id)}", flush=True)

    def _run(self, start: Any, wait_completion: bool) -> Optional[bool]:
        try:
            start()
            if not wait_completion:
                return None
            self._wait_manager()
        except KeyboardInterrupt:
            self.stop()
            return None
        return self.get_status() in ("DONE", "STOPPED")

    def _wait_manager(self, timeout: Optional[float] = None) -> bool:
        """Until the manager ends (our child's exit, or the pid of one we did not start); False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._child is not None:
            try:
                self._child.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                return False
            self._child = None
            return True
        while self._manager_info() is not None:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.2)  # not our child: nothing to wait on but its pid
        return True

    def _manager_info(self) -> Optional[admin.ManagerInfo]:
        try:
            info = admin.read_info(paths.experiment_dir(self.id))
        except UserError:
            return None
        return info if info is not None and info.running() and not _zombie(info.pid) else None

    def _update(self, key: str, value: Any) -> None:
        admin.act(self.id, "experiment", "update", body={key: value})

    def _store(self) -> "closing[Store]":
        return closing(Store.reader(paths.experiment_dir(self.id) / paths.DB_NAME))  # read only on a full disk

    def _stored(self) -> Dict[str, Any]:
        with self._store() as store:
            stored = store.experiment(self.id)
        if stored is None:
            raise _not_here("get_status", f"finds no experiment {self.id} in its store", "see `trialkit experiment list`")
        return stored

    def _trial_job(self, store: Store, row: Dict[str, Any]) -> TrialJob:
        finals = [m for m in _metrics(store, row["trial_id"]) if m.type == records.FINAL]
        trial_dir = Path(row["trial_dir"] or "")
        return TrialJob(
            trialJobId=row["trial_id"], status=row["status"],
            hyperParameters=[TrialHyperParameters(row["parameter_id"], "algorithm", row["parameters"], 0)],
            logPath=str(trial_dir / "trial.log"), startTime=_ms(row["started"]),
            endTime=_ms(row["ended"]) if row["status"] in FINAL_STATUSES else -1, finalMetricData=finals,
            stderrPath=str(trial_dir / "stderr.log"), sequenceId=row["sequence"], message=row["reason"] or "--",
            restartCount=row["restart_count"], exitCode=row["exit_code"])


def _metrics(store: Store, trial_id: str) -> List[TrialMetricData]:
    return [TrialMetricData(_ms(rec["time"]), trial_id, rec["parameter_id"], rec["type"], rec["sequence"], rec["value"])
            for rec in store.records_for(trial_id) if rec["type"] in (records.FINAL, records.PERIODICAL)]


def _zombie(pid: int) -> bool:
    """Ended, not yet reaped: a manager this program started through another Experiment object."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _no_debug(debug: bool, member: str) -> None:
    if debug:
        raise _not_here(f"{member}(debug=True)", "has no debug mode: trialkit's manager logs the same either way",
                        "leave debug out; the manager's output is in the experiment's manager.log")
