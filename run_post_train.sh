#!/usr/bin/env bash
# One-node SAGE-GRPO post-training of HunyuanVideo-1.5 with the reference's launch flags
# (docs/reference.md#the-launch-scripts-flags): 8 processes, Ulysses sequence parallel 2 (so 4 data-parallel replicas),
# FSDP2 with activation checkpointing, the SAGE SDE, gradient balancing, timestep permutation and the dual (moving +
# step-wise) KL.
#
#   bash run_post_train.sh                                     # new run in ./outputs
#   bash run_post_train.sh --resume_from_checkpoint latest     # extra arguments go to post_train.py, after the
#   bash run_post_train.sh --max_steps 200 --sp_size 4         # flags below, so they override them
#   bash run_post_train.sh --config configs/paper/b_sage_grpo_dual_kl.yaml   # a config wins over the flags below
#
# Environment variables (all optional):
#   NPROC_PER_NODE  processes (one per GPU) on this node; a multiple of --sp_size (default 8)
#   MASTER_PORT     torchrun rendezvous port on this host (default 29500; change it to run two jobs on one node)
#   TORCHRUN        torchrun command (default: .venv/bin/torchrun when present, else torchrun from PATH)
#   DRY_RUN         1: print the torchrun command line instead of running it
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

if [[ -z "${TORCHRUN:-}" ]]; then
  if [[ -x .venv/bin/torchrun ]]; then TORCHRUN=.venv/bin/torchrun; else TORCHRUN=torchrun; fi
fi
export TOKENIZERS_PARALLELISM=false
source scripts/post_train/reference_flags.sh
reference_flags ./outputs
yield_to_config "$@"

cmd=(
  "$TORCHRUN" --nproc_per_node "${NPROC_PER_NODE:-8}" --master_port "${MASTER_PORT:-29500}" post_train.py
  "${REFERENCE_FLAGS[@]}"
  "$@"
)

if [[ "${DRY_RUN:-0}" == 1 ]]; then
  printf '%q ' "${cmd[@]}"
  echo
  exit 0
fi
exec "${cmd[@]}"
