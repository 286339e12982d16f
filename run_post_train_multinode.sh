#!/usr/bin/env bash
# Multi-node SAGE-GRPO post-training: runs scripts/post_train/train_grpo.sh on every host of NODE_LIST with pdsh.
#
#   NODE_LIST=gpu-node-01,gpu-node-02 bash run_post_train_multinode.sh [extra post_train.py flags...]
#   NODE_LIST=10.0.0.1,10.0.0.2 RESUME=latest bash run_post_train_multinode.sh
#
# Environment variables: see scripts/post_train/pdsh_train.sh (NODE_LIST is required) and
# scripts/post_train/train_grpo.sh (NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT, NPROC_PER_NODE, OUTPUT_DIR, RESUME,
# TORCHRUN, DRY_RUN).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
exec bash scripts/post_train/pdsh_train.sh scripts/post_train/train_grpo.sh "$@"
