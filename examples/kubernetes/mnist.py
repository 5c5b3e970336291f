"""The Kubernetes examples' trial: an MLP learns MNIST-shaped digits, on one pod or several.

The digits are synthetic (28x28 images of ten classes drawn by a fixed
random teacher), so a pod needs no dataset and no internet. Run alone
(`python3 mnist.py`) it trains on one process; under a launcher
(`python3 -m trialkit.launch.torch_distributed mnist.py`) every process of
every pod joins one torch.distributed world (gloo on CPUs, NCCL on GPUs),
trains on its share of each batch, and rank 0 reports. Each epoch's state is
saved in trialkit.checkpoint_dir(): asked to stop (a pod deleted, a rescale,
a pause) it exits 143 after its last whole epoch, and a restart resumes
there.
"""
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import trialkit

EPOCHS = 5
PIXELS = 28 * 28
CLASSES = 10
CHECKPOINTED = 143  # "checkpointed, start me again": the keeper's and AdaptDL's convention


def digits(samples: int, seed: int):
    """Images whose class a fixed random teacher decides: learnable, not trivially."""
    teacher = torch.randn(PIXELS, CLASSES, generator=torch.Generator().manual_seed(1234))
    x = torch.rand(samples, PIXELS, generator=torch.Generator().manual_seed(seed))
    return x, (x @ teacher).argmax(dim=1)


def agreed(flag: bool, device) -> bool:
    """Whether any process says so: every rank stops after the same epoch."""
    if not dist.is_initialized():
        return flag
    said = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(said, op=dist.ReduceOp.MAX)
    return said.item() > 0


def main() -> None:
    params = {"lr": 0.01, "batch_size": 64}
    params.update(trialkit.get_next_parameter())
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if torch.cuda.is_available() else "cpu"
    if world > 1:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        print(f"rank {rank} of {world} on {os.uname().nodename}", flush=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)  # trials run side by side
    x_train, y_train = digits(4000, seed=1)
    x_valid, y_valid = digits(1000, seed=2)
    model = nn.Sequential(nn.Linear(PIXELS, 128), nn.ReLU(), nn.Linear(128, CLASSES)).to(device)
    trained = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    optimizer = torch.optim.SGD(model.parameters(), lr=params["lr"], momentum=0.9)
    saved = Path(trialkit.checkpoint_dir()) / "mnist.pt"
    start = 0
    if saved.exists():
        state = torch.load(saved, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["epoch"]
        print(f"resuming after epoch {start}", flush=True)
    accuracy = 0.0
    for epoch in range(start, EPOCHS):
        trained.train()
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
        for batch in order.split(params["batch_size"]):
            mine = batch[rank::world]  # this process's share of the batch
            optimizer.zero_grad()
            nn.functional.cross_entropy(trained(x_train[mine].to(device)), y_train[mine].to(device)).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            accuracy = (model(x_valid.to(device)).argmax(dim=1).cpu() == y_valid).float().mean().item()
        if rank == 0:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch + 1}, saved)
            trialkit.report_intermediate_result(accuracy)
        if agreed(trialkit.should_preempt(), device) and epoch + 1 < EPOCHS:
            print(f"checkpointed after epoch {epoch + 1}", flush=True)
            end(CHECKPOINTED)
    if rank == 0:
        trialkit.report_final_result(accuracy)
    end(0)


def end(code: int) -> None:
    if dist.is_initialized():
        dist.barrier()  # rank 0 serves the group's store: nobody leaves before the others are done
        dist.destroy_process_group()
    sys.exit(code)


if __name__ == "__main__":
    main()
