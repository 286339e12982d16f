"""The Slurm launcher's composed commands (dry runs under a faked Slurm job): docs/launching.md's 4 nodes x 8 GPUs block,
the resume of a requeued job, the checks before launching."""

import os
import re
from pathlib import Path

from procs import run_group
from slurm_support import install_shims, slurm_env

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "scripts/post_train/slurm_train.sbatch"
FOUR_NODES = [f"gpu-node-0{i}" for i in range(1, 5)]


def dry_run(tmp_path, hosts, *args, **extra):
    """The script's output under a Slurm job on ``hosts`` (8 GPUs each), printing instead of running."""
    settings = {"SAGE_DRY_RUN": "1", "TORCHRUN": ".venv/bin/torchrun", "SLURM_SUBMIT_DIR": str(REPO_ROOT), **extra}
    env = slurm_env(dict(os.environ), install_shims(tmp_path / "bin"), hosts, 8, **settings)
    proc = run_group(["bash", str(REPO_ROOT / SCRIPT), *args], env=env, cwd=tmp_path, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc


def documented_block() -> str:
    text = (REPO_ROOT / "docs" / "launching.md").read_text()
    section = text.split("## Many nodes (Slurm)", 1)[1]
    return re.search(r"```text\n(.*?)\n```", section, re.S).group(1)


def test_four_nodes_dry_run_is_the_documented_block(tmp_path):
    proc = dry_run(tmp_path, FOUR_NODES, OUTPUT_DIR="./outputs/run1")
    printed = "\n".join(line.rstrip() for line in proc.stdout.strip().splitlines())
    assert printed == documented_block()
    srun, _, torchrun, log = printed.splitlines()
    assert srun == ("srun --nodes=4 --ntasks-per-node=1 --kill-on-bad-exit=1 --export=ALL "
                    "bash scripts/post_train/train_grpo.sh")
    assert torchrun.startswith(".venv/bin/torchrun --nnodes 4 --nproc_per_node 8 --rdzv_backend c10d "
                               "--rdzv_endpoint gpu-node-01:29500 --rdzv_id 12345 post_train.py ")
    assert "--resume_from_checkpoint" not in torchrun and log == "# log: ./outputs/run1/logs/node_0.log"


def test_dry_run_flag_extra_arguments_and_no_secret(tmp_path):
    proc = dry_run(tmp_path, FOUR_NODES[:2], "--dry-run", "--max_steps", "5", SAGE_DRY_RUN="0",
                   HF_TOKEN="secret-123", WANDB_API_KEY="secret-456", MASTER_PORT="4321", NPROC_PER_NODE="4")
    srun, _, torchrun, _ = proc.stdout.strip().splitlines()
    assert srun.endswith("train_grpo.sh --max_steps 5") and "--nodes=2 " in srun
    assert "--nnodes 2 --nproc_per_node 4 " in torchrun and "--rdzv_endpoint gpu-node-01:4321 " in torchrun
    assert torchrun.rstrip().endswith("--max_steps 5")
    assert "secret" not in proc.stdout + proc.stderr


def test_a_requeued_job_resumes_from_the_latest_checkpoint(tmp_path):
    """A restart continues with auto: the latest checkpoint, or (none saved yet) the run from step 0 in place, which
    post_train.py allows once run_config.yaml defines the same run (unit/test_trust_readback.py); a fixed 'latest'
    failed there with "already holds a run"."""
    run_dir = tmp_path / "run"
    first = dry_run(tmp_path, FOUR_NODES, OUTPUT_DIR=str(run_dir), SLURM_RESTART_COUNT="1")
    assert "--resume_from_checkpoint auto" in first.stdout  # nothing saved yet: the run again, in place
    (run_dir / "checkpoint-20").mkdir(parents=True)
    fresh = dry_run(tmp_path, FOUR_NODES, OUTPUT_DIR=str(run_dir))
    assert "--resume_from_checkpoint" not in fresh.stdout  # a first start never resumes by itself
    requeued = dry_run(tmp_path, FOUR_NODES, OUTPUT_DIR=str(run_dir), SLURM_RESTART_COUNT="2")
    assert "--resume_from_checkpoint auto" in requeued.stdout
    assert "restart 2 of job 12345: resuming from the latest checkpoint" in requeued.stderr
    explicit = dry_run(tmp_path, FOUR_NODES, OUTPUT_DIR=str(run_dir), SLURM_RESTART_COUNT="2",
                       RESUME=str(run_dir / "checkpoint-20"))
    assert f"--resume_from_checkpoint {run_dir / 'checkpoint-20'}" in explicit.stdout


def test_outside_a_job_it_says_so(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = run_group(["bash", str(REPO_ROOT / SCRIPT)], env=env, timeout=30)
    assert proc.returncode == 2 and "SLURM_JOB_NODELIST is not set: submit with sbatch" in proc.stderr


def test_dry_run_outside_an_allocation_prints_the_commands_with_placeholders(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(SAGE_DRY_RUN="1", TORCHRUN="torchrun", OUTPUT_DIR="./outputs/run1")
    for nodes in (None, "4"):
        settings = dict(env, SLURM_JOB_NUM_NODES=nodes) if nodes else env
        proc = run_group(["bash", str(REPO_ROOT / SCRIPT), "--max_steps", "5"], env=settings, cwd=tmp_path,
                         timeout=30)
        assert proc.returncode == 0, proc.stderr
        srun, _, torchrun, log = proc.stdout.strip().splitlines()
        count = nodes or "1"  # sbatch's default: one node
        assert srun == (f"srun --nodes={count} --ntasks-per-node=1 --kill-on-bad-exit=1 --export=ALL "
                        "bash scripts/post_train/train_grpo.sh --max_steps 5")
        assert torchrun.startswith(f"torchrun --nnodes {count} --nproc_per_node 8 --rdzv_backend c10d "
                                   "--rdzv_endpoint first-node:29500 --rdzv_id sage-grpo post_train.py ")
        assert torchrun.rstrip().endswith("--max_steps 5") and log == "# log: ./outputs/run1/logs/node_0.log"
        assert (f"dry run outside a Slurm allocation: placeholders for what sbatch sets: {count} node(s) "
                "(SLURM_JOB_NUM_NODES), rendezvous host first-node") in proc.stderr
