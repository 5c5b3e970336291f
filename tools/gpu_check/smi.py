"""The check's own reading of the GPUs, apart from trialkit's: `nvidia-smi -q -x` and NVML.

    readings = query()                       # [Reading(index, uuid, name, total, used, processes)]
    readings = parse_xml(text)               # the same, from saved XML
    nvml()                                   # NVML's view through pynvml, or None where it cannot be loaded

trialkit reads nvidia-smi's CSV queries (trialkit/gpus.py); this reads the XML
report (NVIDIA's nvsmi_device DTD: one <gpu> a device, in nvidia-smi's index
order) and NVML, so a mistake in trialkit's parsing cannot hide in both.
Memory is in MiB, as nvidia-smi prints it; `used` leaves out what the driver
reserves, as nvidia-smi's own `memory.used` does.
"""
from __future__ import annotations

import subprocess
import time
import xml.etree.ElementTree as ElementTree
from typing import Callable, Dict, List, NamedTuple, Optional

QUERY_SECONDS = 20.0  # a wedged driver makes nvidia-smi hang: then the check says so


class Reading(NamedTuple):
    index: int
    uuid: Optional[str]
    name: Optional[str]
    memory_total: Optional[int]  # MiB; None where the report says N/A
    memory_used: Optional[int]
    processes: Dict[int, Optional[int]]  # compute processes: pid -> MiB they use (None: N/A)


class SmiError(Exception):
    """nvidia-smi did not answer, or answered what this cannot read."""


def query() -> List[Reading]:
    """The GPUs now, from the whole XML report (driver 580's nvidia-smi refuses -d beside -x: seen on an H200)."""
    argv = ["nvidia-smi", "-q", "-x"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=QUERY_SECONDS, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SmiError("no nvidia-smi on PATH") from None
    except subprocess.TimeoutExpired:
        raise SmiError(f"`{' '.join(argv)}` did not answer in {QUERY_SECONDS:g} s") from None
    if done.returncode != 0:
        raise SmiError(f"`{' '.join(argv)}` exited {done.returncode}: {(done.stdout + done.stderr).strip()[:200]}")
    return parse_xml(done.stdout)


def parse_xml(text: str) -> List[Reading]:
    try:
        root = ElementTree.fromstring(text)
    except ElementTree.ParseError as err:
        raise SmiError(f"nvidia-smi's XML does not parse: {err}") from None
    if root.tag != "nvidia_smi_log":
        raise SmiError(f"nvidia-smi's XML starts with <{root.tag}>, not <nvidia_smi_log>")
    return [_gpu(index, gpu) for index, gpu in enumerate(root.findall("gpu"))]


def _gpu(index: int, gpu: ElementTree.Element) -> Reading:
    processes: Dict[int, Optional[int]] = {}
    for info in gpu.findall("processes/process_info"):
        if "C" not in (info.findtext("type") or "C"):  # G: a graphics client, not in --query-compute-apps
            continue
        pid = info.findtext("pid", "").strip()
        if not pid.isdigit():
            raise SmiError(f"GPU {index}: a process's pid is {pid!r}")
        processes[int(pid)] = _mib(info.findtext("used_memory"), f"GPU {index} pid {pid} used_memory")
    return Reading(index, _text(gpu, "uuid"), _text(gpu, "product_name"),
                   _mib(gpu.findtext("fb_memory_usage/total"), f"GPU {index} total memory"),
                   _mib(gpu.findtext("fb_memory_usage/used"), f"GPU {index} used memory"), processes)


def _text(gpu: ElementTree.Element, tag: str) -> Optional[str]:
    text = (gpu.findtext(tag) or "").strip()
    return text or None


def _mib(text: Optional[str], what: str) -> Optional[int]:
    """'4107 MiB' -> 4107; 'N/A' and absent -> None."""
    if text is None or text.strip() in ("", "N/A", "[N/A]", "Not Supported", "[Not Supported]"):
        return None
    number, _, unit = text.strip().partition(" ")
    if unit != "MiB" or not number.isdigit():
        raise SmiError(f"{what} reads {text!r}, not '<number> MiB'")
    return int(number)


def driver(text: str) -> Dict[str, str]:
    """The report's driver and CUDA versions."""
    root = ElementTree.fromstring(text)
    return {"driver": root.findtext("driver_version", "?"), "cuda": root.findtext("cuda_version", "?")}


def nvml() -> Optional[List[Reading]]:
    """NVML's view (pynvml, from nvidia-ml-py): uuids, total memory and compute pids; None without pynvml.

    Used memory is left out (None): NVML's first memory call counts the
    driver's reservation as used, nvidia-smi does not.
    """
    try:
        import pynvml
    except ImportError:
        return None
    pynvml.nvmlInit()
    try:
        out = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            total = pynvml.nvmlDeviceGetMemoryInfo(handle).total >> 20
            procs = {p.pid: (p.usedGpuMemory >> 20 if p.usedGpuMemory else None)
                     for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
            out.append(Reading(index, _decoded(uuid), _decoded(name), total, None, procs))
        return out
    finally:
        pynvml.nvmlShutdown()


def _decoded(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def wait(condition: Callable[[List[Reading]], bool], seconds: float,
         started: Optional[float] = None) -> Optional[float]:
    """Poll the GPUs until `condition(readings)` holds: the seconds since `started` (default: now), None past it."""
    began = time.monotonic() if started is None else started
    while True:
        if condition(query()):
            return time.monotonic() - began
        if time.monotonic() - began > seconds:
            return None
        time.sleep(0.05)
