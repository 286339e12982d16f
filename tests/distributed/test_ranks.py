"""Multi-process checks under torchrun (gloo on 127.0.0.1, CPU): tests/distributed/scripts/{two,four}_ranks.py
against one process."""
import json
import os
import socket
import sys
from pathlib import Path

import pytest

from procs import run_group


REPO_ROOT = Path(__file__).resolve().parents[2]


SCRIPTS = REPO_ROOT / "tests" / "distributed" / "scripts"
TOL = 1e-5


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_torchrun(script: str, nproc: int, tmp_path_factory, timeout: int = 150) -> dict:
    report = tmp_path_factory.mktemp(script.replace(".py", "")) / "report.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    if Path("/sys/class/net/lo").exists():
        env["GLOO_SOCKET_IFNAME"] = "lo"  # keep gloo on the loopback interface
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
           "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), str(SCRIPTS / script), str(report)]

    proc = run_group(cmd, cwd=REPO_ROOT, env=env, timeout=timeout)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(report.read_text())


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return _run_torchrun("two_ranks.py", 2, tmp_path_factory)


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    return _run_torchrun("four_ranks.py", 4, tmp_path_factory)


def test_sp2_matches_unsplit_model(two_ranks):
    r = two_ranks
    assert r["sp2_output_err"] <= TOL and r["sp2_grad_err"] <= TOL
    assert r["sp2_raw_grad_err"] > 1e-3  # before the SP mean each rank's gradient is partial
    assert r["sp2_num_grads"][0] == r["sp2_num_grads"][1] > 100
    assert r["sp2_ckpt_output_err"] <= TOL and r["sp2_ckpt_grad_err"] <= TOL  # with gradient checkpointing


def test_sp_rejects_indivisible_tokens_and_is_removable(two_ranks):
    assert two_ranks["sp2_odd_tokens_error"].startswith("[tokens-divisible-by-sp] 9 latent tokens")
    assert two_ranks["sp2_removed_output_err"] == 0.0
    assert two_ranks["sp2_removed_processors"] == ["HunyuanVideo15AttnProcessor2_0"]


def test_sp4_matches_unsplit_model(four_ranks):
    assert four_ranks["sp4_output_err"] <= TOL and four_ranks["sp4_grad_err"] <= TOL
    assert four_ranks["sp4_num_grads"][0] == four_ranks["sp4_num_grads"][1]


def test_fsdp_matches_single_process(two_ranks):
    r = two_ranks
    assert max(r[f"fsdp_output_err_step{s}"] for s in range(3)) <= TOL
    assert r["fsdp_grad_err"] <= TOL and r["fsdp_param_err_after_3_steps"] <= TOL
    assert r["fsdp_local_numel_fraction"] == pytest.approx(0.5, abs=1e-3)  # each rank holds half


def test_one_gradient_reduction_per_update(two_ranks):
    r = two_ranks
    assert r["accum_num_units"] == 4  # 2 blocks, the token refiner, the root
    assert r["accum_reductions_per_unit"] == [2] and r["accum_updates_reduced"] == 2  # 2 updates x 3 micro-steps
    assert r["every_step_reductions_per_unit"] == [3]  # the reference's cadence: one per micro-step
    assert r["accum_param_err"] <= TOL


def test_fsdp_muon_equals_single_process_muon(two_ranks):
    r = two_ranks
    assert r["muon_same_grads_param_err"] == 0.0
    assert r["muon_end_to_end_param_err"] <= 1e-6
    assert r["muon_matrices_updated"] == [44, 47]  # 3 matrices of the last block never get a gradient
    assert r["muon_uneven_shards"] and [3, 32] in r["muon_shapes"] and [192, 32] in r["muon_shapes"]


def test_fsdp_muon_on_hsdp_shards(four_ranks):
    assert four_ranks["hsdp_muon_placements"] == ["R", "S(0)"]  # (Replicate(), Shard(0))
    assert four_ranks["hsdp_muon_param_err"] == 0.0


def test_layout_and_collectives_on_four_ranks(four_ranks):
    r = four_ranks
    assert r["layout"] == [[0, 0, True, 0], [0, 1, False, 0], [1, 0, True, 2], [1, 1, False, 2]]
    assert r["sp_groups"] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert r["dp_groups"] == r["prompt_groups"] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert r["fsdp_mesh_shape"] == [4] and r["hsdp_mesh"] == [[2, 2], ["dp_replicate", "dp_shard"]]
    assert r["sp_broadcast"] == r["sp_broadcast_object"] == [0, 0, 2, 2]
    assert r["group_rewards"] == [[0.0, 12.0]] * 4  # the group's rewards in DP-rank order, on every rank
    assert r["world_gather"] == [[0, 1, 2, 3]] * 4
    assert r["metric_mean"] == [{"loss": 1.5, "kl": 3.0}] * 4


def test_fsdp_with_sp_matches_single_process(four_ranks):
    for name in ("fsdp_dp2_sp2", "hsdp_dp2_sp2"):
        errors = {k: v for k, v in four_ranks.items() if k.startswith(name)}
        assert len(errors) >= 3 and max(errors.values()) <= TOL, errors
