"""Builds DeepSpeed's FusedAdam with its JIT (nvcc, ninja) into TORCH_EXTENSIONS_DIR; prints BUILT <seconds>.

The check starts it at its beginning, beside the other checks, so the
DeepSpeed check finds the op built; it touches no GPU (CUDA is probed
through NVML), so the sharing checks see no process of its on the GPU.
"""
import time

from deepspeed.ops.op_builder import FusedAdamBuilder

began = time.monotonic()
FusedAdamBuilder().load(verbose=True)
print(f"BUILT {time.monotonic() - began:.1f}", flush=True)
