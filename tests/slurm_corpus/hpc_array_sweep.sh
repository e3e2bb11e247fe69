#!/bin/bash
# The #SBATCH header as a job-array hyperparameter sweep as university cluster docs write it (Princeton Research Computing, job arrays) writes it.
#SBATCH --job-name=visu           # create a short name for your job
#SBATCH --output=slurm-%A.%a.out  # STDOUT file
#SBATCH --error=slurm-%A.%a.err   # STDERR file
#SBATCH --nodes=1                 # node count
#SBATCH --ntasks=1                # total number of tasks across all nodes
#SBATCH --cpus-per-task=4         # cpu-cores per task
#SBATCH --mem-per-cpu=4G          # memory per cpu-core
#SBATCH --gres=gpu:1              # number of gpus per node
#SBATCH --time=00:10:00           # total run time limit (HH:MM:SS)
#SBATCH --array=0-9               # job array with index values 0..9
#SBATCH --mail-type=all           # send email on job start, end and fault
#SBATCH --mail-user=<YourNetID>@princeton.edu

echo "job $SLURM_JOB_ID ($SLURM_JOB_NAME) on $SLURM_NNODES node(s): $SLURM_JOB_NODELIST"
echo "node $SLURM_NODEID proc $SLURM_PROCID local $SLURM_LOCALID of $SLURM_NTASKS tasks, $SLURM_CPUS_PER_TASK cpus each"
echo "array ${SLURM_ARRAY_JOB_ID:-none} task ${SLURM_ARRAY_TASK_ID:-none}"
srun hostname
