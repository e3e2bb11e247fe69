#!/bin/bash
# The #SBATCH header as Stanford Research Computing, Sherlock GPU nodes writes it.
#SBATCH --job-name=gpu_job
#SBATCH -p gpu
#SBATCH -c 10
#SBATCH -G 1
#SBATCH -C GPU_MEM:32GB
#SBATCH --time=2:00:00

echo "job $SLURM_JOB_ID ($SLURM_JOB_NAME) on $SLURM_NNODES node(s): $SLURM_JOB_NODELIST"
echo "node $SLURM_NODEID proc $SLURM_PROCID local $SLURM_LOCALID of $SLURM_NTASKS tasks, $SLURM_CPUS_PER_TASK cpus each"
echo "array ${SLURM_ARRAY_JOB_ID:-none} task ${SLURM_ARRAY_TASK_ID:-none}"
srun hostname
