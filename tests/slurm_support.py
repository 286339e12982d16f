"""Fake ``srun`` and ``scontrol`` for the Slurm launcher's tests: a one-machine stand-in for an allocation.

``scontrol show hostnames`` prints the comma-separated ``FAKE_SLURM_HOSTS``; ``srun --opt=value ... CMD`` records its
argv (NUL-separated) in ``FAKE_SRUN_ARGV`` and the HF_TOKEN its tasks inherit in ``FAKE_SRUN_ENV``, then runs CMD once
per node (``--nodes=N``) on this machine with that node's SLURM_NODEID, as srun's tasks would, and waits for all.
"""

import os
from pathlib import Path

SCONTROL = r"""#!/usr/bin/env bash
[ "$1 $2" = "show hostnames" ] || { echo "fake scontrol: unsupported $*" >&2; exit 1; }
tr , '\n' <<< "$FAKE_SLURM_HOSTS"
"""

SRUN = r"""#!/usr/bin/env bash
printf '%s\0' "$@" > "$FAKE_SRUN_ARGV"
printf 'HF_TOKEN=%s\n' "${HF_TOKEN-unset}" > "$FAKE_SRUN_ENV"
nodes=1
while [[ "$1" == --* ]]; do
  case "$1" in --nodes=*) nodes=${1#--nodes=} ;; esac
  shift
done
pids=()
for ((node = 0; node < nodes; node++)); do
  SLURM_NODEID=$node SLURM_PROCID=$node SLURM_LOCALID=0 "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
"""


def install_shims(folder: Path) -> Path:
    """Write both shims into ``folder`` (to put first on PATH); returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in (("scontrol", SCONTROL), ("srun", SRUN)):
        (folder / name).write_text(text)
        os.chmod(folder / name, 0o755)
    return folder


def slurm_env(base: dict, shims: Path, hosts, gpus_per_node: int, job_id: str = "12345", **extra) -> dict:
    """``base`` without launcher variables, plus a Slurm job's variables for ``hosts`` and the shims on PATH."""
    launch_vars = ("NODE_LIST", "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "NPROC_PER_NODE", "OUTPUT_DIR",
                   "RESUME", "TORCHRUN", "DRY_RUN", "SAGE_DRY_RUN", "RDZV_ENDPOINT", "RDZV_ID")
    env = {k: v for k, v in base.items() if k not in launch_vars and not k.startswith("SLURM_")}
    env.update(PATH=f"{shims}{os.pathsep}{base.get('PATH', '')}", FAKE_SLURM_HOSTS=",".join(hosts),
               SLURM_JOB_NODELIST=f"fake[{len(hosts)}]", SLURM_JOB_NUM_NODES=str(len(hosts)),
               SLURM_GPUS_ON_NODE=str(gpus_per_node), SLURM_JOB_ID=job_id, **extra)
    return env
