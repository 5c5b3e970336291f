"""The release check's trial: takes 4 GiB of its GPU and trains until it is stopped (or 120 s pass).

It starts once the check opens `go-<sequence>` (so the GPU's idle figure is
read between trials), marks `ready-<sequence>` with its pid once it holds
the memory, and stops by SIGTERM's default action or with its keeper.
"""
import os
import time

import trialkit
from common import device, hold, mark, model, train_step, wait_for

HOLD_MIB = 4096

trialkit.get_next_parameter()
sequence = trialkit.get_sequence_id()
if not wait_for(f"go-{sequence}", 60):
    raise SystemExit(f"the check did not let trial {sequence} start in 60 s")
dev = device(claim_mib=HOLD_MIB)
block = hold(dev, HOLD_MIB)
net, optimizer = model(dev)
train_step(net, optimizer, dev)
mark(f"ready-{sequence}", pid=os.getpid())
trialkit.report_intermediate_result(1)
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    train_step(net, optimizer, dev)
    time.sleep(0.05)
trialkit.report_final_result(0)  # only when no one stopped it: the check then fails on time
