#!/usr/bin/env bash
# Run a script on every node of NODE_LIST at once with pdsh, from this repository's directory on each node (the
# repository must be at the same path on every node, e.g. a shared file system).
#
#   bash scripts/post_train/pdsh_train.sh <script> [arguments for the script...]
#
# Environment variables:
#   NODE_LIST        required: comma-separated hosts (names or IPs), the first one is the rendezvous master
#   PDSH_FANOUT      how many nodes pdsh contacts at once (default: all of them)
#   PDSH_RCMD_TYPE   pdsh remote command module (default ssh; needs password-less ssh between nodes)
#   DRY_RUN          1: print the pdsh command instead of running it (DRY_RUN is also forwarded to the nodes)
# Forwarded to every node when set here: NODE_LIST NNODES MASTER_ADDR MASTER_PORT NPROC_PER_NODE OUTPUT_DIR RESUME
# TORCHRUN DRY_RUN PYTHONPATH CUDA_VISIBLE_DEVICES and every NCCL_*, GLOO_*, TORCH_*, HF_* variable. NODE_RANK is
# not forwarded: each node derives its own from its position in NODE_LIST.
set -euo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: bash scripts/post_train/pdsh_train.sh <script> [arguments...]" >&2
  exit 2
fi
if [[ -z "${NODE_LIST:-}" ]]; then
  echo "error: NODE_LIST is not set; give the nodes as a comma-separated list, e.g. NODE_LIST=node1,node2" >&2
  exit 2
fi
script=$1
shift
repo_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
IFS=, read -r -a nodes <<< "$NODE_LIST"

forwarded=()
for name in NODE_LIST NNODES MASTER_ADDR MASTER_PORT NPROC_PER_NODE OUTPUT_DIR RESUME TORCHRUN DRY_RUN PYTHONPATH \
            CUDA_VISIBLE_DEVICES $(compgen -e | grep -E '^(NCCL|GLOO|TORCH|HF)_' || true); do
  if [[ -n "${!name+x}" ]]; then
    forwarded+=("$name=$(printf '%q' "${!name}")")
  fi
done
remote="cd $(printf '%q' "$repo_dir") && env ${forwarded[*]} bash $(printf '%q' "$script")"
for arg in "$@"; do
  remote+=" $(printf '%q' "$arg")"
done

export PDSH_RCMD_TYPE=${PDSH_RCMD_TYPE:-ssh}
cmd=(pdsh -w "$NODE_LIST" -f "${PDSH_FANOUT:-${#nodes[@]}}" "$remote")
if [[ "${DRY_RUN:-0}" == 1 ]]; then
  echo "${cmd[*]:0:5} ${remote@Q}"
  exit 0
fi
if ! command -v pdsh > /dev/null; then
  echo "error: pdsh is not installed (apt-get install pdsh), or run scripts/post_train/train_grpo.sh on each node" >&2
  exit 2
fi
exec "${cmd[@]}"
