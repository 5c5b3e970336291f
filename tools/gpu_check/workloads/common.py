"""What the check's trials and distributed workers share: their device, markers for the check, a checksum.

GPU_CHECK_DEVICE is cuda on the GPU machine; cpu when the check rehearses on
a machine without one (tests/test_gpu_check.py), where a stand-in nvidia-smi
lists each process that took its "device" here (GPU_CHECK_FAKE_APPS: a
folder of <pid> files holding the MiB it claims) as nvidia-smi lists a CUDA
process, for as long as it lives.
"""
import hashlib
import json
import os
import time
from pathlib import Path

CUDA = os.environ.get("GPU_CHECK_DEVICE", "cuda") == "cuda"
SHARED = Path(os.environ.get("GPU_CHECK_SHARED", "."))  # the step's folder: markers and gates


def device(claim_mib: int = 0):
    """The device to train on: the first GPU CUDA_VISIBLE_DEVICES leaves (a CUDA context on it), or the CPU."""
    import torch

    if CUDA:
        torch.cuda.init()
        return torch.device("cuda", 0)
    fake = os.environ.get("GPU_CHECK_FAKE_APPS")
    if fake:
        Path(fake, str(os.getpid())).write_text(str(claim_mib))
    return torch.device("cpu")


def hold(dev, mib: int):
    """MiB of device memory in use until the process ends (nothing is taken on the CPU: the claim stands for it)."""
    import torch

    if dev.type != "cuda":
        return None
    block = torch.empty(mib << 20, dtype=torch.uint8, device=dev)
    block.fill_(1)
    torch.cuda.synchronize()
    return block


def describe(dev) -> dict:
    """What this process sees of its devices, for the check to compare with nvidia-smi."""
    import torch

    seen = {"device": str(dev), "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "pid": os.getpid()}
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        seen.update(device_count=torch.cuda.device_count(), name=props.name, uuid=str(getattr(props, "uuid", "")))
    return seen


def mark(name: str, **data) -> None:
    """Tell the check something (a file in the step's folder, whole or absent)."""
    partial = SHARED / f".{name}.partial"
    partial.write_text(json.dumps(data))
    os.replace(partial, SHARED / name)


def wait_for(name: str, seconds: float) -> bool:
    """Wait for the check's gate file; False when it did not come in time."""
    deadline = time.monotonic() + seconds
    while not (SHARED / name).exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def checksum(state_dict) -> str:
    """sha256 of a state dict's names and tensor bytes, in name order (the same on any device)."""
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        digest.update(name.encode())
        digest.update(state_dict[name].detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def model(dev, width: int = 256):
    """A small network and its optimizer, the same for every start (seed 0)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1)).to(dev)
    return net, torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)


def train_step(net, optimizer, dev, width: int = 256) -> float:
    """One real step: forward, backward, update; the loss once the device has finished it."""
    import torch

    x = torch.randn(64, width, device=dev)
    optimizer.zero_grad()
    loss = (net(x) - x.sum(dim=1, keepdim=True) / width).square().mean()
    loss.backward()
    optimizer.step()
    return loss.item()  # .item() waits for the device
