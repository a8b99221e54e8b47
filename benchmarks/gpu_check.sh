#!/usr/bin/env bash
# One-shot accelerator check: bf16 logit parity against transformers, the ASFT step's tokens/s
# and MFU on a Qwen2.5-VL-7B-shaped model (as many layers as fit one device), and the sampler's
# tokens/s at RL shapes, in one JSON under benchmarks/results/ (see benchmarks/gpu_check.py).
#
#   bash benchmarks/gpu_check.sh                  # on the GPU machine, from any directory
#   bash benchmarks/gpu_check.sh --tiny           # the same phases on a tiny model (a CPU, seconds)
#   PYTHON=.venv/bin/python bash benchmarks/gpu_check.sh --phases=asft_step,sampler
#
# Needs the package installed (pip install -e .); the parity phase also needs torch and
# transformers (pip install -e ".[test]"), on the GPU if torch sees one.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec "${PYTHON:-python}" -m benchmarks.gpu_check "$@"
