#!/bin/bash
# The #SBATCH header as EleutherAI/gpt-neox README, Using Slurm (example sbatch) writes it.
#SBATCH --job-name="neox"
#SBATCH --partition=a40x
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --gres=gpu:8
#SBATCH --cpus-per-task=6
#SBATCH --output=%x_%j.out
#SBATCH --exclusive
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --account=neox

echo "job $SLURM_JOB_ID ($SLURM_JOB_NAME) on $SLURM_NNODES node(s): $SLURM_JOB_NODELIST"
echo "node $SLURM_NODEID proc $SLURM_PROCID local $SLURM_LOCALID of $SLURM_NTASKS tasks, $SLURM_CPUS_PER_TASK cpus each"
echo "array ${SLURM_ARRAY_JOB_ID:-none} task ${SLURM_ARRAY_TASK_ID:-none}"
srun hostname
