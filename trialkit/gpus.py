"""The machine's GPUs, as nvidia-smi reports them, and how trials share them.

    gpus = inventory()                    # [] on a machine without nvidia-smi
    pool = Pool(gpus_per_trial=1, per_gpu=1, indices=None, use_active=False)
    pool.check(inventory())               # UserError: a trial would never fit
    pool.free(inventory(), ours=lambda pid: ...)              # [0, 2]: the GPUs a trial may be given now
    pool.hold("trial-1", (2,))                                # the home's pool leased it GPU 2 (platforms/pools.py)
    pool.release("trial-1")

The two queries are the ones NNI and Determined read. Only the GPUs named by
a CUDA_VISIBLE_DEVICES set for the control plane are ours to hand out; a
trial is given nvidia-smi's (PCI bus) indices, so it is also given
CUDA_DEVICE_ORDER=PCI_BUS_ID (CUDA's own default order may differ).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from trialkit import env
from trialkit.errors import UserError

NVIDIA_SMI = "nvidia-smi"
QUERY_GPUS = [NVIDIA_SMI, "--query-gpu=index,uuid,memory.total,memory.used,utilization.gpu",
              "--format=csv,noheader,nounits"]
QUERY_APPS = [NVIDIA_SMI, "--query-compute-apps=gpu_uuid,pid", "--format=csv,noheader"]
QUERY_TIMEOUT = 30.0  # nvidia-smi hangs on a wedged driver; a stuck scheduler is worse than an error
ASSIGNMENT_NAME = "gpus.json"  # in a trial's dir: the GPUs its latest start was given
MAX_SAMPLES_BYTES = 256 << 20  # a sample of 8 GPUs (~700 bytes) every 5 s: three weeks of them
SAMPLES_NAME = "gpu_samples.jsonl"  # in a trial's dir: its GPUs' use, one sample a line, while it runs


class Gpu(NamedTuple):
    index: int
    uuid: str
    memory_total: Optional[int]  # MiB; None where nvidia-smi says [N/A]
    memory_used: Optional[int]
    utilization: Optional[int]  # percent
    pids: Tuple[int, ...] = ()  # the compute processes on it


# ---------------------------------------------------------------- inventory


def inventory(environ: Optional[Mapping[str, str]] = None) -> List[Gpu]:
    """The GPUs this process may use, by index: every GPU nvidia-smi lists, or those CUDA_VISIBLE_DEVICES names."""
    e = os.environ if environ is None else environ
    gpus_text = _query(QUERY_GPUS)
    if gpus_text is None:
        return []
    apps_text = _query(QUERY_APPS) or ""
    gpus = parse_gpus(gpus_text)
    pids = parse_apps(apps_text, {gpu.uuid for gpu in gpus})
    gpus = [Gpu(g.index, g.uuid, g.memory_total, g.memory_used, g.utilization, tuple(pids.get(g.uuid, ())))
            for g in gpus]
    return visible(gpus, e.get(env.CUDA_VISIBLE_DEVICES))


def _query(argv: Sequence[str]) -> Optional[str]:
    """nvidia-smi's answer; None when the machine has no nvidia-smi."""
    import subprocess  # here, not at the top: the store's readers (`trialkit trial list`) start without it

    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=QUERY_TIMEOUT,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return None
    except subprocess.TimeoutExpired:
        raise UserError(f"{NVIDIA_SMI} did not answer in {QUERY_TIMEOUT:g} s", NVIDIA_SMI,
                        "check the NVIDIA driver: run nvidia-smi yourself") from None
    except OSError as err:
        raise UserError(f"cannot run {NVIDIA_SMI}: {err.strerror}", NVIDIA_SMI, "check the NVIDIA driver") from None
    if done.returncode != 0:
        said = (done.stdout.strip() + "\n" + done.stderr.strip()).strip().splitlines()
        raise UserError(f"{NVIDIA_SMI} failed (exit {done.returncode})" + (f": {said[0]}" if said else ""),
                        NVIDIA_SMI, "check the NVIDIA driver by running nvidia-smi yourself, or leave "
                        "trialGpuNumber out")
    return done.stdout


def parse_gpus(text: str) -> List[Gpu]:
    """`index, uuid, memory.total, memory.used, utilization.gpu` lines (csv, noheader, nounits)."""
    gpus = []
    for number, line in _lines(text):
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != 5 or not cells[1]:
            raise _garbled(QUERY_GPUS, number, line, "5 fields: index, uuid, memory.total, memory.used, utilization")
        try:
            index = int(cells[0])
            total, used, busy = (_amount(cell) for cell in cells[2:])
        except ValueError:
            raise _garbled(QUERY_GPUS, number, line, "numbers for index, memory and utilization") from None
        gpus.append(Gpu(index, cells[1], total, used, busy))
    if len({gpu.index for gpu in gpus}) != len(gpus):
        raise _garbled(QUERY_GPUS, 0, text.strip(), "each GPU index once")
    return sorted(gpus, key=lambda gpu: gpu.index)


def parse_apps(text: str, uuids: Sequence[str]) -> Dict[str, List[int]]:
    """`gpu_uuid, pid` lines: the pids on each GPU."""
    out: Dict[str, List[int]] = {}
    for number, line in _lines(text):
        cells = [cell.strip() for cell in line.split(",")]
        try:
            if len(cells) != 2 or not cells[0]:
                raise ValueError
            pid = int(cells[1])
        except ValueError:
            raise _garbled(QUERY_APPS, number, line, "a GPU's uuid and a pid") from None
        if cells[0] in uuids:  # else a GPU that left between the two queries
            out.setdefault(cells[0], []).append(pid)
    return out


def _lines(text: str):
    return [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]


def _amount(cell: str) -> Optional[int]:
    if cell.startswith("[") and cell.endswith("]"):  # [N/A], [Not Supported]
        return None
    return int(float(cell))


def _garbled(argv: Sequence[str], number: int, line: str, wanted: str) -> UserError:
    place = f" line {number}" if number else ""
    return UserError(f"cannot read the answer of `{' '.join(argv)}`:{place} {line[:120]!r} (wanted {wanted})",
                     NVIDIA_SMI, "check the NVIDIA driver and nvidia-smi's version: run the query yourself")


def visible(gpus: Sequence[Gpu], devices: Optional[str]) -> List[Gpu]:
    """The GPUs a CUDA_VISIBLE_DEVICES value leaves (all when unset), as CUDA reads it.

    Entries are indices or UUIDs (a unique prefix will do); CUDA ignores
    everything from the first entry that names no device.
    """
    if devices is None:
        return list(gpus)
    out: List[Gpu] = []
    for entry in (part.strip() for part in devices.split(",")):
        found = [g for g in gpus if (entry.isdigit() and g.index == int(entry))
                 or (not entry.isdigit() and entry and g.uuid.startswith(entry))]
        if len(found) != 1 or found[0] in out:
            break
        out.append(found[0])
    return out


def trial_slots(slots_per_trial: Optional[int], trial_gpu_number: Optional[int]) -> int:
    """The slots a trial holds (its TRIALKIT_SLOTS_PER_NODE on the local platform, the job list's count):
    slotsPerTrial, else its GPUs (a launcher starts one worker per GPU), else one."""
    return slots_per_trial or trial_gpu_number or 1


def trial_environ(indices: Sequence[int]) -> Dict[str, str]:
    """A trial's device variables: exactly these GPUs, in nvidia-smi's numbering; none for ()."""
    shown = ",".join(str(index) for index in indices)
    return {
        env.CUDA_VISIBLE_DEVICES: shown,
        env.CUDA_DEVICE_ORDER: "PCI_BUS_ID",
        # NVIDIA's container runtime reads this; "void" is its word for no GPU.
        env.NVIDIA_VISIBLE_DEVICES: shown or "void",
    }


# ---------------------------------------------------------------- sharing


class Pool:
    """Which trial holds which GPU, by NNI's local rules.

    A GPU takes up to `per_gpu` trials; with `use_active` false a GPU that
    runs a process not ours (`ours(pid)` false) takes none. A trial takes
    `gpus_per_trial` GPUs at once or waits. Which of the free ones it gets is
    the home's resource pool's choice (platforms/pools.py), which leases them
    by index across experiments; this pool counts what its experiment holds.
    """

    def __init__(self, gpus_per_trial: int, per_gpu: int = 1, indices: Optional[Sequence[int]] = None,
                 use_active: bool = False):
        self.gpus_per_trial = gpus_per_trial
        self.per_gpu = per_gpu
        self.indices = None if indices is None else tuple(indices)
        self.use_active = use_active
        self.held: Dict[str, Tuple[int, ...]] = {}  # holder -> its GPU indices

    def check(self, gpus: Sequence[Gpu]) -> None:
        """Refuse a pool that can never run one trial: too few GPUs, or gpuIndices naming none of ours."""
        have = [gpu.index for gpu in gpus]
        if self.indices is not None:
            missing = [index for index in self.indices if index not in have]
            if missing:
                raise UserError(f"gpuIndices names GPU {','.join(map(str, missing))}, which is not among this "
                                f"machine's usable GPUs ({_listed(have)})", "trainingService.gpuIndices",
                                "list GPUs that nvidia-smi shows and CUDA_VISIBLE_DEVICES allows")
        pool = len(self._pool(gpus))
        if self.gpus_per_trial > pool:
            where = "gpuIndices" if self.indices is not None else "this machine"
            raise UserError(f"each trial asks for {_gpus(self.gpus_per_trial)} but {where} holds {pool} "
                            f"({_listed([g.index for g in self._pool(gpus)])})", "trialGpuNumber",
                            f"set it to {pool} or less" if pool else "leave it out")  # it: the key as written

    def hold(self, holder: str, indices: Sequence[int]) -> None:
        """Count GPUs a trial holds (leased to it now, or before a control-plane restart)."""
        self.held[holder] = tuple(indices)

    def release(self, holder: str) -> None:
        self.held.pop(holder, None)

    def load(self) -> Dict[int, int]:
        """GPU index -> how many of our trials hold it."""
        out: Dict[int, int] = {}
        for indices in self.held.values():
            for index in indices:
                out[index] = out.get(index, 0) + 1
        return out

    def free(self, gpus: Sequence[Gpu], ours: Callable[[int], bool]) -> List[int]:
        load = self.load()
        return [gpu.index for gpu in self._pool(gpus) if load.get(gpu.index, 0) < self.per_gpu
                and (self.use_active or all(ours(pid) for pid in gpu.pids))]

    def waiting_reason(self, gpus: Sequence[Gpu], ours: Callable[[int], bool]) -> str:
        """Why a trial waits, with the numbers."""
        pool = self._pool(gpus)
        foreign = [] if self.use_active else [g.index for g in pool if not all(ours(pid) for pid in g.pids)]
        text = (f"waiting for {_gpus(self.gpus_per_trial)}: "
                f"{len(self.free(gpus, ours))} of {len(pool)} free")
        if foreign:
            text += f"; GPU {_listed(foreign)} busy with other processes (useActiveGpu: false)"
        return text

    def _pool(self, gpus: Sequence[Gpu]) -> List[Gpu]:
        return [gpu for gpu in gpus if self.indices is None or gpu.index in self.indices]


def _gpus(count: int) -> str:
    return f"{count} GPU" + ("" if count == 1 else "s")


def _listed(indices: Sequence[int]) -> str:
    return ",".join(map(str, indices)) if indices else "none"


# ---------------------------------------------------------------- a trial's share, on disk
# Written before the trial starts, so a control plane that restarts (and the
# CLI) knows which GPUs a running keeper's trial holds.


def write_assignment(trial_dir: Path, indices: Sequence[int]) -> None:
    path = Path(trial_dir) / ASSIGNMENT_NAME
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps({"indices": list(indices)}))
    os.replace(partial, path)


def forget_assignment(trial_dir: Path) -> None:
    """A trial that waits again holds no GPU (its earlier start's are not its now)."""
    (Path(trial_dir) / ASSIGNMENT_NAME).unlink(missing_ok=True)


def read_assignment(trial_dir: Optional[str]) -> Optional[Tuple[int, ...]]:
    """The GPUs a trial's latest start was given; None when it was given none (or no GPU scheduling ran)."""
    if not trial_dir:
        return None
    try:
        data = json.loads(env.read_regular_file(Path(trial_dir) / ASSIGNMENT_NAME, 1 << 20))
        return tuple(int(index) for index in data["indices"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def append_sample(trial_dir: Path, found: Sequence[Gpu], indices: Sequence[int], when: Optional[float] = None) -> None:
    """Add the use of a trial's GPUs, as nvidia-smi just reported it, to the trial's samples."""
    mine = [gpu for gpu in found if gpu.index in indices]
    if not mine:
        return
    sample = {"time": time.time() if when is None else when,
              "gpus": [{"index": g.index, "utilization": g.utilization, "memory_used": g.memory_used,
                        "memory_total": g.memory_total} for g in mine]}
    with open(Path(trial_dir) / SAMPLES_NAME, "a", encoding="utf-8") as f:
        f.write(json.dumps(sample) + "\n")  # one write: a reader sees whole lines


def read_samples(trial_dir: Optional[str]) -> List[Dict]:
    """A trial's GPU samples, oldest first; a line cut short (a crash while writing) is left out."""
    if not trial_dir:
        return []
    try:
        text = env.read_regular_file(Path(trial_dir) / SAMPLES_NAME, MAX_SAMPLES_BYTES).decode("utf-8", "replace")
    except (OSError, ValueError):  # none, no regular file, or more than any trial's samples
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out
