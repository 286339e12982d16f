"""A configs/paper file launched the way its header says, ``run_post_train.sh --config ...``, through
``scripts/check_paper_configs.sh`` (one CPU process, its model paths pointed at the tiny checkpoint and its tiny
VideoReward, 1 step) in a clone without ``.venv``: the script finds the interpreter on PATH, the file's settings reach
the trainer over the launcher's reference flags, and the flags typed after it win over both."""

import os
import socket
import sys
from pathlib import Path

import yaml
from eval_support import linked_root
from procs import run_group, scaled


REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG = "configs/paper/b_sage_grpo_dual_kl.yaml"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clone_without_venv(folder: Path) -> Path:
    """``folder`` linking every top-level entry of the repository but ``.venv`` (a fresh clone's view)."""
    folder.mkdir()
    for entry in REPO_ROOT.iterdir():
        if entry.name not in (".venv", ".git", "outputs", "ckpts"):
            (folder / entry.name).symlink_to(entry)
    return folder


def test_paper_config_runs_one_tiny_step_without_a_venv(tiny_root, tiny_reward_root, tmp_path):
    root = linked_root(tmp_path / "ckpts", tiny_root, tiny_reward_root)
    clone = clone_without_venv(tmp_path / "clone")
    bin_dir = tmp_path / "bin"  # python3 on PATH is this interpreter (as an activated conda env would be)
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f'#!/usr/bin/env bash\nexec {sys.executable} "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "TORCHRUN", "VIRTUAL_ENV")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", TINY=str(root), OUT=str(tmp_path / "runs"),
               MASTER_PORT_BASE=str(_free_port() - 1))
    proc = run_group(["bash", str(clone / "scripts" / "check_paper_configs.sh"), CONFIG], cwd=tmp_path, env=env,
                     timeout=scaled(400))
    log = tmp_path / "runs.b_sage_grpo_dual_kl.log"
    assert proc.returncode == 0, proc.stdout + proc.stderr + (log.read_text()[-4000:] if log.is_file() else "")
    assert proc.stdout.startswith("b_sage_grpo_dual_kl: exit 0, checkpoint-1 written, ")
    assert proc.stdout.rstrip().endswith("0 of 1 failed")
    run = tmp_path / "runs" / "b_sage_grpo_dual_kl"
    resolved = yaml.safe_load(next(run.rglob("run_config.yaml")).read_text())
    # the file's values, where the launcher passes other ones (--sde_type etc. are the same, these differ):
    assert resolved["reward_weights"] == '{"VQ": 0.5, "MQ": 0.5, "TA": 1.0}'
    assert resolved["max_steps"] == 1 and resolved["sp_size"] == 1 and resolved["enable_fsdp"] is False  # typed
    assert resolved["validation_num_inference_steps"] == 40 and resolved["kl_coef"] == 1e-7
    assert (resolved["sde_type"], resolved["use_moving_KL"], resolved["use_dual_kl"]) == ("sage_grpo", True, True)


def test_without_an_interpreter_that_has_the_requirements_it_says_what_to_do(tmp_path):
    clone = clone_without_venv(tmp_path / "clone")
    env = dict(os.environ, PYTHON="/bin/false")
    proc = run_group(["bash", str(clone / "scripts" / "check_paper_configs.sh")], cwd=tmp_path, env=env, timeout=30)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == ("error: /bin/false does not have torch, diffusers and transformers: run bash "
                           "scripts/setup_env.sh (it makes ./.venv) or set PYTHON to an interpreter with "
                           "requirements.txt installed\n")
