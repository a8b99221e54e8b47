#!/bin/bash
# Multi-host training on SLURM: one process per node, all of the node's GPUs per process.
# jax.distributed finds the coordinator, process count and id from SLURM's environment
# (guilibra_jax/train/distributed.py); each process reads its own data shard.
#
#   sbatch --nodes=8 launch/slurm_train.sh configs/guilibra_sft.py:qwen3_vl_8b runs/sft8b \
#       --config.model.hf_path=/models/Qwen3-VL-8B-Instruct --config.data.train_files='/data/*.json'
#
# Re-submitting the same command resumes from the latest complete checkpoint. SLURM's
# preemption notice (SIGTERM, --signal below) makes the trainer save and exit.
#SBATCH --job-name=guilibra
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --signal=TERM@300
#SBATCH --output=%x-%j.out
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: sbatch [--nodes=N] launch/slurm_train.sh CONFIG WORKDIR [--config.key=value ...]" >&2
  exit 2
fi
CONFIG=$1
WORKDIR=$2
shift 2
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
srun --kill-on-bad-exit=1 python -m launch.train --config="$CONFIG" --workdir="$WORKDIR" "$@"
