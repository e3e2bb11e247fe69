#!/bin/bash
# The #SBATCH header as NERSC documentation, preemptible jobs with checkpoint/restart writes it.
#SBATCH -A m1234_g
#SBATCH -C gpu
#SBATCH -q preempt
#SBATCH -N 1
#SBATCH --gpus-per-node=4
#SBATCH --time=24:00:00
#SBATCH --comment=96:00:00
#SBATCH --signal=B:USR1@60
#SBATCH --requeue
#SBATCH --open-mode=append

echo "job $SLURM_JOB_ID ($SLURM_JOB_NAME) on $SLURM_NNODES node(s): $SLURM_JOB_NODELIST"
echo "node $SLURM_NODEID proc $SLURM_PROCID local $SLURM_LOCALID of $SLURM_NTASKS tasks, $SLURM_CPUS_PER_TASK cpus each"
echo "array ${SLURM_ARRAY_JOB_ID:-none} task ${SLURM_ARRAY_TASK_ID:-none}"
srun hostname
