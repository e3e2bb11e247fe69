"""Slurm's `srun` and `scontrol` inside a worker: small POSIX sh programs (bin/), no Python needed in the image.

Every worker has them first on its PATH, on both runtimes: every worker gets Slurm's job environment
(astraeus.server.agents.slurm_env), so a script written for Slurm works whether `astra slurm sbatch` or the API
submitted it, and no real srun could work inside a worker anyway (no slurmctld to ask). The process runtime shows
BIN read-only at its own path in the worker's view (shim.exposed_paths); the container runtime binds it read-only
at oci_spec.TOOLS_DIR.

  srun [options] CMD...       runs this machine's tasks of the step (each worker runs the batch script, so the
                              machines together run all of them), with SLURM_PROCID, SLURM_LOCALID, SLURM_STEP_ID
                              per task; waits for all; exits with the highest exit code of its tasks
  scontrol show hostnames [L] expands a Slurm hostlist (default $SLURM_JOB_NODELIST), one name a line; other
                              subcommands go to `astra slurm scontrol` where astra is on PATH
"""

from __future__ import annotations

import os

BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin")
