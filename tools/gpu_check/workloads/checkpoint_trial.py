"""The checkpoint check's trial: trains a CUDA model; on SIGTERM saves it and exits 143; restarted, resumes.

The state (model, optimizer, step) goes to trialkit.checkpoint_dir() with the
sha256 of the model's weights in the log; a restart loads it onto the GPU,
checksums the weights it loaded, trains 5 steps more and reports both.
"""
import os
import signal
import sys
import time

import torch

import trialkit
from common import checksum, describe, device, model, train_step

stopping = False


def on_sigterm(signum, frame):
    global stopping
    stopping = True


signal.signal(signal.SIGTERM, on_sigterm)
trialkit.get_next_parameter()
dev = device(claim_mib=512)
net, optimizer = model(dev)
state_file = os.path.join(trialkit.checkpoint_dir(), "state.pt")
step, loaded = 0, None
if os.path.exists(state_file):
    state = torch.load(state_file, map_location=dev)
    net.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    step, loaded = state["step"], checksum(net.state_dict())
    print(f"loaded step {step} onto {dev}: weights sha256 {loaded}", flush=True)
end = step + 5 if loaded else None
deadline = time.monotonic() + 90
while True:
    loss = train_step(net, optimizer, dev)
    step += 1
    trialkit.report_intermediate_result(loss)
    if stopping:
        saved = checksum(net.state_dict())
        partial = state_file + ".partial"
        torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, partial)
        os.replace(partial, state_file)
        print(f"saved step {step} from {dev}: weights sha256 {saved}", flush=True)
        sys.exit(143)  # checkpointed: resume me
    if step == end or time.monotonic() > deadline:
        break
    time.sleep(0.1)
trialkit.report_final_result({"default": loss, "step": step, "loaded": loaded,
                              "restarts": int(os.environ.get("TRIALKIT_RESTART_COUNT", "0")), **describe(dev)})
