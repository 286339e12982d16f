"""The GRPO trainer on several processes (torchrun, gloo on 127.0.0.1, CPU) against one process, on the tiny checkpoint.

Runs (each a torchrun subprocess in its own process group, killed whole on timeout (tests/procs.py), one intra-op
thread per process):

- baseline: one process, batch 4 = one prompt group of G = 4, 3 steps, AdamW, constant KL beta, anchor refreshed
  before step 3;
- ``post_train.py --config configs/tiny_cpu.yaml`` on 2 processes: dp 2 x batch 2, FSDP2 (the group spans both ranks);
- 2 processes sp 2 (one replica, batch 4), FSDP off: Ulysses plus the explicit gradient mean, and the reference's
  clip (its --max_grad_norm at sp 2 clips the full gradient at twice the value: the same clipped updates as one
  process at twice the flag);
- the same on 2 processes with ``--gradient_reduction per_update`` (the default reduces after every backward);
- 4 processes dp 2 x sp 2, FSDP2 with the reference sharded and CPU-offloaded, Muon, gradients reduced once per
  update, 2 steps and a checkpoint; then 2 processes (dp 2 x sp 1) and 1 process resume it;
- LoRA on 2 FSDP processes in bf16, with a resume; invalid layouts on 2 processes.

The parallel runs see exactly the baseline's samples (same prompt, same initial-noise seeds s..s+3, SDE noise seeded by
the sample's index in the step's global batch), so they must reproduce its metrics and weights up to float summation
order. Two amplifiers of that rounding are kept out of the comparison: Muon (its bf16 Newton-Schulz turns 1e-9
gradient differences into ~1e-4 of an update on GPUs, so the comparisons use AdamW; sharded Muon itself is checked in
test_distributed.py), and the policy loss, -mean(A_i w_k) with sum_i A_i = 0, i.e. the rounding residue of z-scores of
rewards ~0.67 spread by ~0.003 (float32 rounding amplified 1/std ~ 400x, ~1e-5), compared in absolute terms.
"""

import json
import math
import os
import shutil
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from model_fixtures import tiny_checkpoint
from procs import run_group
from safetensors.torch import load_file

from sage_grpo.checkpoint_layout import DCP_DIR
from sage_grpo.config import ConfigError, parse_cli
from sage_grpo.config.train import TrainConfig
from sage_grpo.distributed import ParallelDims
from sage_grpo.models.geometry import read_model_geometry
from sage_grpo.tracking.run_dir import TIMING_METRICS, read_metrics


REPO_ROOT = Path(__file__).resolve().parents[2]
TRAIN_SCRIPT = REPO_ROOT / "tests" / "distributed" / "scripts" / "train_tiny.py"
TIMING_KEYS = set(TIMING_METRICS)
LOSS_KEYS = {"policy_loss", "total_loss"}
METRIC_RTOL = 1e-5   # observed <= 6e-6 (reward std after one update, grad_norm, kl_moving)
LOSS_ATOL = 5e-5     # observed <= 1.1e-5 (see the module docstring)
WEIGHT_ATOL = 1e-5   # observed <= 7e-7 after 3 updates that moved the weights by up to 3e-3
# --max_grad_norm of the one-process runs: their full-gradient norms are ~0.107, 0.098, 0.134 in steps 1-3, so the clip
# acts on step 3 only (a clip on every step would scale every update alike, which AdamW does not see)
MAX_GRAD_NORM = 0.12


def tiny_flags(root: Path, out_dir: Path, *extra: str) -> list:
    """configs/tiny_cpu.yaml shrunk for 2 CPU cores: 5 frames of 16x16 (8 latent tokens), 3 SDE steps, constant KL
    beta (min = init = max, so the controller does not depend on how many inner iterations a rank runs)."""
    return [
        "--config", str(REPO_ROOT / "configs" / "tiny_cpu.yaml"), "--pretrained_model_root", str(root),
        "--output_dir", str(out_dir), "--train_video_csv", str(REPO_ROOT / "assets" / "demo_train.csv"),
        "--grpo_sampling_steps", "3", "--sample_n_frames", "5", "--rollout_height", "16", "--rollout_width", "16",
        "--text_max_length", "16", "--byt5_max_length", "8", "--validation_interval", "0", "--max_steps", "3",
        "--learning_rate", "1e-3", "--use_muon", "false", "--kl_weight", "1e-3", "--kl_coef", "1e-3",
        "--kl_min_coef", "1e-3", "--update_ref_model_step", "2", "--enable_gradient_checkpointing", "true",
        "--max_grad_norm", str(MAX_GRAD_NORM), *extra,
    ]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# torchrun looks at its workers every 0.1 s by default, and sends the others SIGTERM once one has exited: a test that
# counts every rank's own error message gives them a second to print it (one rank stalled past 0.1 s on a loaded
# machine lost its message)
EVERY_RANK_REPORTS = ("--monitor-interval", "1.0")


def torchrun(nproc: int, *args: str, timeout: int = 150, options: tuple = ()) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    if Path("/sys/class/net/lo").exists():
        env["GLOO_SOCKET_IFNAME"] = "lo"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr",
           "127.0.0.1", "--master_port", str(_free_port()), *options, *args]
    return run_group(cmd, cwd=REPO_ROOT, env=env, timeout=timeout)


def run_ok(nproc: int, *args: str) -> subprocess.CompletedProcess:
    proc = torchrun(nproc, *args)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    return proc


def run_script(nproc: int, report_dir: Path, *flags: str) -> dict:
    run_ok(nproc, str(TRAIN_SCRIPT), "--report_dir", str(report_dir), *flags)
    return json.loads((report_dir / "report.json").read_text())


def export(run_dir: Path, step: int) -> dict:
    return load_file(str(run_dir / f"checkpoint-{step}" / "transformer" / "model.safetensors"))


def tolerance_of(name: str, ref: dict) -> float:
    """How far a logged number may move between process layouts (summation order): the losses by an absolute bound;
    a spread (``*_std``) relative to its quantity's mean, since a spread of nearly equal rewards is a difference of
    close numbers (0.0026 from rewards agreeing to 3e-8 moved it 1.2e-5 relative on an Intel Xeon); the rest
    relative to themselves."""
    if name in LOSS_KEYS:
        return LOSS_ATOL
    scale = abs(ref[name])
    if name.endswith("_std") and name[:-4] + "_mean" in ref:
        scale = max(scale, abs(ref[name[:-4] + "_mean"]))
    return METRIC_RTOL * max(scale, 1e-12)


def assert_same_run(run_dir: Path, baseline_dir: Path) -> None:
    rows, expected = read_metrics(run_dir), read_metrics(baseline_dir)
    assert [r["step"] for r in rows] == [r["step"] for r in expected] == [1, 2, 3]
    for row, ref in zip(rows, expected):
        assert set(row) == set(ref)
        for name in set(ref) - TIMING_KEYS:
            assert abs(row[name] - ref[name]) <= tolerance_of(name, ref), (row["step"], name, row[name], ref[name])
    weights, ref_weights = export(run_dir, 3), export(baseline_dir, 3)
    assert set(weights) == set(ref_weights)
    assert max((weights[k] - ref_weights[k]).abs().max().item() for k in ref_weights) <= WEIGHT_ATOL


# ---------------------------------------------------------------- runs

@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory)


@pytest.fixture(scope="module")
def baseline(root, tmp_path_factory):
    """One process, launched like the others (one intra-op thread: a different thread count changes float
    summation order, which the reward z-scores amplify to ~2e-5 in the weights)."""
    run_dir = tmp_path_factory.mktemp("one") / "run"
    run_ok(1, "post_train.py", *tiny_flags(root, run_dir, "--batch_size", "4"))
    return run_dir


@pytest.fixture(scope="module")
def dp2_post_train(root, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("dp2") / "run"
    proc = run_ok(2, "post_train.py", *tiny_flags(root, run_dir, "--batch_size", "2", "--enable_fsdp", "true"))
    return run_dir, proc


@pytest.fixture(scope="module")
def dp2_sp2(root, tmp_path_factory):
    """4 processes, 2 steps, Muon on shards and a sharded CPU-offloaded reference; anchor refreshed every update; an
    EMA of the weights."""
    base = tmp_path_factory.mktemp("dp2sp2")
    flags = tiny_flags(root, base / "run", "--batch_size", "2", "--sp_size", "2", "--enable_fsdp", "true",
                       "--use_muon", "true", "--reference_placement", "cpu", "--gradient_reduction", "per_update",
                       "--update_ref_model_step", "1", "--grpo_sampling_steps", "2", "--ema_decay", "0.5")
    report = run_script(4, base / "report", *flags, "--max_steps", "2")
    return base, flags, report


@pytest.fixture(scope="module")
def dp2_sp2_resumed(dp2_sp2):
    """``dp2_sp2``'s checkpoint-2 resumed on 2 processes (sp 1) for a third step, in its run directory: (the run's
    metrics before the resume, the resumed run's report). A fixture, so the tests that need the resume get it in any
    order (a shuffled run once skipped the one-process test, which had come before the resume)."""
    base, flags, _ = dp2_sp2
    before = read_metrics(base / "run")
    resumed = run_script(2, base / "resumed", *flags, "--sp_size", "1", "--max_steps", "3",
                         "--resume_from_checkpoint", "latest", "--previous_report_dir", str(base / "report"))
    return before, resumed


# ---------------------------------------------------------------- tests

def test_two_fsdp_processes_match_one(dp2_post_train, baseline):
    """torchrun --nproc_per_node 2 post_train.py --config configs/tiny_cpu.yaml ...: dp 2 x batch 2 with FSDP2 gives
    the metrics and weights of one process with batch 4 (same 4 samples; the group spans both ranks)."""
    run_dir, proc = dp2_post_train
    assert_same_run(run_dir, baseline)
    assert proc.stdout.count("training finished at step 3") == 1  # console from rank 0 only
    rows = read_metrics(run_dir)
    assert rows[1]["kl_moving"] > 1e-4 and rows[2]["kl_moving"] == 0.0  # the anchor moved (shard to shard) at step 3
    checkpoint = run_dir / "checkpoint-3"
    assert (checkpoint / "transformer_dcp" / ".metadata").exists() and (checkpoint / "training_state.pt").exists()
    assert not list(run_dir.glob(".checkpoint-*"))  # the temporary directory was renamed
    # Rollout media of both DP ranks; the group's JSON is written per rank and holds the whole group's advantages.
    group_dir = run_dir / "rl_samples" / "0000000" / "group_0"
    videos = sorted(p.name for p in group_dir.glob("*.mp4"))
    assert [v.split("_dp_")[1][:8] for v in videos] == ["0_rank_0", "0_rank_0", "1_rank_1", "1_rank_1"]
    records = [r for path in sorted(group_dir.glob("*_rewards.json")) for r in json.loads(path.read_text())]
    assert len(records) == 4 and abs(sum(r["advantage"] for r in records)) < 1e-4  # z-scores over the whole group
    assert sorted(r["seed"] for r in records) == [records[0]["seed"] + k for k in range(4)]


def test_gradient_reduction_per_update_matches_one(root, baseline, tmp_path):
    """--gradient_reduction per_update (unsharded gradients held, one reduce-scatter per update) gives the same run as
    the default per-backward reduction above and as one process; it reduces once per unit per update."""
    report = run_script(2, tmp_path / "report", *tiny_flags(root, tmp_path / "run", "--batch_size", "2",
                                                            "--enable_fsdp", "true", "--gradient_reduction",
                                                            "per_update"))
    assert report["policy_sharded"] and report["update_steps"] == 3
    assert report["synced_backward_passes"] == 3 and report["reductions_per_unit"] == [3]
    assert_same_run(tmp_path / "run", baseline)


def test_export_loads_into_the_transformer(dp2_post_train, root):
    from sage_grpo.models.loading import load_transformer, load_transformer_weights

    run_dir, _ = dp2_post_train
    model = load_transformer(root, "480p_t2v", torch.float32, "cpu")
    load_transformer_weights(model, run_dir / "checkpoint-3")
    trained = export(run_dir, 3)
    assert all(torch.equal(p.detach(), trained[n]) for n, p in model.named_parameters())


def test_sequence_parallel_processes_match_one(root, baseline, tmp_path):
    """sp 2 (one replica holding the baseline's batch of 4) without FSDP: Ulysses plus the explicit gradient mean.
    The reference's gradient norm at sp 2 is half the full one's, so its --max_grad_norm m clips the full gradient at
    2m: this run, at half the baseline's flag, clips the same gradients at the same point."""
    report = run_script(2, tmp_path / "report", *tiny_flags(root, tmp_path / "run", "--batch_size", "4",
                                                            "--sp_size", "2", "--enable_fsdp", "false",
                                                            "--max_grad_norm", str(MAX_GRAD_NORM / 2)))
    assert (report["world_size"], report["dp_size"], report["sp_size"]) == (2, 1, 2)
    assert not report["policy_sharded"] and report["reductions_per_unit"] is None
    assert report["clip_thresholds"] == [MAX_GRAD_NORM] * 3
    norms = [row["grad_norm"] for row in read_metrics(baseline)]
    assert norms[2] > MAX_GRAD_NORM > max(norms[:2])  # the baseline's clip acted on step 3 only
    for clipped, norm in zip(report["clipped_grad_norms"], norms):
        # clip coefficient max_norm / (norm + 1e-6): 7.5e-6 below max_norm at step 3, plus summation order
        assert math.isclose(clipped, min(norm, MAX_GRAD_NORM), rel_tol=3e-5)
    assert_same_run(tmp_path / "run", baseline)


def test_one_gradient_reduction_per_update(dp2_sp2):
    """With --gradient_reduction per_update FSDP reduce-scatters once per unit per optimizer update, not once per
    backward pass (reference: 40 per update)."""
    _, _, report = dp2_sp2
    assert (report["world_size"], report["dp_size"], report["sp_size"]) == (4, 2, 2)
    assert report["policy_sharded"] and report["reference_sharded"]
    assert report["update_steps"] == 2 and report["backward_passes"] == 2 * 2 * 2  # steps x samples x SDE steps
    assert report["synced_backward_passes"] == 2
    assert report["reductions_per_unit"] == [2] and report["updates_reduced"] == 2


def test_dp2_sp2_checkpoint_resumes_on_two_processes(dp2_sp2, dp2_sp2_resumed):
    base, _, first = dp2_sp2
    run_dir = base / "run"
    rows, resumed = dp2_sp2_resumed
    assert [r["step"] for r in rows] == [1, 2] and rows[1]["kl_moving"] == 0.0  # anchor = policy after the refresh
    # DCP resharded 4 -> 2 ranks: the weights, the moving anchor and the EMA are exactly the checkpointed ones.
    assert (resumed["world_size"], resumed["resumed_from_step"]) == (2, 2)
    assert resumed["resume_weight_err"] == 0.0 and resumed["resume_anchor_err"] == 0.0
    assert resumed["resume_ema_err"] == 0.0 and first["ema_sharded_like_the_weights"] is True
    assert resumed["ema_sharded_like_the_weights"] is True
    assert resumed["update_steps"] == 3 and resumed["reductions_per_unit"] == [1]
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(math.isfinite(v) for v in rows[2].values()) and rows[2]["update_steps"] == 3.0
    before, after = export(run_dir, 2), export(run_dir, 3)
    assert 0 < max((after[k] - before[k]).abs().max().item() for k in before) < 1e-2  # one more small update


def test_sharded_checkpoint_resumes_on_one_process(dp2_sp2, dp2_sp2_resumed, tmp_path):
    """checkpoint-2 of the 4-process run, resumed by one process (batch 4: the same samples) into a new directory:
    its step 3 is the one the 2-process resume computed."""
    base, flags, _ = dp2_sp2
    resumed = run_script(1, tmp_path / "report", *flags, "--output_dir", str(tmp_path / "run"), "--sp_size", "1",
                         "--batch_size", "4", "--max_steps", "3", "--resume_from_checkpoint",
                         str(base / "run" / "checkpoint-2"), "--previous_report_dir", str(base / "report"))
    assert resumed["world_size"] == 1 and not resumed["policy_sharded"]
    assert resumed["resume_weight_err"] == 0.0 and resumed["resume_anchor_err"] == 0.0
    assert resumed["resume_ema_err"] == 0.0
    (row,), expected = read_metrics(tmp_path / "run"), read_metrics(base / "run")[2]
    assert row["step"] == 3 and set(row) == set(expected)
    for name in set(row) - TIMING_KEYS:
        assert abs(row[name] - expected[name]) <= tolerance_of(name, expected), (name, row[name], expected[name])
    assert (tmp_path / "run" / "checkpoint-3" / "transformer" / "model.safetensors").exists()  # one-process format


def _with_nan(folder: Path, key: str) -> None:
    """Rewrite the DCP checkpoint ``folder`` (every tensor and value it holds) with element 0 of ``key`` set to NaN."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from sage_grpo.safe_io import dcp_load, read_dcp_metadata

    stored = read_dcp_metadata(folder).state_dict_metadata
    state = {name: torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
             if isinstance(meta, TensorStorageMetadata) else None for name, meta in stored.items()}
    with warnings.catch_warnings():  # "no process group: saving/loading in this process alone"
        warnings.simplefilter("ignore")
        dcp_load(state, folder)
        state[key].view(-1)[0] = math.nan
        shutil.rmtree(folder)
        dcp.save(state, checkpoint_id=str(folder))


def test_a_nan_in_one_ranks_shard_stops_every_rank_at_resume(dp2_sp2, tmp_path):
    """checkpoint-2 with one NaN weight, in the rows rank 0 holds of two, resumed on 2 processes: both stop before a
    step with one line naming the tensor (the resume used to go on, every reward NaN; a rank that stopped alone would
    have left the other waiting in the next collective)."""
    base, flags, _ = dp2_sp2
    checkpoint = tmp_path / "checkpoint-2"
    shutil.copytree(base / "run" / "checkpoint-2", checkpoint)
    _with_nan(checkpoint / DCP_DIR, "model.x_embedder.proj.weight")
    proc = torchrun(2, "post_train.py", *flags, "--output_dir", str(tmp_path / "run"), "--sp_size", "1",
                    "--max_steps", "3", "--resume_from_checkpoint", str(checkpoint), options=EVERY_RANK_REPORTS)
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    # each rank raised, one error each (counted, not as lines: two ranks writing at once can share a line; torchrun's
    # own report of exit codes is racy, the rank that exits first has the other sent SIGTERM: EVERY_RANK_REPORTS)
    assert output.count("model.x_embedder.proj.weight holds NaN or inf values") == 2, output[-3000:]
    assert not (tmp_path / "run" / "checkpoint-3").exists()


def test_lora_under_fsdp_stays_on_policy_and_resumes(root, tmp_path):
    """LoRA on 2 FSDP processes in bf16 (frozen bf16 base, fp32 adapters, all-gathered in bf16): the first update
    replays the rollout exactly (ratio 1, step-wise KL 0), the anchor adapter refreshes in place, and the sharded
    checkpoint (peft-keyed adapter weights) resumes exactly."""
    flags = tiny_flags(root, tmp_path / "run", "--batch_size", "2", "--enable_fsdp", "true", "--use_lora", "true",
                       "--dtype", "bf16", "--update_ref_model_step", "1", "--grpo_sampling_steps", "2")
    first = run_script(2, tmp_path / "report", *flags, "--max_steps", "2")
    assert first["policy_sharded"] and first["update_steps"] == 2
    rows = read_metrics(tmp_path / "run")
    assert all(r["ratio_mean"] == 1.0 and r["kl_stepwise"] == 0.0 for r in rows)
    assert rows[0]["kl_moving"] == 0.0 and rows[1]["kl_moving"] == 0.0  # base = policy at step 1; anchor refreshed
    exported = export(tmp_path / "run", 2)
    assert exported and all(k.endswith((".lora_A.weight", ".lora_B.weight")) for k in exported)
    resumed = run_script(2, tmp_path / "resumed", *flags, "--max_steps", "3", "--resume_from_checkpoint", "latest",
                         "--previous_report_dir", str(tmp_path / "report"))
    assert resumed["resume_weight_err"] == 0.0 and resumed["resume_anchor_err"] == 0.0
    assert read_metrics(tmp_path / "run")[2]["ratio_mean"] == 1.0


def test_bf16_full_fine_tune_gathers_bf16_and_stays_on_policy(root, tmp_path):
    """--dtype bf16 full fine-tune on 2 FSDP processes: fp32 master weights all-gathered in bf16 (FSDP2 mixed
    precision, --fsdp_param_dtype auto), gradients reduced per backward; the update replays the rollout exactly
    (ratio 1, step-wise KL 0) and the master weights stay fp32."""
    flags = tiny_flags(root, tmp_path / "run", "--batch_size", "2", "--enable_fsdp", "true", "--dtype", "bf16",
                       "--grpo_sampling_steps", "2")
    report = run_script(2, tmp_path / "report", *flags, "--max_steps", "2")
    assert report["policy_sharded"] and report["compute_dtypes"] == ["torch.bfloat16"]
    assert report["synced_backward_passes"] == report["backward_passes"] == 2 * 2 * 2  # steps x samples x SDE steps
    rows = read_metrics(tmp_path / "run")
    assert all(r["ratio_mean"] == 1.0 and r["kl_stepwise"] == 0.0 for r in rows)
    assert all(math.isfinite(r["policy_loss"]) for r in rows)
    assert all(t.dtype == torch.float32 for t in export(tmp_path / "run", 2).values())


@pytest.mark.parametrize("extra, message", [
    # 5 latent frames of 3x3 = 27 tokens cannot be split over 2 SP ranks: caught from the config files alone
    (["--sp_size", "2", "--batch_size", "4", "--sample_n_frames", "9", "--rollout_height", "24",
      "--rollout_width", "24"], "[tokens-divisible-by-sp] 27 latent tokens"),
    # rank 0 refuses the run directory; the others get its error instead of waiting in a collective
    (["--batch_size", "2", "--overwrite_output_dir", "false"], "already holds a run"),
])
def test_errors_stop_every_rank_before_models_load(root, tmp_path, extra, message):
    run_dir = tmp_path / "run"
    if "already holds a run" in message:
        run_dir.mkdir()
        (run_dir / "run_config.yaml").write_text("seed: 1\n")
    proc = torchrun(2, "post_train.py", *tiny_flags(root, run_dir, *extra), timeout=60, options=EVERY_RANK_REPORTS)
    assert proc.returncode != 0
    assert proc.stderr.count(message) >= 2  # raised on both ranks
    assert "Loading weights" not in proc.stderr and not (run_dir / "tb").exists()


def test_a_held_run_directory_stops_every_rank_before_models_load(root, tmp_path):
    """The writing rank (0) probes the run directory's lock; its refusal reaches every rank instead of leaving the
    others waiting in a collective."""
    from procs import kill_group, start_group

    from sage_grpo.tracking.run_lock import LOCK_FILE, _proc_stat, this_process

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = start_group([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (run_dir / LOCK_FILE).write_text(json.dumps({**this_process(), "pid": holder.pid,
                                                     "process_start": _proc_stat(holder.pid)[1]}))
        proc = torchrun(2, "post_train.py", *tiny_flags(root, run_dir, "--batch_size", "2"), timeout=60,
                        options=EVERY_RANK_REPORTS)
    finally:
        kill_group(holder)
    assert proc.returncode != 0
    assert proc.stderr.count(f"--output_dir {run_dir} is in use by another run (host ") >= 2  # raised on both ranks
    assert "Loading weights" not in proc.stderr and not (run_dir / "run_config.yaml").exists()


def test_model_geometry_is_read_without_loading(root):
    cfg = parse_cli(TrainConfig, tiny_flags(root, "unused", "--validation_interval", "5",
                                            "--validation_fixed_size", "32x32", "--validate_video_length", "9"))
    geometry = read_model_geometry(cfg)
    # heads 2; rollout 5 frames 16x16 -> latent (2, 2, 2); validation 9 frames 32x32 -> (3, 4, 4)
    assert geometry.num_attention_heads == 2 and geometry.video_tokens == {"rollout": 8, "validation": 48}
    with pytest.raises(ConfigError, match=r"\[heads-divisible-by-sp\]"):
        ParallelDims(world_size=4, sp_size=4, num_attention_heads=geometry.num_attention_heads)
