#!/usr/bin/env bash
# Times the tiny end-to-end path on this machine: write the tiny checkpoint, then generate.py (4 steps, 9 frames,
# 32x48, fp32). Prints seconds for each; the target is well under a minute together on a 2-core CPU.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup_env.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
t0=$(date +%s.%N)
.venv/bin/python scripts/make_tiny_checkpoint.py --output "$work/ckpts" --no_reward > /dev/null
t1=$(date +%s.%N)
.venv/bin/python generate.py --model_path "$work/ckpts" --prompt "A cat walks" --fixed_size 32x48 --video_length 9 \
  --num_inference_steps 4 --dtype fp32 --output_path "$work/cat.mp4" > /dev/null 2>&1
t2=$(date +%s.%N)
python3 -c "print(f'make_tiny_checkpoint.py: {$t1-$t0:.1f} s   generate.py: {$t2-$t1:.1f} s   total: {$t2-$t0:.1f} s')"
