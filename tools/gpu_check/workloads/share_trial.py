"""The sharing check's trial: real training steps on the GPU it was given, until the check has seen it share.

It marks `ready-<sequence>` once it trains, trains on until the check opens
`gate` (it has seen two trials on GPU 0 and the third waiting), then 20 steps
more, and reports what it saw of its devices with its own start and end.
"""
import os
import time

import trialkit
from common import describe, device, mark, model, train_step, wait_for, SHARED

started = time.time()
trialkit.get_next_parameter()
sequence = trialkit.get_sequence_id()
dev = device(claim_mib=512)
net, optimizer = model(dev)
steps, loss = 1, train_step(net, optimizer, dev)
mark(f"ready-{sequence}", pid=os.getpid())
deadline = time.monotonic() + 90
while not (SHARED / "gate").exists() and time.monotonic() < deadline:
    loss = train_step(net, optimizer, dev)
    steps += 1
    if steps % 50 == 0:
        trialkit.report_intermediate_result(loss)
    time.sleep(0.005)  # steps, not a spinning CPU: three trials and the check share the machine
gated = wait_for("gate", 0)
for _ in range(20):
    loss = train_step(net, optimizer, dev)
    steps += 1
trialkit.report_final_result({"default": loss, "steps": steps, "gated": gated, "start": started, "end": time.time(),
                              **describe(dev)})
