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
#   PDSH_SECRETS_DIR where the secrets file is written (default: .pdsh_env/ in this repository, ignored by git); it
#                    must be a directory at the same path on every node (a shared file system)
#   DRY_RUN          1: print the pdsh command instead of running it (DRY_RUN is also forwarded to the nodes)
# Forwarded to every node when set here: NODE_LIST NNODES MASTER_ADDR MASTER_PORT NPROC_PER_NODE OUTPUT_DIR RESUME
# TORCHRUN DRY_RUN PYTHONPATH CUDA_VISIBLE_DEVICES HUGGING_FACE_HUB_TOKEN and every NCCL_*, GLOO_*, TORCH_*, HF_*,
# WANDB_*, SWANLAB_* variable. NODE_RANK is not forwarded: each node derives its own from its position in NODE_LIST.
#
# Secrets never travel on a command line (where ps shows them on every host). These go through the secrets file:
# every HF_*, WANDB_* and SWANLAB_* variable (hub endpoints, tracker keys and hosts, often with credentials in them),
# any forwarded variable whose name contains TOKEN, KEY, SECRET, PASSWORD or CREDENTIAL, and any whose value holds a
# URL with a user name or password (scheme://user:pass@host). They are written as `export NAME=value` lines to a file
# of mode 0600 in PDSH_SECRETS_DIR, which the remote shell sources (`. FILE`) before running the script, so the values
# reach the script through its environment. The file is deleted when pdsh exits (or this script is killed by a
# catchable signal); its name holds this host and the launcher's pid (env.HOST.PID.XXXXXXXX), so the next start on
# this host deletes the files of launchers that are gone (a SIGKILLed launcher cannot delete its own). DRY_RUN=1 prints
# the command with the file's name pattern and writes no file. Other variables are passed as `env NAME=value` on the
# remote command line.
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
dry_run=0
[[ "${DRY_RUN:-0}" == 1 ]] && dry_run=1
if [[ $dry_run == 0 ]] && ! command -v pdsh > /dev/null; then
  echo "error: pdsh is not installed (apt-get install pdsh), or run scripts/post_train/train_grpo.sh on each node" >&2
  exit 2
fi

# is_secret NAME VALUE: does this variable go through the secrets file?
is_secret() {
  case ${1^^} in
    HF_* | WANDB_* | SWANLAB_* | *TOKEN* | *KEY* | *SECRET* | *PASSWORD* | *CREDENTIAL*) return 0 ;;
  esac
  [[ "$2" =~ ://[^/@]*@ ]]  # credentials in a URL: scheme://user:pass@host
}

host=$(hostname | tr -c "A-Za-z0-9\n-" _)  # no dots: the name splits at them
secrets_dir=${PDSH_SECRETS_DIR:-$repo_dir/.pdsh_env}
[[ "$secrets_dir" == /* ]] || secrets_dir=$PWD/$secrets_dir
# Files of launchers on this host that are gone (SIGKILL skips the EXIT trap): env.HOST.PID.XXXXXXXX, PID not running.
# Files of other hosts are left alone: their launchers may still be running.
if [[ -d "$secrets_dir" ]]; then
  for stale in "$secrets_dir/env.$host".*.*; do
    [[ -f "$stale" ]] || continue
    pid=${stale#"$secrets_dir/env.$host."}
    pid=${pid%%.*}
    if [[ "$pid" =~ ^[0-9]+$ ]] && ! kill -0 "$pid" 2> /dev/null && [[ ! -d /proc/$pid ]]; then
      rm -f "$stale" && echo "# removed the stale secrets file $stale (its launcher, pid $pid, is gone)" >&2
    fi
  done
fi

forwarded=()
secrets=()
for name in NODE_LIST NNODES MASTER_ADDR MASTER_PORT NPROC_PER_NODE OUTPUT_DIR RESUME TORCHRUN DRY_RUN PYTHONPATH \
            CUDA_VISIBLE_DEVICES HUGGING_FACE_HUB_TOKEN \
            $(compgen -e | grep -E '^(NCCL|GLOO|TORCH|HF|WANDB|SWANLAB)_' || true); do
  if [[ -n "${!name+x}" ]]; then
    if is_secret "$name" "${!name}"; then
      secrets+=("$name")
    else
      forwarded+=("$name=$(printf '%q' "${!name}")")
    fi
  fi
done

remote="cd $(printf '%q' "$repo_dir")"
secrets_file=
if [[ ${#secrets[@]} -gt 0 ]]; then
  if [[ $dry_run == 1 ]]; then
    secrets_file=$secrets_dir/env.$host.$$.XXXXXXXX  # the name pattern: a dry run writes no file
  else
    if ! (umask 077 && mkdir -p "$secrets_dir") || [[ ! -w "$secrets_dir" ]]; then
      echo "error: cannot write the secrets file to $secrets_dir; set PDSH_SECRETS_DIR to a writable directory" \
           "at the same path on every node" >&2
      exit 2
    fi
    secrets_dir=$(cd "$secrets_dir" && pwd)
    secrets_file=$(umask 077 && mktemp "$secrets_dir/env.$host.$$.XXXXXXXX")
    trap 'rm -f "$secrets_file"' EXIT
    (
      umask 077
      for name in "${secrets[@]}"; do
        printf 'export %s=%q\n' "$name" "${!name}"
      done > "$secrets_file"
    )
  fi
  remote+=" && . $(printf '%q' "$secrets_file")"
fi
remote+=" && env ${forwarded[*]} bash $(printf '%q' "$script")"
for arg in "$@"; do
  remote+=" $(printf '%q' "$arg")"
done

export PDSH_RCMD_TYPE=${PDSH_RCMD_TYPE:-ssh}
cmd=(pdsh -w "$NODE_LIST" -f "${PDSH_FANOUT:-${#nodes[@]}}" "$remote")
if [[ $dry_run == 1 ]]; then
  echo "${cmd[*]:0:5} ${remote@Q}"
  if [[ -n "$secrets_file" ]]; then
    echo "# ${secrets[*]}: sourced from $secrets_file (mode 0600, created at launch, deleted when pdsh exits)" >&2
  fi
  exit 0
fi
# pdsh runs as a child (not exec) so that the EXIT trap deletes the secrets file once every node has finished
status=0
"${cmd[@]}" || status=$?
exit $status
