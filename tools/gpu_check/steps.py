"""The seven checks, each as a user meets trialkit: the CLI, the launchers, the SDK in trials.

Each takes the step's context and returns (figures, note) when it holds, or
raises user.Failed saying what did not. check.py runs each in a process of
its own with a time bound. On the CPU (a rehearsal) the trials and workers
train on the CPU with gloo and a stand-in nvidia-smi lists them.
"""
from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import smi
from user import WORKLOADS, Failed, Run, cli, wait_until, write_config

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from bench_launch import medians  # noqa: E402  (the benchmarks' alternating sampler)

IDLE_MIB = 64  # used memory within this of the idle figure counts as idle (the driver's own use moves a little)
RELEASE_BOUND = 10.0  # seconds from the stop to an idle GPU (the same in a rehearsal)
CPU_SLOWER = 6.0  # a rehearsal's bounds, times a GPU's: trials train on a small shared CPU
LAUNCH_SAMPLES = 2  # per launcher, alternating (a cold NCCL start took 11-13 s on an H200)
Result = Tuple[str, str]  # (figures, note)


class Context(NamedTuple):
    dir: Path  # the step's folder (GPU_CHECK_SHARED for its trials)
    cuda: bool  # False: the rehearsal on the CPU
    log: Callable[[str], None]

    def s(self, seconds: float) -> float:
        """A wait's bound, set for a GPU machine: longer in a rehearsal."""
        return seconds if self.cuda else seconds * CPU_SLOWER


# ---------------------------------------------------------------- 1. inventory


def inventory(ctx: Context) -> Result:
    """trialkit.gpus.inventory() equals nvidia-smi -q -x (and NVML), idle and while a CUDA process holds memory."""
    idle = _agree("idle", None)
    gpu0 = idle[0]
    holder = subprocess.Popen([sys.executable, str(WORKLOADS / "holder.py")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env={**os.environ, **_pinned(gpu0)})
    try:
        ctx.log(holder.stdout.readline().strip())
        if smi.wait(lambda now: holder.pid in now[0].processes
                    and (now[0].memory_used or 0) >= (gpu0.memory_used or 0) + 2048, ctx.s(20)) is None:
            raise Failed(f"nvidia-smi never listed the holding process {holder.pid} with 2048 MiB more on GPU 0 "
                         f"(it lists {smi.query()[0].processes})")
        held = _agree("held", holder.pid)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    pid_mib = held[0].processes[holder.pid]
    return (f"{len(idle)} GPU ({gpu0.name}, {gpu0.memory_total} MiB); idle {gpu0.memory_used} MiB used, "
            f"{len(gpu0.processes)} processes; held: pid {holder.pid} {pid_mib} MiB, {held[0].memory_used} MiB used",
            f"trialkit's reading = nvidia-smi -q -x{' = NVML' if smi.nvml() is not None else ''} (uuids, memory, "
            "compute pids), idle and held")


def _agree(when: str, holder: Optional[int]) -> List[smi.Reading]:
    """Read the GPUs trialkit's way, then nvidia-smi's XML and NVML; Failed at the first difference."""
    from trialkit import gpus

    ours = gpus.inventory({})  # every GPU, whatever CUDA_VISIBLE_DEVICES this process has
    xml = smi.query()
    nvml = smi.nvml()
    if not xml:
        raise Failed("nvidia-smi -q -x lists no GPU")
    if [g.index for g in ours] != [r.index for r in xml]:
        raise Failed(f"{when}: trialkit reads GPUs {[g.index for g in ours]}, "
                     f"nvidia-smi -q -x {[r.index for r in xml]}")
    for g, r in zip(ours, xml):
        differ = abs((g.memory_used or 0) - (r.memory_used or 0)) > IDLE_MIB
        if differ or (g.uuid, g.memory_total, sorted(g.pids)) != (r.uuid, r.memory_total, sorted(r.processes)):
            raise Failed(f"{when}: GPU {g.index}: trialkit reads uuid {g.uuid}, {g.memory_total} MiB, "
                         f"{g.memory_used} used, pids {sorted(g.pids)}; nvidia-smi -q -x {r.uuid}, {r.memory_total} "
                         f"MiB, {r.memory_used} used, pids {sorted(r.processes)}")
        if holder is not None and g.index == 0 and holder not in g.pids:
            raise Failed(f"{when}: trialkit does not list the holding process {holder} on GPU 0 ({g.pids})")
    for g, n in zip(ours, nvml or []):
        if (g.uuid, sorted(g.pids)) != (n.uuid, sorted(n.processes)):
            raise Failed(f"{when}: GPU {g.index}: trialkit reads {g.uuid} pids {sorted(g.pids)}, NVML {n.uuid} "
                         f"pids {sorted(n.processes)}")
    return xml


def _pinned(gpu: smi.Reading) -> Dict[str, str]:
    """The environment that gives a process exactly nvidia-smi's GPU `gpu`."""
    return {"CUDA_VISIBLE_DEVICES": gpu.uuid or str(gpu.index)}


# ---------------------------------------------------------------- 2. sharing


def sharing(ctx: Context) -> Result:
    """trialGpuNumber 1, maxTrialNumberPerGpu 2, trialConcurrency 3: two trials on GPU 0 at once, the third waits."""
    gpu0 = smi.query()[0]
    run = Run(write_config(ctx.dir / "exp", trialCommand="python3 share_trial.py", trialConcurrency=3,
                           maxTrialNumber=3, trainingService=_local(ctx, maxTrialNumberPerGpu=2)))
    try:
        pids = wait_until("trials 0 and 1 to train", lambda: _ready(ctx, 0) and _ready(ctx, 1) and
                          {_ready(ctx, 0), _ready(ctx, 1)}, ctx.s(40))
        if smi.wait(lambda now: pids <= set(now[0].processes), ctx.s(10)) is None:
            raise Failed(f"nvidia-smi never listed trials 0 and 1 ({sorted(pids)}) on GPU 0 together "
                         f"(it lists {sorted(smi.query()[0].processes)})")
        together = smi.query()[0]
        reason = wait_until("trial 2 to wait for the GPU in `trialkit trial show`", lambda: _waiting(run.trial(2)),
                            ctx.s(15))
        (ctx.dir / "gate").touch()
        run.finish(ctx.s(30))
        rows = {row["sequence"]: row for row in run.export()}
    finally:
        run.stop(ctx.log)
    _all_succeeded(rows, 3)
    for row in rows.values():
        _saw_its_gpu(row, gpu0, ctx.cuda)
    first, second, third = rows[0], rows[1], rows[2]
    if not (first["final"]["gated"] and second["final"]["gated"]):
        raise Failed("trials 0 and 1 did not train until the check had seen them together")
    freed = min(first["ended"], second["ended"])
    if third["started"] < freed:
        raise Failed(f"trial 2 started {freed - third['started']:.2f} s before trial 0 or 1 ended")
    steps = "/".join(str(rows[n]["final"]["steps"]) for n in range(3))
    return (f"trials 0,1 on GPU 0 at once (nvidia-smi: pids {sorted(pids)}, {together.memory_used} MiB used); "
            f"CUDA_VISIBLE_DEVICES=0, {_device_words(first, ctx.cuda)}; {steps} steps; trial 2 started "
            f"{third['started'] - freed:.2f} s after one ended", f"trial 2 waited: {reason}")


def _local(ctx: Context, **keys: Any) -> Dict[str, Any]:
    """The local platform's section; useActiveGpu where GPU 0 already runs processes the check did not start."""
    section = {"platform": "local", **keys}
    busy = sorted(smi.query()[0].processes)
    if busy:
        ctx.log(f"GPU 0 runs processes {busy} already: useActiveGpu: true, else no trial would start")
        section["useActiveGpu"] = True
    return section


def _ready(ctx: Context, sequence: int) -> Optional[int]:
    """The pid a trial marked once it trained on its device."""
    try:
        return json.loads((ctx.dir / f"ready-{sequence}").read_text())["pid"]
    except (OSError, ValueError):
        return None


def _waiting(trial_id: str) -> Optional[str]:
    """The reason `trialkit trial show` gives for a waiting trial; None while it shows none (or no trial yet)."""
    try:
        shown = cli("trial", "show", trial_id)
    except Failed:
        return None
    status = re.search(r"^status\s+WAITING(?::\s*(.*))?$", shown, re.M)
    if not status:
        return None
    reasons = [status.group(1) or ""] + re.findall(r"WAITING\s+\S+\s+(waiting for .*)$", shown, re.M)[::-1]
    return next((reason.strip() for reason in reasons if "GPU" in reason), None)


def _all_succeeded(rows: Dict[int, Dict[str, Any]], count: int) -> None:
    states = [rows[n]["status"] if n in rows else "absent" for n in range(count)]
    if states != ["SUCCEEDED"] * count:
        raise Failed(f"trials ended {', '.join(states)}, not SUCCEEDED")


def _saw_its_gpu(row: Dict[str, Any], gpu0: smi.Reading, cuda: bool) -> None:
    """The trial was given GPU 0, and CUDA showed it exactly that GPU."""
    final = row["final"]
    if row["gpus"] != [0] or final["visible"] != "0":
        raise Failed(f"trial {row['sequence']} was given GPUs {row['gpus']}, CUDA_VISIBLE_DEVICES={final['visible']!r}")
    if cuda and (final["device_count"] != 1 or _uuid(final["uuid"]) != _uuid(gpu0.uuid)):
        raise Failed(f"trial {row['sequence']} saw {final['device_count']} devices, the first {final['uuid']}; "
                     f"GPU 0 is {gpu0.uuid}")


def _uuid(text: Optional[str]) -> str:
    """A GPU's UUID as hex digits alone: nvidia-smi writes GPU-xxxxxxxx-xxxx-..., torch without the prefix."""
    return re.sub("[^0-9a-f]", "", (text or "").lower().removeprefix("gpu-"))


def _device_words(row: Dict[str, Any], cuda: bool) -> str:
    final = row["final"]
    return f"1 device each ({final['name']})" if cuda else f"on {final['device']} (rehearsal)"


# ---------------------------------------------------------------- 3. release


def release(ctx: Context) -> Result:
    """A trial stopped by `trialkit trial kill`, and one whose keeper is SIGKILLed: the GPU idle again within 10 s."""
    idle = smi.query()[0]
    run = Run(write_config(ctx.dir / "exp", trialCommand="python3 hold_trial.py", maxTrialNumber=2,
                           trainingService=_local(ctx)))
    try:
        (ctx.dir / "go-0").touch()
        pid = _holding(ctx, 0, idle)
        began = time.monotonic()
        cli("trial", "kill", run.trial(0))
        by_sigterm = _back_to_idle(idle, began, "after `trialkit trial kill`")
        _gone(pid)
        (ctx.dir / "go-1").touch()
        pid = _holding(ctx, 1, idle)
        keeper = _keeper(run.row(1))
        began = time.monotonic()
        os.kill(keeper, signal.SIGKILL)
        by_sigkill = _back_to_idle(idle, began, f"after SIGKILL to the keeper {keeper}")
        _gone(pid)
        ctx.log(f"GPU idle {by_sigkill:.2f} s after the keeper's SIGKILL; waiting for `trialkit run` to end")
        run.finish(ctx.s(30))
        states = [run.status(0), run.status(1)]
    finally:
        run.stop(ctx.log)
    return (f"idle {idle.memory_used} MiB, {len(idle.processes)} processes; back to idle after trial kill (SIGTERM) "
            f"in {by_sigterm:.2f} s, after the keeper's SIGKILL in {by_sigkill:.2f} s (bound {RELEASE_BOUND:g} s)",
            f"trials ended {states[0]}, {states[1]}")


def _holding(ctx: Context, sequence: int, idle: smi.Reading) -> int:
    """Wait until the trial holds its memory on GPU 0 as nvidia-smi sees it; its pid."""
    pid = wait_until(f"trial {sequence} to take its GPU memory", lambda: _ready(ctx, sequence), ctx.s(30))
    if smi.wait(lambda now: pid in now[0].processes and (now[0].memory_used or 0) > (idle.memory_used or 0) + 4000,
                ctx.s(10)) is None:
        raise Failed(f"nvidia-smi never listed trial {sequence}'s pid {pid} holding 4 GiB on GPU 0")
    return pid


def _back_to_idle(idle: smi.Reading, began: float, what: str) -> float:
    waited = smi.wait(lambda now: set(now[0].processes) <= set(idle.processes)
                      and (now[0].memory_used or 0) <= (idle.memory_used or 0) + IDLE_MIB, RELEASE_BOUND, started=began)
    if waited is None:
        now = smi.query()[0]
        raise Failed(f"GPU 0 not idle {RELEASE_BOUND:g} s {what}: {now.memory_used} MiB used (idle "
                     f"{idle.memory_used}), processes {sorted(now.processes)}")
    return waited


def _gone(pid: int) -> None:
    """The trial's process is gone (a zombie has let its GPU go, but the check wants none left)."""
    import psutil

    try:
        psutil.Process(pid).wait(timeout=5)
    except psutil.NoSuchProcess:
        return
    except psutil.TimeoutExpired:
        raise Failed(f"the trial's process {pid} still runs after its GPU memory was freed") from None


def _keeper(row: Optional[Dict[str, Any]]) -> int:
    """The running trial's keeper, from the pidfile in its trial dir."""
    from trialkit import layout

    if not row:
        raise Failed("trial 1 is not in the export")
    return int(layout.pidfile_path(Path(row["trial_dir"])).read_text().split()[0])


# ---------------------------------------------------------------- 4. torch_distributed + NCCL


def ddp_nccl(ctx: Context) -> Result:
    """trialkit.launch.torch_distributed runs a DDP step with NCCL; launch -> first CUDA step against torchrun."""
    from trialkit.launch.launcher import free_port

    script = str(WORKLOADS / "ddp_step.py")
    workers = str(len(smi.query())) if ctx.cuda else "1"  # one process per GPU
    environ = {**os.environ, "TRIALKIT_SLOTS_PER_NODE": workers, "TRIALKIT_TRIAL_DIR": str(ctx.dir / "trial")}
    seen: List[Dict[str, Any]] = []

    def measure(argv: Callable[[], List[str]], name: str) -> Callable[[], float]:
        def once() -> float:
            began = time.time()
            info, output = _first_marked(argv(), environ, "FIRST_STEP", ctx.s(30))
            if ctx.cuda and (info["backend"] != "nccl" or not info["device"].startswith("cuda")):
                raise Failed(f"{name}: the step ran with {info['backend']} on {info['device']}")
            seen.append(info)
            ctx.log(f"{name}: {info['time'] - began:.3f} s; {output.strip().splitlines()[-1][:200]}")
            return info["time"] - began
        return once

    ours, peer = medians(LAUNCH_SAMPLES, measure(lambda: [sys.executable, "-m", "trialkit.launch.torch_distributed",
                                                          script], "trialkit.launch.torch_distributed"),
                         measure(lambda: [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", workers,
                                          "--max_restarts", "0", "--master_port", str(free_port("127.0.0.1")),
                                          script], "torchrun"))
    first = seen[0]
    return (f"{first['backend']}, {first['world']} worker(s) on {first['device']}; launch -> first step: "
            f"ours {ours:.2f} s, torchrun {peer:.2f} s (medians of {LAUNCH_SAMPLES}, alternating) -> "
            f"{ours / peer:.2f}x",
            "python -m trialkit.launch.torch_distributed ddp_step.py")


def _first_marked(argv: Sequence[str], environ: Dict[str, str], marker: str, seconds: float) -> Tuple[Dict, str]:
    """Run argv to its end; the JSON after the first `marker` in its output, and the output. Failed unless exit 0."""
    try:
        done = subprocess.run(list(argv), env=environ, capture_output=True, text=True, timeout=seconds,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise Failed(f"`{' '.join(argv[:3])} ...` did not end within {seconds:g} s") from None
    output = done.stdout + done.stderr
    found = re.search(re.escape(marker) + r" (\{.*\})", output)
    if done.returncode != 0 or not found:
        tail = [line for line in output.strip().splitlines() if line.strip()][-1:] or ["no output"]
        raise Failed(f"`{' '.join(argv[:3])} ...` exited {done.returncode}"
                     f"{'' if found else ' before ' + marker}: {tail[0][:300]}")
    return json.loads(found.group(1)), output


# ---------------------------------------------------------------- 5. deepspeed ZeRO-2


def deepspeed_zero2(ctx: Context) -> Result:
    """trialkit.launch.deepspeed runs ZeRO stage 2 steps; FusedAdam JIT-built here, else torch's Adam and why."""
    build = json.loads(Path(os.environ["GPU_CHECK_FUSED_ADAM"]).read_text())
    workers = str(len(smi.query())) if ctx.cuda else "1"
    environ = {**os.environ, "TRIALKIT_SLOTS_PER_NODE": workers, "TRIALKIT_TRIAL_DIR": str(ctx.dir / "trial")}
    argv = [sys.executable, "-m", "trialkit.launch.deepspeed", str(WORKLOADS / "ds_step.py")]
    info, output = _first_marked(argv + ([] if build["built"] else ["--torch-adam"]), environ, "DS_STEP", ctx.s(50))
    ctx.log(output[-3000:])
    wanted = ("FusedAdam",) if build["built"] else ("Adam", "AdamW")  # DeepSpeed's "Adam" is AdamW unless told
    if info["stage"] != 2 or info["optimizer"].rsplit(".", 1)[-1] not in wanted:
        raise Failed(f"ran ZeRO stage {info['stage']} with {info['optimizer']}, not stage 2 with {' or '.join(wanted)}")
    if ctx.cuda and (info["backend"] != "nccl" or not info["device"].startswith("cuda")):
        raise Failed(f"ran with {info['backend']} on {info['device']}")
    if not all(math.isfinite(loss) for loss in info["losses"]):
        raise Failed(f"losses {info['losses']}")
    how = (f"FusedAdam JIT-built here in {build['seconds']:.0f} s (TORCH_CUDA_ARCH_LIST={build['arch']})"
           if build["built"] else f"{info['optimizer']}: FusedAdam not built ({build['reason']})")
    losses = " -> ".join(f"{loss:.4g}" for loss in info["losses"])
    return (f"ZeRO stage 2, 3 steps on {info['device']} ({info['backend']}), losses {losses}", how)


# ---------------------------------------------------------------- 6. checkpoint on SIGTERM


def checkpoint(ctx: Context) -> Result:
    """A CUDA trial paused (SIGTERM) saves and exits 143, PREEMPTED; activated, it resumes with identical weights."""
    run = Run(write_config(ctx.dir / "exp", trialCommand="python3 checkpoint_trial.py", trainingService=_local(ctx)))
    trial = run.trial(0)
    try:
        wait_until("the trial to report 3 steps", lambda: len((run.row(0) or {}).get("intermediate") or []) >= 3,
                   ctx.s(30))
        cli("trial", "pause", trial)
        paused = wait_until("the paused trial to be PREEMPTED", lambda: _in_status(run, 0, "PREEMPTED"), ctx.s(15))
        cli("trial", "activate", trial)
        run.finish(ctx.s(30))
        runs = {row["run"]: row for row in run.export(all_runs=True)}
        logs = cli("trial", "logs", trial)
    finally:
        run.stop(ctx.log)
    if paused["exit_code"] != 143:
        raise Failed(f"the paused trial exited {paused['exit_code']}, not 143")
    last = runs.get(1)
    if not last or last["status"] != "SUCCEEDED" or last["restart_count"] != 1:
        said = last and (last["status"], last["restart_count"])
        raise Failed(f"the resumed run (status, restarts): {said}, not SUCCEEDED after 1 restart")
    saved = re.search(r"saved step (\d+) from (\S+): weights sha256 (\w+)", logs)
    final = last["final"]
    if not saved:
        raise Failed("the trial's log has no `saved step` line")
    if final["loaded"] != saved.group(3):
        raise Failed(f"resumed with weights sha256 {final['loaded']}, saved {saved.group(3)}")
    if ctx.cuda and not (saved.group(2).startswith("cuda") and final["device"].startswith("cuda")):
        raise Failed(f"saved from {saved.group(2)}, resumed on {final['device']}: not the GPU")
    return (f"saved at step {saved.group(1)} from {saved.group(2)}, exit 143, PREEMPTED; resumed on {final['device']} "
            f"after 1 restart, weights sha256 {saved.group(3)[:12]} identical, ended at step {final['step']}",
            "trialkit trial pause / activate")


def _in_status(run: Run, sequence: int, status: str) -> Optional[Dict[str, Any]]:
    """The trial's export row once it is in `status`."""
    row = run.row(sequence)
    return row if row and row["status"] == status else None


# ---------------------------------------------------------------- 7. quickstart


def quickstart(ctx: Context) -> Result:
    """examples/quickstart with trialGpuNumber 1 (2 trials a GPU, 4 trials): they train on the GPU, report, succeed."""
    import yaml

    example = ROOT / "examples" / "quickstart"
    config = yaml.safe_load((example / "config.yml").read_text())
    config.update(searchSpaceFile=str(example / config["searchSpaceFile"]), trialCodeDirectory=str(example),
                  trialGpuNumber=1, maxTrialNumber=4)
    config["trainingService"] = _local(ctx, **{**config["trainingService"], "maxTrialNumberPerGpu": 2})
    path = ctx.dir / "quickstart.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    run = Run(path)
    try:
        code = run.finish(ctx.s(60))
        rows = {row["sequence"]: row for row in run.export()}
        logs = {n: cli("trial", "logs", run.trial(n)) for n in rows}
    finally:
        run.stop(ctx.log)
    _all_succeeded(rows, 4)
    wanted = "training on cuda" if ctx.cuda else "training on cpu"
    for n, row in rows.items():
        if row["gpus"] != [0] or len(row["intermediate"]) != 8 or row["final"] is None:
            raise Failed(f"trial {n}: GPUs {row['gpus']}, {len(row['intermediate'])} epochs reported, final "
                         f"{row['final']}")
        if wanted not in logs[n]:
            raise Failed(f"trial {n}'s log does not say `{wanted}`")
    best = max(row["final"] for row in rows.values())
    took = max(row["ended"] for row in rows.values()) - min(row["started"] for row in rows.values())
    return (f"4 trials SUCCEEDED on GPU 0 ({wanted}), 8 epochs reported each, best accuracy {best:.3f}, "
            f"{took:.0f} s first start to last end; trialkit run exited {code}", "TPE, 2 at a time")


STEPS: List[Tuple[str, Callable[[Context], Result], float]] = [  # name, check, bound in seconds on a GPU
    ("inventory", inventory, 45),
    ("sharing", sharing, 75),
    ("release", release, 75),
    ("ddp_nccl", ddp_nccl, 80),
    ("deepspeed_zero2", deepspeed_zero2, 60),
    ("checkpoint", checkpoint, 60),
    ("quickstart", quickstart, 75),
]
