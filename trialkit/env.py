"""The environment contract: every variable name trialkit reads or sets.

The control plane sets these for a trial; the keeper, the launchers and the
SDK read them here, once, into one typed object. NNI's and AdaptDL's names are
accepted as input (a trial started by their tools works) and set again for the
training process (code written for them finds what it expects).
"""
from __future__ import annotations

import json
import os
from collections import namedtuple
from pathlib import Path

TYPE_CHECKING = False  # no typing at run time: it costs every start 1.6 ms (tests/test_start_imports.py)
if TYPE_CHECKING:
    from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from trialkit import layout

# trialkit's own names (templates and users write the first six by hand).
TRIAL_DIR = "TRIALKIT_TRIAL_DIR"
GRACE_SECONDS = "TRIALKIT_GRACE_SECONDS"
# How long the runtime the keeper runs under waits between its SIGTERM and its SIGKILL: a pod's
# terminationGracePeriodSeconds (the Kubernetes platforms set it), `docker run --stop-timeout`'s.
TERMINATION_GRACE = "TRIALKIT_TERMINATION_GRACE_SECONDS"
MANAGER_URL = "TRIALKIT_MANAGER_URL"
TOKEN = "TRIALKIT_TOKEN"
PARAMETERS = "TRIALKIT_PARAMETERS"
SLOTS_PER_NODE = "TRIALKIT_SLOTS_PER_NODE"
PARAMETERS_FILE = "TRIALKIT_PARAMETERS_FILE"
PARAMETER_ID = "TRIALKIT_PARAMETER_ID"
EXPERIMENT_ID = "TRIALKIT_EXPERIMENT_ID"
TRIAL_ID = "TRIALKIT_TRIAL_ID"
SEQUENCE = "TRIALKIT_SEQUENCE"
PLATFORM = "TRIALKIT_PLATFORM"
OUTPUT_DIR = "TRIALKIT_OUTPUT_DIR"
CHECKPOINT_DIR = "TRIALKIT_CHECKPOINT_DIR"
# The experiment's object store of checkpoints (JSON: type, bucket or container, prefix, endpoint_url, region,
# account_url; never a credential): the keeper uploads the trial's checkpoints there and fetches the latest
# before the trial starts (trialkit/checkpoints). Unset: the checkpoint dir is the store.
CHECKPOINT_STORE = "TRIALKIT_CHECKPOINT_STORE"
# Seconds the keeper waits, after the trial's end, for its checkpoints to be uploaded (and, before its start,
# for the latest to be fetched).
CHECKPOINT_TRANSFER_SECONDS = "TRIALKIT_CHECKPOINT_TRANSFER_SECONDS"
DEFAULT_CHECKPOINT_TRANSFER_SECONDS = 600.0
SHARE_DIR = "TRIALKIT_SHARE_DIR"
TENSORBOARD_DIR = "TRIALKIT_TENSORBOARD_DIR"
RESTART_COUNT = "TRIALKIT_RESTART_COUNT"
CODE_DIR = "TRIALKIT_CODE_DIR"
COMMAND = "TRIALKIT_COMMAND"  # run.sh's command when it is given none
CHANNEL = "TRIALKIT_CHANNEL"  # the SDK -> keeper record file
UNDER_KEEPER = "TRIALKIT_KEEPER_PID"  # set by the keeper for its child
REPORT_ALL_RANKS = "TRIALKIT_REPORT_ALL_RANKS"
STOP_FILE = "TRIALKIT_STOP_FILE"  # exists once a stop was asked (should_preempt)
PYTHON = "TRIALKIT_PYTHON"  # the interpreter run.sh starts the keeper with
# The variables only the keeper may hold: its shipper sends the token, while the training process (and the
# startup hook) reach the keeper through the channel file and need none. They never enter a child's
# environment, a rendered object or a log line (docs/concepts.md, security).
SECRETS = frozenset({TOKEN})
# A Determined experiment config's settings that its Core API serves the trial (searcher metric,
# lengths, `data`): base64url of JSON, set by the config's translation (trialkit/control/determined.py).
DETERMINED = "TRIALKIT_DETERMINED"
# In a Kubernetes pod, the sha256 of the archives run.sh fetches from the manager
# (trialkit/manager/archives.py): the experiment's code, and trialkit's trial side
# for an image without trialkit; and where run.sh says why a trial could not start.
CODE_DIGEST = "TRIALKIT_CODE_DIGEST"
TRIALSIDE_DIGEST = "TRIALKIT_TRIALSIDE_DIGEST"
TERMINATION_LOG = "TRIALKIT_TERMINATION_LOG"
# A dir of mounted Secrets (one subdir each) whose keys run.sh exports as variables, as a container's
# envFrom would: a TrainJob's pods take no envFrom (Trainer's container patch has env and mounts only).
ENV_FROM_DIR = "TRIALKIT_ENV_FROM_DIR"
# The manager's own scrape token for GET /metrics (Prometheus), beside the page's and the admin token.
METRICS_TOKEN = "TRIALKIT_METRICS_TOKEN"
# Kubeflow Trainer v2 (2.2+) gives a TrainJob's pods its progress endpoint: a URL, and files holding its CA
# certificate and a bearer token (rotated: read again at each post). The keeper posts there (keeper/trainer_status.py).
TRAINER_SERVER_URL = "KUBEFLOW_TRAINER_SERVER_URL"
TRAINER_SERVER_CA_CERT = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
TRAINER_SERVER_TOKEN = "KUBEFLOW_TRAINER_SERVER_TOKEN"
# A Ray node's instance-metadata service (spot notices); set per node to point a
# node at a stand-in, as tests do. Default: EC2's link-local address.
IMDS_URL = "TRIALKIT_IMDS_URL"
# The devices a process may use (CUDA's names; trialkit.gpus sets them for local trials).
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
CUDA_DEVICE_ORDER = "CUDA_DEVICE_ORDER"
NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"

# Compatibility names, read as input and written for the training process.
NNI = {
    "platform": "NNI_PLATFORM",
    "experiment_id": "NNI_EXP_ID",
    "trial_id": "NNI_TRIAL_JOB_ID",
    "sequence": "NNI_TRIAL_SEQ_ID",
    "trial_dir": "NNI_SYS_DIR",
    "output_dir": "NNI_OUTPUT_DIR",
    "code_dir": "NNI_CODE_DIR",
}
ADAPTDL = {
    "checkpoint_dir": "ADAPTDL_CHECKPOINT_PATH",
    "share_dir": "ADAPTDL_SHARE_PATH",
    "tensorboard_dir": "ADAPTDL_TENSORBOARD_LOGDIR",
    "restart_count": "ADAPTDL_NUM_RESTARTS",
    "job_id": "ADAPTDL_JOB_ID",
    # Set by adaptdl-ray: where the trainer sends its scheduling hints and finds its peers.
    "supervisor_url": "ADAPTDL_SUPERVISOR_URL",
    "sched_version": "ADAPTDL_SCHED_VERSION",
    # The replica topology AdaptDL's library reads (set by its scheduler, or by adaptdl-ray).
    "replica_rank": "ADAPTDL_REPLICA_RANK",
    "num_replicas": "ADAPTDL_NUM_REPLICAS",
    "num_nodes": "ADAPTDL_NUM_NODES",
    "master_addr": "ADAPTDL_MASTER_ADDR",
    "master_port": "ADAPTDL_MASTER_PORT",
}
ADAPTDL_OLD_TENSORBOARD = "ADAPTDLCTL_TENSORBOARD_LOGDIR"  # the name NNI's docs use
ADAPTDL_PLATFORM = "adaptdl"  # TRIALKIT_PLATFORM in an AdaptDLJob's pods
# Seconds of training between AdaptDL checkpoints that trialkit takes (0: none;
# then AdaptDL checkpoints on SIGTERM only). The default, 10 minutes, is what a
# crash costs at most; a checkpoint that takes 6 s (a 1 GB model on network
# storage) then costs 1% of the time, the example's few ms nothing measurable.
CHECKPOINT_EVERY = "TRIALKIT_CHECKPOINT_EVERY"
DEFAULT_CHECKPOINT_EVERY = 600.0
# The hook that takes them (trialkit/adaptdl/boot): first on the training process's PYTHONPATH.
ADAPTDL_BOOT_DIR = Path(__file__).resolve().parent / "adaptdl" / "boot"
# The finder of trialkit's fallback packages (`nni` where NNI is not installed: trialkit/shims),
# on every training process's PYTHONPATH, after AdaptDL's (whose sitecustomize chains to it).
# Spelled here, not imported: trialkit.shims is the trial side, above this contract.
SHIMS_BOOT_DIR = Path(__file__).resolve().parent / "shims" / "boot"

DEFAULT_GRACE_SECONDS = 25.0  # outside a container; a Kubernetes platform's keeper grace unless its config says
# The runtimes' own waits between their SIGTERM and their SIGKILL, where nothing says another (TERMINATION_GRACE).
CONTAINER_STOP_SECONDS = 10.0  # `docker stop`'s and `podman stop`'s default timeout
POD_TERMINATION_SECONDS = 30.0  # a pod's default terminationGracePeriodSeconds
# cgroup paths that name a container's runtime (cgroup v1, or v2 without a cgroup namespace).
_CONTAINER_CGROUPS = ("docker", "libpod", "containerd", "kubepods", "crio")
# What an init in front of run.sh shows in /proc/1/comm (its file's name, cut to 15 bytes: all of these fit):
# `docker run --init`'s docker-init, `podman run --init`'s podman-init (catatonit, mounted under that name),
# and the inits an image puts there itself.
_RUNTIME_INITS = ("docker-init", "podman-init", "catatonit", "tini", "tini-static", "dumb-init")
# The longest grace a keeper or an experiment takes: its timers wait in milliseconds of a C int (24.8 days).
MAX_GRACE_SECONDS = 7 * 86400.0
MAX_PARAMETERS_BYTES = 64 << 20  # a parameters file larger than this is not one
RANK_VARIABLES = ("RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "ADAPTDL_REPLICA_RANK")


def _first(environ: Mapping[str, str], *names: str) -> Optional[str]:
    for name in names:
        value = environ.get(name)
        if value:
            return value
    return None


def _number(environ: Mapping[str, str], name: str, default: float, kind=float):
    raw = environ.get(name)
    if raw in (None, ""):
        return default
    try:
        return kind(raw)
    except ValueError:
        # A bad number must not stop a trial from starting: say so, use the default.
        import sys

        print(f"trialkit: ignoring {name}={raw[:40]!r}: not a number; using {default}", file=sys.stderr)
        return default


def runtime_stop(environ: Mapping[str, str]) -> Optional[Tuple[str, float]]:
    """(the runtime that stops this process, its seconds from SIGTERM to SIGKILL); None where none is known.

    TERMINATION_GRACE, where set (the Kubernetes platforms pass a pod's terminationGracePeriodSeconds down),
    says how long. Else a process that is what its container runs (_runs_the_container) gets its runtime's
    default: Kubernetes (KUBERNETES_SERVICE_HOST, in every pod) a pod's 30 s; podman (/run/.containerenv) and
    Docker (/.dockerenv, or a container's cgroup) their `stop`'s 10 s. A process started beside a container's
    own (a local experiment's keeper in a dev container) is not what its runtime stops: None.
    """
    given = _number(environ, TERMINATION_GRACE, 0.0, float)
    given = given if 0 < given <= MAX_GRACE_SECONDS else None
    if given is None and not _runs_the_container():
        return None
    if environ.get("KUBERNETES_SERVICE_HOST"):
        return "Kubernetes", given or POD_TERMINATION_SECONDS
    if os.path.exists("/run/.containerenv"):
        return "podman", given or CONTAINER_STOP_SECONDS
    if os.path.exists("/.dockerenv") or _in_container_cgroup():
        return "Docker", given or CONTAINER_STOP_SECONDS
    return ("its runtime", given) if given else None


def _runs_the_container() -> bool:
    """Whether this process is what its container runs: its PID 1 (run.sh execs the keeper), or the child of
    the init a runtime puts there (`docker run --init`'s docker-init, `podman run --init`'s podman-init)."""
    if os.getpid() == 1:
        return True
    if os.getppid() != 1:
        return False
    try:
        with open("/proc/1/comm") as f:
            return f.read().strip() in _RUNTIME_INITS
    except OSError:
        return False


def _in_container_cgroup() -> bool:
    try:
        with open("/proc/self/cgroup") as f:
            text = f.read()
    except OSError:
        return False
    return any(name in text for name in _CONTAINER_CGROUPS)


def fitting_grace(stop_seconds: float) -> float:
    """The longest grace that ends, with the keeper's time to record and flush after it, inside a runtime's
    wait between its SIGTERM and its SIGKILL (docker and podman's 10 s: 4)."""
    return max(stop_seconds - layout.CLEANUP_MARGIN_SECONDS, 1.0)


def default_grace(environ: Mapping[str, str]) -> float:
    """The grace where TRIALKIT_GRACE_SECONDS gives none: what the runtime allows (fitting_grace), else
    DEFAULT_GRACE_SECONDS."""
    runtime = runtime_stop(environ)
    return DEFAULT_GRACE_SECONDS if runtime is None else fitting_grace(runtime[1])


def _grace(environ: Mapping[str, str]) -> float:
    """The grace every reader (keeper, launchers, wrap_rank) waits: TRIALKIT_GRACE_SECONDS, else default_grace.
    One that is no number or outside 0..MAX_GRACE_SECONDS is said and replaced here (a timer given 10**9 s
    would fail at the first stop, mid-trial)."""
    raw = environ.get(GRACE_SECONDS)
    if raw in (None, ""):
        return default_grace(environ)
    try:
        seconds: Optional[float] = float(raw)
    except ValueError:
        seconds = None
    if seconds is not None and 0 <= seconds <= MAX_GRACE_SECONDS:  # NaN is not
        return seconds
    bounded = MAX_GRACE_SECONDS if seconds is not None and seconds > MAX_GRACE_SECONDS else default_grace(environ)
    why = "not a number" if seconds is None else f"outside 0..{MAX_GRACE_SECONDS:g} seconds"
    import sys

    print(f"trialkit: ignoring {GRACE_SECONDS}={raw!r:.40}: {why}; using {bounded:g}", file=sys.stderr)
    return bounded


# Named tuples, neither dataclasses (which import inspect) nor typing's NamedTuple
# (typing costs 1.6 ms): both would slow every keeper's start before the trial
# runs. Immutable; a copy with changes is _replace().
class TrialEnv(namedtuple("TrialEnv", (
        "experiment_id trial_id sequence platform manager_url token parameters_json parameters_file "
        "parameter_id trial_dir output_dir checkpoint_dir share_dir tensorboard_dir code_dir restart_count "
        "grace_seconds rank report_all_ranks under_keeper channel stop_file checkpoint_every rank_problem "
        "checkpoint_store checkpoint_transfer_seconds"),
        defaults=(DEFAULT_CHECKPOINT_EVERY, None, None, DEFAULT_CHECKPOINT_TRANSFER_SECONDS))):
    """What the environment says about a trial.

    str: experiment_id, trial_id, platform; str or None: manager_url, token,
    parameters_json, parameters_file, parameter_id, checkpoint_store; Path: trial_dir, output_dir,
    checkpoint_dir, share_dir, channel, stop_file; Path or None: tensorboard_dir,
    code_dir; int: sequence, restart_count, rank; float: grace_seconds, checkpoint_every,
    checkpoint_transfer_seconds; bool: report_all_ranks, under_keeper; str or None: rank_problem (why the rank
    variable's value was no rank: the rank reads 0, and the SDK says so).
    """

    __slots__ = ()

    def parameters(self) -> Dict[str, Any]:
        """The trial's parameters: inline JSON, else a file, else empty. Raises ValueError (not a JSON
        object, a file that is no regular file or holds over MAX_PARAMETERS_BYTES) or OSError."""
        if self.parameters_json:
            data = json.loads(self.parameters_json)
            where = PARAMETERS
        elif self.parameters_file and os.path.exists(self.parameters_file):
            data = json.loads(read_regular_file(self.parameters_file, MAX_PARAMETERS_BYTES))
            # NNI's parameter.cfg wraps the parameters; a plain file is the parameters.
            if type(data) is dict and "parameter_id" in data:
                data = data.get("parameters", data)
            where = self.parameters_file
        else:
            return {}
        if type(data) is not dict:
            raise ValueError(f"{where} holds a JSON {type(data).__name__}, not an object of names and values")
        return data

    def child_environ(self, base: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
        """The environment of the training process: trialkit's names, NNI's and AdaptDL's; no secret."""
        out = {k: v for k, v in (os.environ if base is None else base).items() if k not in SECRETS}
        own = {
            EXPERIMENT_ID: self.experiment_id,
            TRIAL_ID: self.trial_id,
            SEQUENCE: str(self.sequence),
            PLATFORM: self.platform,
            TRIAL_DIR: str(self.trial_dir),
            OUTPUT_DIR: str(self.output_dir),
            CHECKPOINT_DIR: str(self.checkpoint_dir),
            SHARE_DIR: str(self.share_dir),
            RESTART_COUNT: str(self.restart_count),
            GRACE_SECONDS: str(self.grace_seconds),
            CHANNEL: str(self.channel),
            STOP_FILE: str(self.stop_file),
        }
        if self.tensorboard_dir:
            own[TENSORBOARD_DIR] = str(self.tensorboard_dir)
        nni = {
            NNI["platform"]: self.platform,
            NNI["experiment_id"]: self.experiment_id,
            NNI["trial_id"]: self.trial_id,
            NNI["sequence"]: str(self.sequence),
            NNI["trial_dir"]: str(self.trial_dir),
            NNI["output_dir"]: str(self.output_dir),
            "MULTI_PHASE": "false",
        }
        if self.code_dir:
            nni[NNI["code_dir"]] = str(self.code_dir)
        # In an AdaptDLJob's pod, AdaptDL's scheduler names the job (namespace/name): its supervisor knows it so.
        scheduled = out.get(ADAPTDL["job_id"]) if self.platform == ADAPTDL_PLATFORM else None
        out.update(own)
        out.update(nni)
        out.update(self.adaptdl_environ())
        if scheduled:
            out[ADAPTDL["job_id"]] = scheduled
        boots = ([str(ADAPTDL_BOOT_DIR)] if self.checkpoint_every > 0 else []) + [str(SHIMS_BOOT_DIR)]
        # Each once, in this order, however the environment came (a keeper's own, inherited).
        # (an empty entry stays: it means the working directory)
        theirs = [p for p in out["PYTHONPATH"].split(os.pathsep) if p not in boots] if out.get("PYTHONPATH") else []
        out["PYTHONPATH"] = os.pathsep.join(boots + theirs)
        return out

    def adaptdl_environ(self) -> Dict[str, str]:
        """AdaptDL's names. It names each checkpoint after the restart count and
        refuses to save twice under one number, so the count must rise on every restart."""
        out = {
            ADAPTDL["checkpoint_dir"]: str(self.checkpoint_dir),
            ADAPTDL["share_dir"]: str(self.share_dir),
            ADAPTDL["restart_count"]: str(self.restart_count),
            ADAPTDL["job_id"]: adaptdl_job_key(self.experiment_id, self.trial_id),
            # adaptdl 0.2.11 pickles whole objects into its checkpoints; torch 2.x
            # refuses to load them unless weights-only loading is turned off.
            "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1",
            CHECKPOINT_EVERY: f"{self.checkpoint_every:g}",
        }
        if self.tensorboard_dir:
            out[ADAPTDL["tensorboard_dir"]] = str(self.tensorboard_dir)
            out[ADAPTDL_OLD_TENSORBOARD] = str(self.tensorboard_dir)
        return out


def read_regular_file(path: Any, limit: int) -> bytes:
    """A regular file's bytes, at most `limit` of them, for every reader of a file another process or a person
    may have put there: a FIFO would block the reader, /dev/zero never end it. Raises OSError, or ValueError
    for what is no regular file or holds more."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO opens without waiting for a writer
    try:
        import stat

        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path} is not a regular file")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
        raise ValueError(f"{path} holds over {limit >> 20} MiB")
    finally:
        os.close(fd)


def hide_secrets() -> None:
    """Overwrite the secrets' values in this process's first environment block: what /proc/PID/environ and
    `ps e` show to any process of the same user, the trial included, though os.environ keeps its own copy.
    Where the kernel refuses (no /proc), the trial's environment still holds none (child_environ)."""
    names = [name.encode() for name in SECRETS if os.environ.get(name)]
    if not names:
        return
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        # proc(5)'s env_start and env_end, fields 50 and 51; the name (field 2) may hold spaces.
        start, end = (int(field) for field in stat[stat.rfind(b")") + 2 :].split()[47:49])
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            block, offset = mem.read(end - start), start
            for entry in block.split(b"\0"):
                name, equals, value = entry.partition(b"=")
                if equals and name in names:
                    mem.seek(offset + len(name) + 1)
                    mem.write(b"*" * len(value))
                offset += len(entry) + 1
    except (OSError, ValueError):
        pass


def check(trial: TrialEnv) -> None:
    """What the keeper refuses to start a trial with, as a UserError: a manager URL or a token it cannot send,
    parameters it cannot read. The SDK reads the same environment without this check: it
    never raises into training."""
    from trialkit.errors import UserError

    if trial.manager_url is not None:
        problem = _url_problem(trial.manager_url)
        if problem:
            raise UserError(f"manager URL {trial.manager_url[:80]!r} {problem}", MANAGER_URL,
                            "give http://HOST:PORT or https://HOST:PORT, as the manager prints it")
    if trial.token is not None and not _TOKEN_CHARS.issuperset(trial.token):
        raise UserError("the token holds characters a bearer token cannot (a line break, a space, a control "
                        "character or non-ASCII text)", TOKEN, "give the token the manager made, as it is")
    try:
        trial.parameters()
    except (OSError, ValueError) as err:
        where = PARAMETERS if trial.parameters_json else PARAMETERS_FILE
        raise UserError(f"cannot read the trial's parameters: {getattr(err, 'strerror', None) or err}"[:300], where,
                        "give a JSON object of names and values, inline or in a regular file") from None


def check_grace(seconds: float, where: str) -> float:
    """A grace the keeper's and the control plane's timers can wait, or a UserError: the one bound of both."""
    if not 0 <= seconds <= MAX_GRACE_SECONDS:  # NaN too
        from trialkit.errors import UserError

        raise UserError(f"grace {seconds:g} s is outside 0..{MAX_GRACE_SECONDS:g}", where,
                        f"give seconds from 0 to {MAX_GRACE_SECONDS:g}, a week")
    return seconds


def _url_problem(url: str) -> Optional[str]:
    from urllib.parse import urlsplit

    if not url.isascii() or not url.isprintable() or " " in url:
        return "holds spaces, control characters or non-ASCII text"
    try:
        parts = urlsplit(url)
        parts.port  # raises ValueError for a port that is no number or out of range
    except ValueError as err:
        return f"cannot be read ({err})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "is not an http or https URL with a host"
    return None


# RFC 6750's b64token, the characters a bearer token may hold.
_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/=")


def adaptdl_job_key(experiment_id: str, trial_id: str) -> str:
    """ADAPTDL_JOB_ID: the key AdaptDL's trainer names its job by to a supervisor."""
    return f"{experiment_id}/{trial_id}"


def read(environ: Optional[Mapping[str, str]] = None) -> TrialEnv:
    """Read the contract from an environment (os.environ by default)."""
    e = os.environ if environ is None else environ
    trial_dir = Path(_first(e, TRIAL_DIR, NNI["trial_dir"]) or os.getcwd())
    output_dir = Path(_first(e, OUTPUT_DIR, NNI["output_dir"]) or trial_dir)
    tensorboard = _first(e, TENSORBOARD_DIR, ADAPTDL["tensorboard_dir"], ADAPTDL_OLD_TENSORBOARD)
    code_dir = _first(e, CODE_DIR, NNI["code_dir"])
    # Read without a word here (the keeper has no use for it, and wrap_rank refuses what is no rank): a value
    # that is no rank reads 0, and the SDK says why.
    rank_name = _rank_variable(e, RANK_VARIABLES)
    rank_value = e[rank_name].strip() if rank_name else "0"
    rank_problem = _not_a_rank(rank_name, rank_value) if rank_name else None
    restart_count = _number(e, RESTART_COUNT, -1, int)
    if restart_count < 0:
        restart_count = _number(e, ADAPTDL["restart_count"], 0, int)
    return TrialEnv(
        experiment_id=_first(e, EXPERIMENT_ID, NNI["experiment_id"]) or "standalone",
        trial_id=_first(e, TRIAL_ID, NNI["trial_id"], ADAPTDL["job_id"]) or "standalone",
        sequence=_number(e, SEQUENCE, 0, int) if e.get(SEQUENCE) else _number(e, NNI["sequence"], 0, int),
        platform=_first(e, PLATFORM, NNI["platform"]) or "local",
        manager_url=_first(e, MANAGER_URL),
        token=_first(e, TOKEN),
        parameters_json=_first(e, PARAMETERS),
        parameters_file=_first(e, PARAMETERS_FILE),
        parameter_id=_first(e, PARAMETER_ID),
        trial_dir=trial_dir,
        output_dir=output_dir,
        checkpoint_dir=Path(_first(e, CHECKPOINT_DIR, ADAPTDL["checkpoint_dir"]) or layout.checkpoint_dir(trial_dir)),
        share_dir=Path(_first(e, SHARE_DIR, ADAPTDL["share_dir"]) or trial_dir / "share"),
        tensorboard_dir=Path(tensorboard) if tensorboard else None,
        code_dir=Path(code_dir) if code_dir else None,
        restart_count=restart_count,
        grace_seconds=_grace(e),
        rank=0 if rank_problem else int(rank_value),
        report_all_ranks=e.get(REPORT_ALL_RANKS, "") not in ("", "0", "false", "False"),
        under_keeper=bool(e.get(UNDER_KEEPER)),
        channel=Path(_first(e, CHANNEL) or trial_dir / layout.HOME / layout.CHANNEL),
        stop_file=Path(_first(e, STOP_FILE) or trial_dir / layout.HOME / layout.STOP),
        checkpoint_every=max(0.0, _number(e, CHECKPOINT_EVERY, DEFAULT_CHECKPOINT_EVERY, float)),
        rank_problem=rank_problem,
        checkpoint_store=_first(e, CHECKPOINT_STORE),
        checkpoint_transfer_seconds=max(0.0, _number(e, CHECKPOINT_TRANSFER_SECONDS,
                                                     DEFAULT_CHECKPOINT_TRANSFER_SECONDS, float)),
    )


RANK_DIGITS = 18  # a rank is below its job's worker count: any longer number is no rank (nor within int64)


def parse_rank(name: str, value: str) -> int:
    """A rank given as text (a variable's value, an argument), or a UserError naming `name`."""
    problem = _not_a_rank(name, value)
    if problem:
        from trialkit.errors import UserError

        raise UserError(problem, name, "ranks are whole numbers from 0, each below the job's worker count")
    return int(value)


def _not_a_rank(name: str, value: str) -> Optional[str]:
    if value.isascii() and value.isdigit() and len(value) <= RANK_DIGITS:
        return None
    shown = f"{value[:40]!r}" + (f"... ({len(value):,} characters)" if len(value) > 40 else "")
    return f"{name}={shown} is not a rank"


def rank_of(environ: Mapping[str, str], names: Sequence[str] = RANK_VARIABLES) -> Optional[int]:
    """The rank the first of `names` that is set gives, None when none is: one rule for wrap_rank, which
    refuses a value that is no rank, and TrialEnv (the SDK), which reads it as 0 and says so."""
    name = _rank_variable(environ, names)
    return None if name is None else parse_rank(name, environ[name].strip())


def _rank_variable(environ: Mapping[str, str], names: Sequence[str]) -> Optional[str]:
    return next((name for name in names if environ.get(name, "").strip()), None)


# ---------------------------------------------------------------------------
# Topology: how many nodes a distributed trial spans, which one this is, and
# where the chief listens. The launchers read it here; trialkit's own names win
# over what a platform injects, and a launcher writes them back into its
# workers' environment so that a launcher nested below reads the same answer
# instead of mistaking a worker's RANK for a node rank. docs/launchers.md
# holds the table of where each field comes from.
NUM_NODES = "TRIALKIT_NUM_NODES"
NODE_RANK = "TRIALKIT_NODE_RANK"
CHIEF_ADDR = "TRIALKIT_CHIEF_ADDR"
CHIEF_PORT = "TRIALKIT_CHIEF_PORT"
HOSTS = "TRIALKIT_HOSTS"  # every node's address in node-rank order, comma-separated
LAUNCH_SOCKET = "TRIALKIT_LAUNCH_SOCKET"  # wrap_rank -> its launcher's supervisor
# The user's TMPDIR ("" when unset), for wrap_rank to give back to the script: the engine's TMPDIR is the
# launch's own dir, removed at its end (torchrun leaves a torchelastic_* dir there a run).
LAUNCH_USER_TMPDIR = "TRIALKIT_LAUNCH_USER_TMPDIR"
DEFAULT_CHIEF_PORT = 29500  # torch.distributed's default, when a platform names no port


class Topology(namedtuple("Topology", "num_nodes node_rank slots_per_node chief_addr chief_port hosts source")):
    """Where a distributed trial's nodes are.

    int: num_nodes, node_rank, slots_per_node; str: chief_addr; chief_port: int,
    or None on a single node (the launcher picks a free port); hosts: the node
    addresses by node rank (a tuple, empty when nobody said); source: which
    contract it came from, for messages.
    """

    __slots__ = ()

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.slots_per_node

    def environ(self) -> Dict[str, str]:
        """trialkit's names for this topology, for the workers' environment."""
        out = {
            NUM_NODES: str(self.num_nodes),
            NODE_RANK: str(self.node_rank),
            SLOTS_PER_NODE: str(self.slots_per_node),
            CHIEF_ADDR: self.chief_addr,
        }
        if self.chief_port is not None:
            out[CHIEF_PORT] = str(self.chief_port)
        if self.hosts:
            out[HOSTS] = ",".join(self.hosts)
        return out


def topology(environ: Optional[Mapping[str, str]] = None) -> Topology:
    """The trial's topology: trialkit's names, else a platform's, else one node."""
    e = os.environ if environ is None else environ
    found = _platform_topology(e)
    num_nodes = _pick(_topology_int(e, NUM_NODES), found.get("num_nodes"), 1)
    port = _pick(_topology_int(e, CHIEF_PORT), found.get("chief_port"))
    hosts = tuple(h.strip() for h in e.get(HOSTS, "").split(",") if h.strip()) or found.get("hosts", ())
    topo = Topology(
        num_nodes=num_nodes,
        node_rank=_pick(_topology_int(e, NODE_RANK), found.get("node_rank"), 0),
        # Unset: one worker per visible GPU, as torchrun's --nproc-per-node gpu (a 0 given is refused below).
        slots_per_node=_pick(_topology_int(e, SLOTS_PER_NODE), found.get("slots_per_node"),
                             visible_device_count(e) or None, 1),
        chief_addr=e.get(CHIEF_ADDR) or found.get("chief_addr") or "127.0.0.1",
        chief_port=port if port is not None or num_nodes == 1 else DEFAULT_CHIEF_PORT,
        hosts=hosts,
        source=found.get("source") or ("trialkit" if e.get(NUM_NODES) else "single node"),
    )
    _check_topology(topo, e)
    return topo


def _platform_topology(e: Mapping[str, str]) -> Dict[str, Any]:
    """What a platform injected, in trialkit's terms (only the fields it knows)."""
    if e.get("PET_NNODES") or (e.get("MASTER_ADDR") and e.get("WORLD_SIZE") and not e.get("LOCAL_RANK")):
        # Kubeflow PyTorchJob (PET_* since training-operator 1.4, beside MASTER_ADDR/PORT; before, one
        # process per pod with WORLD_SIZE pods and RANK the pod's index), or Trainer v2's TrainJob, whose
        # torch plugin sets PET_MASTER_ADDR/PORT and no MASTER_ADDR. LOCAL_RANK marks a torchrun worker,
        # whose RANK is not a node rank.
        name = "PET_NNODES" if e.get("PET_NNODES") else "WORLD_SIZE"
        master = e.get("PET_MASTER_ADDR") or e.get("MASTER_ADDR") or ""
        out: Dict[str, Any] = {
            "source": "TrainJob" if e.get("PET_MASTER_ADDR") else "PyTorchJob",
            "num_nodes": _topology_int({name: e[name].split(":")[-1]}, name),  # "min:max" when elastic
            "node_rank": _topology_int(e, "PET_NODE_RANK" if e.get("PET_NODE_RANK") else "RANK"),
            "slots_per_node": _topology_int(e, "PET_NPROC_PER_NODE"),  # may be "auto": then ours
            "chief_addr": master or None,
            "chief_port": _topology_int(e, "PET_MASTER_PORT" if e.get("PET_MASTER_PORT") else "MASTER_PORT"),
        }
        out["hosts"] = _kubeflow_hosts(master, out["num_nodes"]) if out["num_nodes"] else ()
        return out
    if e.get("TF_CONFIG"):
        return _tfjob_topology(e)
    if e.get("FC_TASK_INDEX") and e.get("FC_TASKROLE_NAME"):
        # FrameworkController injects no peer list and no task count: the task
        # count comes from TRIALKIT_NUM_NODES (the platform sets it), and peers
        # follow FrameworkController's own examples: pod hostname
        # {role}-{index}, subdomain {framework}-{role} (a headless service).
        role, framework = e["FC_TASKROLE_NAME"], e.get("FC_FRAMEWORK_NAME", "")
        domain = f".{framework}-{role}" if framework else ""
        count = _topology_int(e, NUM_NODES) or 1
        return {
            "source": "FrameworkController",
            "node_rank": _topology_int(e, "FC_TASK_INDEX"),
            "chief_addr": f"{role}-0{domain}",
            "hosts": tuple(f"{role}-{i}{domain}" for i in range(count)),
        }
    if e.get(ADAPTDL["num_replicas"]):
        # AdaptDL runs one pod per replica; port 0 means "local, pick one".
        port = _topology_int(e, ADAPTDL["master_port"])
        return {
            "source": "AdaptDL",
            "num_nodes": _topology_int(e, ADAPTDL["num_replicas"]),
            "node_rank": _topology_int(e, ADAPTDL["replica_rank"]),
            "chief_addr": e.get(ADAPTDL["master_addr"]),
            "chief_port": port or None,
        }
    return {}


def _kubeflow_hosts(master: str, count: int) -> tuple:
    """Every node's address by rank, from the chief's: a PyTorchJob's operator names each replica's service
    <job>-master-0, <job>-worker-<i>; JobSet names a TrainJob's pods <job>-node-0-<i>.<job> (its hosts in
    the JobSet's subdomain). () when the name follows neither."""
    if master.endswith("-master-0"):
        job = master[: -len("-master-0")]
        return (master,) + tuple(f"{job}-worker-{i}" for i in range(count - 1))
    host, dot, domain = master.partition(".")
    if host.endswith("-0-0"):
        return tuple(f"{host[:-1]}{i}{dot}{domain}" for i in range(count))
    return ()


# The task types of a TFJob's TF_CONFIG that run the trial's pods, in node-rank order: the chief's (or
# master's) pod is node 0, as trialkit's renderer ranks a TFJob's roles (TRIALKIT_RANK_OFFSET).
TF_NODE_TYPES = ("chief", "master", "worker", "ps")


def _tfjob_topology(e: Mapping[str, str]) -> Dict[str, Any]:
    """A TFJob's pods as nodes: training-operator gives each pod only TF_CONFIG, the cluster's
    `host:port` by task type and the pod's own task; node 0's port is the one it opened."""
    from trialkit.errors import UserError

    try:
        config = json.loads(e["TF_CONFIG"])
        cluster, task = config.get("cluster") or {}, config.get("task") or {}
        nodes = [(kind, index, address) for kind in TF_NODE_TYPES
                 for index, address in enumerate(cluster.get(kind) or [])]
        rank = next(i for i, (kind, index, _) in enumerate(nodes)
                    if kind == task.get("type") and index == int(task.get("index", 0)))
        hosts = [address.rpartition(":") for address in (address for _, _, address in nodes)]
    except (ValueError, TypeError, AttributeError, StopIteration):
        raise UserError("TF_CONFIG names no task of its cluster's chief, workers or ps", "TF_CONFIG",
                        "let the TFJob's operator set it, or set TRIALKIT_NUM_NODES and TRIALKIT_NODE_RANK") from None
    chief_host, _, chief_port = hosts[0]
    return {
        "source": "TFJob",
        "num_nodes": len(nodes),
        "node_rank": rank,
        "chief_addr": chief_host,
        "chief_port": _topology_int({"TF_CONFIG": chief_port}, "TF_CONFIG"),
        "hosts": tuple(host for host, _, _ in hosts),
    }


def visible_device_count(environ: Mapping[str, str]) -> int:
    """How many devices CUDA_VISIBLE_DEVICES names (0 when unset or empty); CUDA stops at a -1."""
    count = 0
    for entry in environ.get(CUDA_VISIBLE_DEVICES, "").split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        count += 1
    return count


def _pick(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def _topology_int(e: Mapping[str, str], name: str) -> Optional[int]:
    raw = e.get(name, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        if raw == "auto":  # PET_NPROC_PER_NODE=auto: let trialkit's slots decide
            return None
        from trialkit.errors import UserError

        raise UserError(f"{name}={raw!r} is not a whole number", name, "set it to an integer") from None


MAX_SLOTS_PER_NODE = 1024  # workers a launcher starts on one node
MAX_NODES = 100_000


def _check_topology(topo: Topology, e: Mapping[str, str]) -> None:
    from trialkit.errors import UserError

    if topo.num_nodes < 1 or topo.slots_per_node < 1:
        named = next((name for name, count in ((SLOTS_PER_NODE, topo.slots_per_node), (NUM_NODES, topo.num_nodes))
                      if count < 1 and e.get(name, "").strip()), f"topology from {topo.source}")
        raise UserError(f"{topo.num_nodes} nodes x {topo.slots_per_node} slots is no worker at all", named,
                        f"set {NUM_NODES} and {SLOTS_PER_NODE} to 1 or more")
    if topo.slots_per_node > MAX_SLOTS_PER_NODE or topo.num_nodes > MAX_NODES:  # else the engine tries to start them
        raise UserError(f"{topo.num_nodes} nodes x {topo.slots_per_node} slots is more than any machine runs",
                        f"topology from {topo.source}",
                        f"give at most {MAX_SLOTS_PER_NODE} workers a node and {MAX_NODES} nodes")
    if not 0 <= topo.node_rank < topo.num_nodes:
        raise UserError(f"node rank {topo.node_rank} is outside 0..{topo.num_nodes - 1}",
                        f"topology from {topo.source}", f"set {NODE_RANK} below {NUM_NODES}")
    if topo.chief_port is not None and not 0 < topo.chief_port < 65536:
        named = next((name for name in (CHIEF_PORT, "PET_MASTER_PORT", "MASTER_PORT") if e.get(name)), f"topology from {topo.source}")
        raise UserError(f"port {topo.chief_port} is outside 1..65535", named, "give the chief a port from 1 to 65535")
    if topo.num_nodes > 1 and topo.chief_addr in ("127.0.0.1", "localhost") and not e.get(CHIEF_ADDR):
        raise UserError(f"{topo.num_nodes} nodes but no chief address", f"topology from {topo.source}",
                        f"set {CHIEF_ADDR} to node 0's address")


# ---------------------------------------------------------------------------
# Which replica reports. A trial spread over several pods runs one keeper per
# pod, all with the trial's token; each keeper numbers its records from 1, so
# if two shipped, the manager would take the second one's records for
# duplicates of the first's. Only the chief replica ships; the others keep
# their records in their own spool and status file.
# Set by the Kubernetes renderers: the role whose task 0 reports (the config's
# reportingRole), and each pod's own role and index within it (FrameworkController
# gives these as FC_TASKROLE_NAME and FC_TASK_INDEX; training-operator as pod labels).
CHIEF_ROLE = "TRIALKIT_CHIEF_ROLE"
ROLE = "TRIALKIT_ROLE"
TASK_INDEX = "TRIALKIT_TASK_INDEX"
# The rank of the role's task 0 among all the trial's pods (the pods of the roles before it),
# set by the Kubernetes renderers: a replica's rank is this plus its index in its role.
RANK_OFFSET = "TRIALKIT_RANK_OFFSET"


def replica_rank(environ: Optional[Mapping[str, str]] = None) -> Optional[int]:
    """This pod's rank among the trial's pods (Kubeflow's Master 0 then Workers 1..; FrameworkController's
    task roles in order; AdaptDL's replica rank); None outside a multi-pod trial."""
    e = os.environ if environ is None else environ
    index = e.get(TASK_INDEX) or e.get("FC_TASK_INDEX")
    if e.get(RANK_OFFSET, "").isdigit() and (index or "").isdigit():
        return int(e[RANK_OFFSET]) + int(index)
    rank = e.get(ADAPTDL["replica_rank"], "")
    return int(rank) if rank.isdigit() else None


def is_reporting_replica(environ: Optional[Mapping[str, str]] = None) -> bool:
    e = os.environ if environ is None else environ
    chief_role = e.get(CHIEF_ROLE)
    role = e.get(ROLE) or e.get("FC_TASKROLE_NAME")
    if chief_role and role:
        return role == chief_role and (e.get(TASK_INDEX) or e.get("FC_TASK_INDEX") or "0") == "0"
    tf_config = e.get("TF_CONFIG")
    if tf_config:
        try:
            config = json.loads(tf_config)
            task, cluster = config.get("task") or {}, config.get("cluster") or {}
            kind, index = task.get("type"), int(task.get("index", 0))
        except (ValueError, AttributeError, TypeError):
            return True  # unreadable: better a duplicate risk than a silent trial
        if "chief" in cluster or "master" in cluster:
            return kind in ("chief", "master")
        return kind == "worker" and index == 0
    if e.get("FC_TASKROLE_NAME"):
        return e.get("FC_TASK_INDEX", "0") == "0"
    return _platform_topology(e).get("node_rank") in (None, 0)
