#!/bin/bash
# The #SBATCH header as huggingface/accelerate examples/slurm/submit_multinode_fsdp.sh writes it.
#SBATCH --job-name=ift_llama
#SBATCH --nodes=2                   # number of nodes
#SBATCH --ntasks-per-node=1         # number of MP tasks
#SBATCH --gres=gpu:8                # number of GPUs per node
#SBATCH --cpus-per-task=96          # number of cores per tasks
#SBATCH --time=01:59:00             # maximum execution time (HH:MM:SS)
#SBATCH --output=O-%x.%j

echo "job $SLURM_JOB_ID ($SLURM_JOB_NAME) on $SLURM_NNODES node(s): $SLURM_JOB_NODELIST"
echo "node $SLURM_NODEID proc $SLURM_PROCID local $SLURM_LOCALID of $SLURM_NTASKS tasks, $SLURM_CPUS_PER_TASK cpus each"
echo "array ${SLURM_ARRAY_JOB_ID:-none} task ${SLURM_ARRAY_TASK_ID:-none}"
srun hostname
