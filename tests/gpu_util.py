"""A stand-in `nvidia-smi` for a machine without GPUs, and trials that log which GPUs they were given.

`fake_gpus(tmp_path, monkeypatch, count)` puts an `nvidia-smi` script first on
PATH that answers the two queries trialkit asks (trialkit.gpus.QUERY_GPUS and
QUERY_APPS) from a JSON table; the test edits the table (`FakeSmi.set`) to add
processes on a GPU, make the tool fail or garble its answer.
"""
from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

SMI = """#!{python}
import json, os, sys
table = json.load(open({table!r}))
args = sys.argv[1:]
if table.get("fail"):
    print(table["fail"])
    sys.exit(9)
gpus = [list(gpu) for gpu in table["gpus"]]
apps = [(uuid, pid, None) for uuid, pid in table.get("apps", [])]
# Processes that took "the GPU" in a rehearsal on the CPU: GPU 0's while they live, their claimed MiB used there.
claims = table.get("claims_dir")
for name in sorted(os.listdir(claims)) if claims else []:
    try:
        state = open(f"/proc/{{name}}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        continue
    if state not in "ZX":
        mib = int(open(os.path.join(claims, name)).read() or 0)
        apps.append((gpus[0][1], int(name), mib))
        gpus[0][3] += mib
if args == ["--query-gpu=index,uuid,memory.total,memory.used,utilization.gpu", "--format=csv,noheader,nounits"]:
    print(table.get("garble") or "\\n".join(", ".join(map(str, gpu)) for gpu in gpus))
elif args == ["--query-compute-apps=gpu_uuid,pid", "--format=csv,noheader"]:
    print("\\n".join(f"{{uuid}}, {{pid}}" for uuid, pid, _ in apps))
elif args == ["--query-gpu=compute_cap", "--format=csv,noheader"]:
    print("\\n".join("9.0" for _ in gpus))
elif args[:2] == ["-q", "-x"]:  # NVIDIA's XML report (nvsmi_device DTD), the parts a reader of it needs
    print('<?xml version="1.0" ?>\\n<nvidia_smi_log>\\n<driver_version>580.00</driver_version>'
          f'<cuda_version>13.0</cuda_version><attached_gpus>{{len(gpus)}}</attached_gpus>')
    for index, uuid, total, used, busy in gpus:
        mine = "".join(f"<process_info><pid>{{pid}}</pid><type>C</type><process_name>python3</process_name>"
                       f"<used_memory>{{'N/A' if mib is None else f'{{mib}} MiB'}}</used_memory></process_info>"
                       for app_uuid, pid, mib in apps if app_uuid == uuid)
        total = "N/A" if str(total).startswith("[") else f"{{total}} MiB"
        print(f'<gpu id="00000000:{{index + 1:02X}}:00.0"><product_name>Fake GPU</product_name><uuid>{{uuid}}</uuid>'
              f'<fb_memory_usage><total>{{total}}</total><reserved>0 MiB</reserved><used>{{used}} MiB</used>'
              f'</fb_memory_usage><processes>{{mine}}</processes></gpu>')
    print("</nvidia_smi_log>")
else:
    print("unexpected arguments", args, file=sys.stderr)
    sys.exit(2)
"""


def uuid(index: int) -> str:
    return f"GPU-{index:08d}-fake"


class FakeSmi:
    def __init__(self, folder: Path, count: int):
        self.folder = folder
        self.table_path = folder / "table.json"
        self.table: Dict[str, Any] = {"gpus": [[i, uuid(i), 16384, 0, 0] for i in range(count)], "apps": []}
        self.save()
        script = folder / "nvidia-smi"
        script.write_text(SMI.format(python=sys.executable, table=str(self.table_path)))
        script.chmod(0o755)

    def set(self, **changes: Any) -> None:
        self.table.update(changes)
        self.save()

    def save(self) -> None:
        partial = self.table_path.with_suffix(".partial")
        partial.write_text(json.dumps(self.table))
        os.replace(partial, self.table_path)


def fake_gpus(tmp_path: Path, monkeypatch, count: int) -> FakeSmi:
    folder = tmp_path / "fake-bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return FakeSmi(folder, count)


# A trial that logs its devices and its start and end (wall-clock) to LOG, one
# JSON line each. It then waits at a barrier: trial number n (in start order)
# finishes only once (n // GROUP + 1) * GROUP trials have started, so a test
# sees GROUP trials overlap or times out; with GATE it waits for that file.
TRIAL = """
import json, os, time
log, group, gate = {log!r}, {group}, {gate!r}
start = time.time()
starts = log + ".starts"
os.makedirs(starts, exist_ok=True)
n = 0
while True:
    try:
        os.close(os.open(os.path.join(starts, str(n)), os.O_CREAT | os.O_EXCL))
        break
    except FileExistsError:
        n += 1
deadline = time.time() + 60
while len(os.listdir(starts)) < (n // group + 1) * group and time.time() < deadline:
    time.sleep(0.01)
while gate and not os.path.exists(gate) and time.time() < deadline:
    time.sleep(0.01)
line = {{"trial": os.environ["TRIALKIT_TRIAL_ID"], "devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "nvidia": os.environ.get("NVIDIA_VISIBLE_DEVICES"), "order": os.environ.get("CUDA_DEVICE_ORDER"),
        "slots": os.environ.get("TRIALKIT_SLOTS_PER_NODE"), "start": start, "end": time.time(),
        "barrier": time.time() < deadline}}
with open(log, "a") as f:
    f.write(json.dumps(line) + "\\n")
"""


def trial_script(log: Path, group: int = 1, gate: Optional[Path] = None) -> str:
    return textwrap.dedent(TRIAL.format(log=str(log), group=group, gate=str(gate) if gate else ""))


def runs(log: Path) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def overlapping(runs_: List[Dict[str, Any]]) -> List[Tuple[Dict[str, Any], Dict[str, Any]]]:
    """Pairs of runs that were alive at the same time."""
    return [(a, b) for i, a in enumerate(runs_) for b in runs_[i + 1:]
            if a["start"] < b["end"] and b["start"] < a["end"]]


def most_at_once(runs_: List[Dict[str, Any]], index: Optional[str] = None) -> int:
    """The most runs alive at one instant (holding `index`, if given)."""
    chosen = [r for r in runs_ if index is None or index in (r["devices"] or "").split(",")]
    return max((sum(1 for r in chosen if r["start"] <= at["start"] < r["end"]) for at in chosen), default=0)
