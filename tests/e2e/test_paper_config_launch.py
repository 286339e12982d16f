"""A configs/paper file launched the way its header says, ``run_post_train.sh --config ...``, on one CPU process with
its model paths pointed at the tiny checkpoint (and its tiny VideoReward) for 1 step: the file's settings reach the
trainer over the launcher's reference flags, and the flags typed after it win over both."""

import os
import socket
from pathlib import Path

import yaml
from eval_support import linked_root
from procs import run_group, scaled


REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG = "configs/paper/b_sage_grpo_dual_kl.yaml"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def test_paper_config_runs_one_tiny_step(tiny_root, tiny_reward_root, tmp_path):
    root = linked_root(tmp_path / "ckpts", tiny_root, tiny_reward_root)
    tiny = ["--pretrained_model_root", str(root), "--output_dir", str(tmp_path / "run"), "--dtype", "fp32",
            "--device", "cpu", "--sp_size", "1", "--enable_fsdp", "false", "--enable_gradient_checkpointing", "false",
            "--batch_size", "2", "--num_generations", "2", "--grpo_sampling_steps", "2", "--sample_n_frames", "5",
            "--rollout_height", "16", "--rollout_width", "16", "--text_max_length", "16", "--byt5_max_length", "8",
            "--vision_num_semantic_tokens", "4", "--max_steps", "1", "--validation_interval", "0",
            "--save_rollout_videos", "false"]
    env = dict(os.environ, NPROC_PER_NODE="1", MASTER_PORT=_free_port(), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    proc = run_group(["bash", "run_post_train.sh", "--config", CONFIG, *tiny], cwd=REPO_ROOT, env=env,
                     timeout=scaled(400))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    resolved = yaml.safe_load(next((tmp_path / "run").rglob("run_config.yaml")).read_text())
    # the file's values, where the launcher passes other ones (--sde_type etc. are the same, these differ):
    assert resolved["reward_weights"] == '{"VQ": 0.5, "MQ": 0.5, "TA": 1.0}'
    assert resolved["max_steps"] == 1 and resolved["sp_size"] == 1 and resolved["enable_fsdp"] is False  # typed
    assert resolved["validation_num_inference_steps"] == 40 and resolved["kl_coef"] == 1e-7
    assert (resolved["sde_type"], resolved["use_moving_KL"], resolved["use_dual_kl"]) == ("sage_grpo", True, True)
    assert next((tmp_path / "run").rglob("checkpoint-1"), None) is not None
