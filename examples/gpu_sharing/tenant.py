"""One tenant of a shared GPU: allocate `ASK` × the GPU's memory, then stay alive printing a line every second.

Run by prove_mps_limits.py as an Astraeus run with `fraction: 0.5`; under CUDA MPS the allocation past the
tenant's CUDA_MPS_PINNED_DEVICE_MEM_LIMIT fails here, in this process."""

import os
import sys
import time

import torch

ask = float(sys.argv[1])
seconds = int(sys.argv[2]) if len(sys.argv) > 2 else 60
total = torch.cuda.get_device_properties(0).total_memory
print(f"tenant: fraction {os.environ.get('ASTRAEUS_GPU_FRACTION')} limit "
      f"{os.environ.get('CUDA_MPS_PINNED_DEVICE_MEM_LIMIT')} threads "
      f"{os.environ.get('CUDA_MPS_ACTIVE_THREAD_PERCENTAGE')} asks {ask:.2f} of {total >> 20} MiB", flush=True)
try:
    block = torch.empty(int(total * ask), dtype=torch.uint8, device="cuda")
except torch.OutOfMemoryError as e:
    print(f"tenant: allocation refused inside this process: {e}", flush=True)
    sys.exit(3)
print("tenant: allocated", flush=True)
for i in range(seconds):
    block[: 1 << 20].add_(1)
    torch.cuda.synchronize()
    print(f"tenant: alive {i}", flush=True)
    time.sleep(1)
