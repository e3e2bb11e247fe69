#!/bin/bash
# The #SBATCH header as NERSC documentation, Perlmutter GPU jobs writes it.
#SBATCH -A m1234_g
#SBATCH -C gpu
#SBATCH -q regular
#SBATCH -t 0:30:00
#SBATCH -N 2
#SBATCH --ntasks-per-node=4
#SBATCH -c 32
#SBATCH --gpus-per-task=1
#SBATCH --gpu-bind=none

echo "job $SLURM_JOB_ID ($SLURM_JOB_NAME) on $SLURM_NNODES node(s): $SLURM_JOB_NODELIST"
echo "node $SLURM_NODEID proc $SLURM_PROCID local $SLURM_LOCALID of $SLURM_NTASKS tasks, $SLURM_CPUS_PER_TASK cpus each"
echo "array ${SLURM_ARRAY_JOB_ID:-none} task ${SLURM_ARRAY_TASK_ID:-none}"
srun hostname
