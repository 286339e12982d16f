#!/usr/bin/env bash
# Quickstart demo: set up ./.venv, write the tiny random-weight checkpoint, and run SAGE-GRPO post-training on the CPU
# with configs/tiny_cpu.yaml (a few minutes on 2 cores). Extra arguments are post_train.py flags that override the
# config, for example: bash scripts/demo_cpu.sh --max_steps 5
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup_env.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ ! -f ckpts/tiny/.complete ]; then
  .venv/bin/python scripts/make_tiny_checkpoint.py --output ckpts/tiny
fi
exec .venv/bin/python post_train.py --config configs/tiny_cpu.yaml "$@"
