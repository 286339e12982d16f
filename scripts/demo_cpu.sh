#!/usr/bin/env bash
# Quickstart demo: set up ./.venv, install the committed toy-world checkpoint (assets/toy_ckpt -> ckpts/toy, each file
# checked against its sha256), and run SAGE-GRPO post-training on the CPU with configs/toy_cpu.yaml; ends with a
# picture of the run (outputs/demo/run.png).
# Extra arguments are post_train.py flags that override the config, for example: bash scripts/demo_cpu.sh --max_steps 5
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup_env.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/python scripts/make_toy_checkpoint.py --committed --output ckpts/toy
.venv/bin/python post_train.py --config configs/toy_cpu.yaml "$@"
.venv/bin/python scripts/demo_report.py --config configs/toy_cpu.yaml "$@"
