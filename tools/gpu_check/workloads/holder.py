"""The inventory check's CUDA process: holds 2 GiB of the GPU until its stdin closes."""
import os
import sys

from common import device, hold

HOLD_MIB = 2048

dev = device(claim_mib=HOLD_MIB)
block = hold(dev, HOLD_MIB)
print(f"holding {HOLD_MIB} MiB on {dev} as pid {os.getpid()}", flush=True)
sys.stdin.read()
