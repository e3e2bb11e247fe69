"""The `astra` command line: `astra astraeus …` (runs, logs, drives, machines) and `astra slurm …` (sbatch,
squeue, scancel over the same API)."""
