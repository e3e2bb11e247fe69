#!/bin/bash
# The #SBATCH header as ray-project/ray doc/source/cluster/doc_code/slurm-basic.sh writes it.
#SBATCH --job-name=test
#SBATCH --cpus-per-task=5
#SBATCH --mem-per-cpu=1GB
#SBATCH --nodes=4
#SBATCH --exclusive
#SBATCH --tasks-per-node=1
#SBATCH --gpus-per-task=1
#SBATCH --time=00:30:00

echo "job $SLURM_JOB_ID ($SLURM_JOB_NAME) on $SLURM_NNODES node(s): $SLURM_JOB_NODELIST"
echo "node $SLURM_NODEID proc $SLURM_PROCID local $SLURM_LOCALID of $SLURM_NTASKS tasks, $SLURM_CPUS_PER_TASK cpus each"
echo "array ${SLURM_ARRAY_JOB_ID:-none} task ${SLURM_ARRAY_TASK_ID:-none}"
srun hostname
