#!/bin/bash
# The #SBATCH header as Digital Research Alliance of Canada docs, PyTorch with multiple GPUs (DDP) writes it.
#SBATCH --nodes 1
#SBATCH --gres=gpu:2          # Request 2 GPU "generic resources".
#SBATCH --tasks-per-node=2   # Request 1 process per GPU.
#SBATCH --mem=8G
#SBATCH --time=0:10:00
#SBATCH --output=%N-%j.out
#SBATCH --account=def-someuser

echo "job $SLURM_JOB_ID ($SLURM_JOB_NAME) on $SLURM_NNODES node(s): $SLURM_JOB_NODELIST"
echo "node $SLURM_NODEID proc $SLURM_PROCID local $SLURM_LOCALID of $SLURM_NTASKS tasks, $SLURM_CPUS_PER_TASK cpus each"
echo "array ${SLURM_ARRAY_JOB_ID:-none} task ${SLURM_ARRAY_TASK_ID:-none}"
srun hostname
