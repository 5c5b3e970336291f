"""One DDP training step on this worker's GPU (NCCL), or the CPU (gloo) when the check rehearses.

Prints `FIRST_STEP <json>` with the wall-clock time the step had finished on
the device: the check's "launch to first CUDA step".
"""
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from common import CUDA, model, train_step

local = int(os.environ["LOCAL_RANK"])
if CUDA:
    torch.cuda.set_device(local)
dev = torch.device("cuda", local) if CUDA else torch.device("cpu")
dist.init_process_group("nccl" if CUDA else "gloo", device_id=dev if CUDA else None)
net, optimizer = model(dev)
ddp = DistributedDataParallel(net, device_ids=[local] if CUDA else None)
loss = train_step(ddp, optimizer, dev)
first = time.time()
print("FIRST_STEP " + json.dumps({"time": first, "loss": loss, "backend": dist.get_backend(), "device": str(dev),
                                  "rank": dist.get_rank(), "world": dist.get_world_size(),
                                  "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}), flush=True)
dist.barrier()
dist.destroy_process_group()
