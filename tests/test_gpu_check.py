"""tools/gpu_check.sh, the check of trialkit's GPU paths, where no GPU is: its table, its reader, a rehearsal.

On this machine (and CI) the script finds no nvidia-smi and prints every line
NO-GPU. Its reader of `nvidia-smi -q -x` is read against a report written from
NVIDIA's format. Then each check is rehearsed on the CPU (`--device cpu`: the
trials and workers train on the CPU, DDP with gloo) under the stand-in
nvidia-smi of gpu_util, which lists each process that took "the GPU" while it
lives: the configs, the trials, the CLI reads and the verdicts run for real,
so the run on a GPU machine cannot die of a typo.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_util import fake_gpus

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "gpu_check.sh"
NAMES = ["inventory", "sharing", "release", "ddp_nccl", "deepspeed_zero2", "checkpoint", "quickstart"]
LINE = re.compile(r"^(\d) \| (\S+)\s* \| (OK|FAIL|NO-GPU)\s* \| (.*) \| (.*)$")
sys.path.insert(0, str(ROOT / "tools" / "gpu_check"))
import smi  # noqa: E402  (the check's reader)


def gpu_check(*args: str, env: dict, timeout: float = 60) -> subprocess.CompletedProcess:
    """`bash tools/gpu_check.sh ARGS` with this Python, to its end."""
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHON": sys.executable, **env})


def table(stdout: str) -> list:
    """The table's lines as (number, name, status, figures, reason), after its one header line."""
    header, *lines = stdout.strip().splitlines()
    assert header.startswith("trialkit GPU check, "), header
    parsed = [LINE.match(line) for line in lines]
    assert all(parsed), lines
    return [m.groups() for m in parsed]


# -- without a GPU -------------------------------------------------------------------------------------------


def test_without_nvidia_smi_every_line_is_no_gpu_in_order_and_it_exits_0(tmp_path):
    path = f"{os.path.dirname(sys.executable)}:/usr/bin:/bin"
    assert shutil.which("nvidia-smi", path=path) is None
    done = gpu_check(env={"PATH": path, "OUT": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert table(done.stdout) == [(str(n), name, "NO-GPU", "", "no nvidia-smi on PATH")
                                  for n, name in enumerate(NAMES, 1)]
    assert done.stdout.endswith("no nvidia-smi on PATH\n") and not done.stderr
    assert (tmp_path / "gpu_check.txt").read_text() == done.stdout


def test_an_nvidia_smi_that_lists_no_gpu_is_no_gpu_too(tmp_path, monkeypatch):
    fake_gpus(tmp_path, monkeypatch, 0)
    done = gpu_check("--only", "sharing,quickstart", env={})
    assert done.returncode == 0, done.stderr
    assert table(done.stdout) == [("2", "sharing", "NO-GPU", "", "nvidia-smi lists no GPU"),
                                  ("7", "quickstart", "NO-GPU", "", "nvidia-smi lists no GPU")]


def test_a_check_that_does_not_exist_is_one_line_and_exit_2():
    done = gpu_check("--only", "inventory,speed", env={})
    assert done.returncode == 2 and not done.stdout
    assert done.stderr.strip().splitlines() == [f"gpu_check: no check named speed (the checks: {', '.join(NAMES)})"]


# -- the reader of nvidia-smi -q -x ---------------------------------------------------------------------------


def test_the_xml_report_reads_in_nvidia_smis_index_order_with_compute_processes_only():
    text = (ROOT / "tests" / "fixtures" / "nvidia_smi" / "q_x_two_gpus.xml").read_text()
    assert smi.parse_xml(text) == [
        # Index: the order of the report (nvidia-smi's), not <minor_number>; the Xorg client (type G) is no
        # compute process, a C+G one is.
        smi.Reading(0, "GPU-5e2f3b1c-7a4d-4c8e-9f10-2b3c4d5e6f70", "NVIDIA H200", 143771, 6694,
                    {4242: 4608, 4343: 2048}),
        smi.Reading(1, "GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9", "NVIDIA H200", 143771, 0, {}),
    ]
    assert smi.driver(text) == {"driver": "580.159.04", "cuda": "13.0"}


@pytest.mark.parametrize("change, said", [
    (("<used>6694 MiB</used>", "<used>6.5 GiB</used>"), "GPU 0 used memory reads '6.5 GiB', not '<number> MiB'"),
    (("<pid>4242</pid>", "<pid>n/a</pid>"), "GPU 0: a process's pid is 'n/a'"),
    (("</nvidia_smi_log>", ""), "nvidia-smi's XML does not parse"),
])
def test_a_report_it_cannot_read_is_an_error_that_says_where(change, said):
    text = (ROOT / "tests" / "fixtures" / "nvidia_smi" / "q_x_two_gpus.xml").read_text().replace(*change)
    with pytest.raises(smi.SmiError, match=re.escape(said)):
        smi.parse_xml(text)


def test_not_applicable_memory_reads_as_none():
    text = ("<nvidia_smi_log><gpu><uuid>GPU-1</uuid><fb_memory_usage><total>N/A</total></fb_memory_usage>"
            "<processes><process_info><pid>7</pid><type>C</type><used_memory>N/A</used_memory></process_info>"
            "</processes></gpu></nvidia_smi_log>")
    assert smi.parse_xml(text) == [smi.Reading(0, "GPU-1", None, None, None, {7: None})]


# -- DeepSpeed's FusedAdam build, where it fails --------------------------------------------------------------


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs deepspeed")
def test_a_fused_adam_build_that_fails_gives_the_deepspeed_check_its_error(tmp_path, monkeypatch):
    import check

    fake_gpus(tmp_path, monkeypatch, 1)
    for name in ("TORCH_CUDA_ARCH_LIST", "CUDA_HOME", "GPU_CHECK_FUSED_ADAM", "TORCH_EXTENSIONS_DIR"):
        monkeypatch.delenv(name, raising=False)  # restored after the test, whatever the build set
    build = check.FusedAdamBuild(tmp_path, tmp_path, cuda=True)
    assert os.environ["TORCH_CUDA_ARCH_LIST"] == "9.0"  # nvidia-smi's compute_cap, for the build and the workers
    build.finish(120)
    result = json.loads(Path(os.environ["GPU_CHECK_FUSED_ADAM"]).read_text())
    # This machine's torch has no CUDA (whatever nvcc lies about): the build fails, its error in one line for
    # the DeepSpeed check to print.
    assert (result["built"], result["arch"]) == (False, "9.0")
    assert re.fullmatch(r"exit 1: \w+Error: .*CUDA.*", result["reason"]), result
    assert "Traceback" in (tmp_path / "fused_adam_build.log").read_text()


# -- the rehearsal on the CPU ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name, figures, reason", [
    pytest.param("inventory", r"1 GPU \(Fake GPU, 16384 MiB\); idle 0 MiB used, 0 processes; held: pid \d+ 2048 MiB, "
                 r"2048 MiB used", r"trialkit's reading = nvidia-smi -q -x .*idle and held", id="inventory"),
    pytest.param("sharing", r"trials 0,1 on GPU 0 at once \(nvidia-smi: pids \[\d+, \d+\], 1024 MiB used\); "
                 r"CUDA_VISIBLE_DEVICES=0.*trial 2 started [\d.]+ s after one ended",
                 r"trial 2 waited: waiting for 1 GPU: 0 of 1 free", id="sharing"),
    pytest.param("release", r"back to idle after trial kill \(SIGTERM\) in [\d.]+ s, after the keeper's SIGKILL in "
                 r"[\d.]+ s \(bound 10 s\)", r"trials ended USER_CANCELED, \w+", id="release"),
    pytest.param("ddp_nccl", r"gloo, 1 worker\(s\) on cpu; launch -> first step: ours [\d.]+ s, torchrun [\d.]+ s "
                 r"\(medians of \d+, alternating\) -> [\d.]+x",
                 r"python -m trialkit.launch.torch_distributed ddp_step.py", id="ddp_nccl"),
    pytest.param("deepspeed_zero2", r"ZeRO stage 2, 3 steps on cpu \(gloo\), losses [\d.e-]+ -> [\d.e-]+ -> [\d.e-]+",
                 r"torch.optim.adamw.AdamW: FusedAdam not built \(rehearsal on the CPU\)", id="deepspeed_zero2"),
    pytest.param("checkpoint", r"saved at step \d+ from cpu, exit 143, PREEMPTED; resumed on cpu after 1 restart, "
                 r"weights sha256 \w{12} identical", r"trialkit trial pause / activate", id="checkpoint"),
    pytest.param("quickstart", r"4 trials SUCCEEDED on GPU 0 \(training on cpu\), 8 epochs reported each",
                 r"TPE, 2 at a time", id="quickstart"),
])
def test_each_check_rehearsed_on_the_cpu_holds(tmp_path, monkeypatch, name, figures, reason):
    claims = tmp_path / "claims"
    claims.mkdir()
    fake_gpus(tmp_path, monkeypatch, 1).set(claims_dir=str(claims))
    out = tmp_path / "out"
    out.mkdir()
    # TMPDIR: the check keeps its work dir when a line fails; here it goes with the test's.
    done = gpu_check("--device", "cpu", "--only", name, timeout=600,
                     env={"GPU_CHECK_FAKE_APPS": str(claims), "OUT": str(out), "TMPDIR": str(tmp_path)})
    log = (out / "gpu_check.log").read_text()
    [(number, named, status, seen, why)] = table(done.stdout)
    assert (named, status) == (name, "OK"), f"{why}\n{log[-4000:]}"
    assert number == str(NAMES.index(name) + 1) and done.returncode == 0
    assert re.search(figures, seen), seen
    assert re.fullmatch(reason, why), why
