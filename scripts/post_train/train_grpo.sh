#!/usr/bin/env bash
# One node's part of a multi-node SAGE-GRPO run (started on every node by pdsh_train.sh, or by hand on each node):
# torchrun with the same flags as run_post_train.sh, plus the node layout; the log is tee'd to
# $OUTPUT_DIR/logs/node_<rank>.log.
#
#   NODE_LIST=node1,node2 bash scripts/post_train/train_grpo.sh [extra post_train.py flags...]
#   NNODES=2 NODE_RANK=1 MASTER_ADDR=node1 bash scripts/post_train/train_grpo.sh
#
# Environment variables:
#   NODE_LIST       comma-separated hosts of the job, master first; gives the defaults of the next three
#   NNODES          number of nodes (default: number of hosts in NODE_LIST; required without NODE_LIST)
#   NODE_RANK       this node's rank (default: SLURM_NODEID under srun, else the position of this host in NODE_LIST,
#                   matched against its host names and IP addresses; required without either)
#   MASTER_ADDR     rendezvous host, reachable from every node (default: first host of NODE_LIST)
#   RDZV_ENDPOINT   host:port of a c10d rendezvous (slurm_train.sbatch sets it): torchrun --rdzv_backend c10d
#                   --rdzv_endpoint RDZV_ENDPOINT --rdzv_id RDZV_ID (default sage-grpo) instead of the static
#                   --node_rank/--master_addr/--master_port; MASTER_ADDR is then not needed
#   MASTER_PORT     rendezvous port (default 29500)
#   NPROC_PER_NODE  processes (one per GPU) per node (default 8)
#   OUTPUT_DIR      run directory, passed as --output_dir; logs go to its logs/ (default ./outputs). Set this
#                   rather than passing --output_dir, so that the logs land in the run directory.
#   RESUME          checkpoint directory or "latest": adds --resume_from_checkpoint "$RESUME"
#   TORCHRUN        torchrun command (default: .venv/bin/torchrun when present, else torchrun from PATH)
#   DRY_RUN         1: print the torchrun command line instead of running it
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

fail() {
  echo "error: $*" >&2
  exit 2
}

hosts=()
if [[ -n "${NODE_LIST:-}" ]]; then
  IFS=, read -r -a hosts <<< "$NODE_LIST"
fi

this_node_rank() {
  local names=("$(hostname)" "$(hostname -s 2> /dev/null || true)" "$(hostname -f 2> /dev/null || true)")
  names+=($(hostname -I 2> /dev/null || true))
  local i name
  for i in "${!hosts[@]}"; do
    for name in "${names[@]}"; do
      if [[ -n "$name" && "${hosts[$i]}" == "$name" ]]; then
        echo "$i"
        return 0
      fi
    done
  done
  return 1
}

if [[ -z "${NNODES:-}" ]]; then
  [[ ${#hosts[@]} -gt 0 ]] || fail "NNODES is not set and there is no NODE_LIST to count the nodes from"
  NNODES=${#hosts[@]}
fi
NODE_RANK=${NODE_RANK:-${SLURM_NODEID:-}}
if [[ -z "${NODE_RANK:-}" ]]; then
  [[ ${#hosts[@]} -gt 0 ]] || fail "NODE_RANK is not set and there is no NODE_LIST to find this node in"
  NODE_RANK=$(this_node_rank) || fail "this host ($(hostname)) is not in NODE_LIST=$NODE_LIST; set NODE_RANK"
fi
if [[ -z "${MASTER_ADDR:-}" && -z "${RDZV_ENDPOINT:-}" ]]; then
  [[ ${#hosts[@]} -gt 0 ]] || fail "MASTER_ADDR is not set and there is no NODE_LIST to take the first host from"
  MASTER_ADDR=${hosts[0]}
fi
OUTPUT_DIR=${OUTPUT_DIR:-./outputs}
if [[ -z "${TORCHRUN:-}" ]]; then
  if [[ -x .venv/bin/torchrun ]]; then TORCHRUN=.venv/bin/torchrun; else TORCHRUN=torchrun; fi
fi
export TOKENIZERS_PARALLELISM=false
source scripts/post_train/reference_flags.sh
reference_flags "$OUTPUT_DIR"
yield_to_config "$@"

if [[ -n "${RDZV_ENDPOINT:-}" ]]; then
  rendezvous=(--rdzv_backend c10d --rdzv_endpoint "$RDZV_ENDPOINT" --rdzv_id "${RDZV_ID:-sage-grpo}")
else
  rendezvous=(--node_rank "$NODE_RANK" --master_addr "$MASTER_ADDR" --master_port "${MASTER_PORT:-29500}")
fi
cmd=(
  "$TORCHRUN" --nnodes "$NNODES" --nproc_per_node "${NPROC_PER_NODE:-8}" "${rendezvous[@]}" post_train.py
  "${REFERENCE_FLAGS[@]}"
)
if [[ -n "${RESUME:-}" ]]; then
  cmd+=(--resume_from_checkpoint "$RESUME")
fi
cmd+=("$@")

log_file="$OUTPUT_DIR/logs/node_${NODE_RANK}.log"
if [[ "${DRY_RUN:-0}" == 1 ]]; then
  printf '%q ' "${cmd[@]}"
  echo
  echo "# log: $log_file"
  exit 0
fi
mkdir -p "$(dirname "$log_file")"
"${cmd[@]}" 2>&1 | tee -a "$log_file"
