"""horovod with the real horovodrun and gloo on the CPU: 2 workers."""
from __future__ import annotations

import importlib.util

import pytest

from launch_support import PY, Proc, launch_env, write

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("horovod") is None, reason="needs horovod (tools/build_horovod.sh)"),
]

ALLREDUCE = """
import sys, torch, horovod.torch as hvd
hvd.init()
total = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum)
print(f"hvd rank {hvd.rank()} of {hvd.size()} sum {total.item():g}", flush=True)
sys.stdout.buffer.write(b"raw \\xff\\xfe bytes\\n")  # horovodrun alone would choke on these
"""


def test_two_workers_gloo_allreduce(tmp_path):
    script = write(tmp_path, "train.py", ALLREDUCE)
    proc = Proc([PY, "-m", "trialkit.launch.horovod", str(script)], launch_env(tmp_path, TRIALKIT_SLOTS_PER_NODE="2"))
    assert proc.finish(timeout=300) == 0, proc.err[-3000:]
    for rank in (0, 1):
        assert f"[rank={rank}] hvd rank {rank} of 2 sum 3\n".encode() in proc.out
        assert f"[rank={rank}] raw ".encode() + b"\xff\xfe bytes\n" in proc.out


def test_a_failure_stops_the_others_with_sigint(tmp_path):
    script = write(tmp_path, "fail.py", """
    import signal, sys, torch, horovod.torch as hvd
    try:
        hvd.init()
        hvd.allreduce(torch.tensor([0.0]))  # both are up and listening for SIGINT
        if hvd.rank() == 0:
            sys.exit(5)
        signal.pause()
    except KeyboardInterrupt:
        print(f"rank {hvd.rank()} interrupted", flush=True)
        sys.exit(130)
    """)
    proc = Proc([PY, "-m", "trialkit.launch.horovod", str(script)],
                launch_env(tmp_path, TRIALKIT_SLOTS_PER_NODE="2", TRIALKIT_GRACE_SECONDS="10"))
    assert proc.finish(timeout=300) == 5
    assert "[rank=1] rank 1 interrupted\n" in proc.text
    assert proc.err_lines[-1] == (f"trialkit.launch.horovod: rank 0 failed with exit code 5 running {script}; "
                                  f"stopped the other workers")
