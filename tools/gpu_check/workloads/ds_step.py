"""Three ZeRO stage 2 steps under DeepSpeed on this worker's GPU: FusedAdam, or torch's Adam with --torch-adam.

Prints `DS_STEP <json>`: the ZeRO stage, the optimizer that ran, the losses.
"""
import json
import os
import sys

import deepspeed
import torch

WIDTH = 512

torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH))
config = {
    "train_micro_batch_size_per_gpu": 8,
    "zero_optimization": {"stage": 2},
    "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": "--torch-adam" in sys.argv}},
}
engine, optimizer, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=config)
x = torch.randn(8, WIDTH, device=engine.device)
losses = []
for _ in range(3):
    loss = engine(x).square().mean()
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
inner = getattr(optimizer, "optimizer", optimizer)  # ZeRO wraps the optimizer it was given
print("DS_STEP " + json.dumps({"stage": engine.zero_optimization_stage(), "optimizer": type(inner).__module__ + "." +
                               type(inner).__name__, "losses": losses, "device": str(engine.device),
                               "backend": torch.distributed.get_backend(), "rank": int(os.environ["RANK"])}),
      flush=True)
torch.distributed.barrier()
torch.distributed.destroy_process_group()
