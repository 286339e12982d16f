"""Distributed building blocks: process layout, Ulysses SP, FSDP2, Muon on shards and the launch scripts.

Multi-process checks run ``tests/distributed/scripts/{two,four}_ranks.py`` under torchrun (gloo on 127.0.0.1, CPU); each
script runs every check once, compares with the unsplit single-process model computed in the same processes, and
writes the worst error over ranks to a JSON report that the tests below read."""
import os
import re
import shlex
import socket
import subprocess
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from sage_grpo.config.validation import ConfigError
from sage_grpo.distributed import (ParallelDims, all_gather_in_group, apply_sequence_parallel,
                                   broadcast_from_sp_leader, broadcast_object_from_sp_leader, gradient_sync,
                                   init_distributed, mean_over_world)

from launch_flags import RUN_POST_TRAIN_FLAGS
from procs import run_group


REPO_ROOT = Path(__file__).resolve().parents[2]


REFERENCE_FLAGS = " ".join(RUN_POST_TRAIN_FLAGS)  # as the launch scripts print them


def test_layout_world8_sp2():
    dims = ParallelDims(world_size=8, sp_size=2, rank=5)
    assert (dims.dp_size, dims.dp_rank, dims.sp_rank) == (4, 2, 1)
    assert (dims.sp_leader_rank, dims.sp_group_ranks, dims.is_sp_leader, dims.is_main) == (4, [4, 5], False, False)
    for rank in range(8):  # contiguous SP groups: rank = dp_rank * sp + sp_rank
        d = ParallelDims(world_size=8, sp_size=2, rank=rank)
        assert d.dp_rank * 2 + d.sp_rank == rank


def test_layout_reference_run_and_prompt_groups():
    dims = ParallelDims(world_size=8, sp_size=2, rank=0, batch_size=2, num_generations=4, num_attention_heads=16)
    assert dims.is_main and dims.is_sp_leader and dims.ranks_per_group == 2  # the launch scripts': 2 DP ranks a group
    assert ParallelDims(world_size=8, sp_size=2, batch_size=4, num_generations=2).ranks_per_group == 1


@pytest.mark.parametrize("kwargs, rule", [
    (dict(world_size=8, sp_size=3), "sp-divides-world"),
    (dict(world_size=2, sp_size=4), "sp-divides-world"),
    (dict(world_size=8, sp_size=8, num_attention_heads=4), "heads-divisible-by-sp"),
    (dict(world_size=8, sp_size=2, dp_replicate=3), "dp-replicate-divides-world"),
    (dict(world_size=2, sp_size=2, batch_size=1, num_generations=2), "groups-fill-the-step"),
    (dict(world_size=8, sp_size=2, batch_size=6, num_generations=4), "batch-holds-whole-groups"),
    (dict(world_size=8, sp_size=2, batch_size=3, num_generations=4), "group-spans-whole-ranks"),
    (dict(world_size=4, sp_size=2, rank=4), "rank-in-world"),
])
def test_invalid_layouts_name_the_rule(kwargs, rule):
    with pytest.raises(ConfigError, match=rf"\[{rule}\]"):
        ParallelDims(**kwargs)


def test_token_rule():
    dims = ParallelDims(world_size=8, sp_size=4)
    dims.check_tokens(21 * 4 * 4)
    with pytest.raises(ConfigError, match=r"\[tokens-divisible-by-sp\] 9 latent tokens"):
        dims.check_tokens(9)
    ParallelDims(world_size=8, sp_size=1).check_tokens(9)


def test_meshes_must_be_built_first():
    with pytest.raises(RuntimeError, match="build_meshes"):
        ParallelDims(world_size=2, sp_size=2).sp_group


def test_single_process_needs_no_process_group(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    env = init_distributed()
    assert (env.rank, env.world_size, env.local_rank) == (0, 1, 0) and not dist.is_initialized()
    dims = ParallelDims.from_env(env, sp_size=1)
    dims.build_meshes()
    assert dims.fsdp_mesh is None and dims.sp_group is None and dims.prompt_group is None
    tensor = torch.arange(3.0)
    assert broadcast_from_sp_leader(tensor, dims) is tensor
    assert broadcast_object_from_sp_leader({"a": 1}, dims) == {"a": 1}
    assert all_gather_in_group(tensor, dims.prompt_group) is tensor
    assert mean_over_world({"loss": 2.5}, dims.device) == {"loss": 2.5}
    model = torch.nn.Linear(2, 2)
    apply_sequence_parallel(model, None)  # no-op without an SP group
    with gradient_sync(model, enabled=False):  # no-op on a plain module
        model(torch.ones(1, 2)).sum().backward()
    assert model.weight.grad is not None


def test_sp_all_gather_resolves_on_old_and_new_torch():
    """torch 2.11 (the GPU image's) lacks ``all_gather_single_autograd``; the SP hooks must then use the older name
    rather than fail at the first gather. The multi-process SP tests below run whichever this torch has."""
    from types import SimpleNamespace

    from torch.distributed import _functional_collectives as funcol

    from sage_grpo.distributed.sequence_parallel import differentiable_all_gather

    def old(tensor, gather_dim, group):
        return "old"

    def new(tensor, gather_dim, group):
        return "new"

    assert differentiable_all_gather(SimpleNamespace(all_gather_tensor_autograd=old)) is old
    assert differentiable_all_gather(SimpleNamespace(all_gather_tensor_autograd=old,
                                                     all_gather_single_autograd=new)) is new
    expected = getattr(funcol, "all_gather_single_autograd", None) or funcol.all_gather_tensor_autograd
    assert differentiable_all_gather() is expected


HOST = re.sub(r"[^A-Za-z0-9-]", "_", socket.gethostname())  # as pdsh_train.sh names its secrets files
LAUNCH_VARS = ("NODE_LIST", "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "NPROC_PER_NODE", "OUTPUT_DIR",
               "RESUME", "TORCHRUN", "DRY_RUN", "PDSH_FANOUT", "PDSH_SECRETS_DIR", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


def _launch(script: str, *args: str, **env_vars: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(env_vars)
    return run_group(["bash", str(REPO_ROOT / script), *args], env=env, timeout=30)


def test_run_post_train_dry_run():
    proc = _launch("run_post_train.sh", "--resume_from_checkpoint", "latest", DRY_RUN="1")
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip()
    assert "torchrun --nproc_per_node 8 " in line and " post_train.py " + REFERENCE_FLAGS in line
    assert line.endswith(REFERENCE_FLAGS + " --resume_from_checkpoint latest")
    assert "--nproc_per_node 4 " in _launch("run_post_train.sh", DRY_RUN="1", NPROC_PER_NODE="4").stdout


def test_train_grpo_dry_run_derives_node_rank_and_resumes():
    proc = _launch("scripts/post_train/train_grpo.sh", "--max_steps", "3", DRY_RUN="1", RESUME="latest",
                   NODE_LIST=f"node-a,{socket.gethostname()}")
    assert proc.returncode == 0, proc.stderr
    line, log = proc.stdout.strip().splitlines()
    assert "torchrun --nnodes 2 --nproc_per_node 8 --node_rank 1 --master_addr node-a --master_port 29500 " in line
    assert (" post_train.py " + REFERENCE_FLAGS + " --resume_from_checkpoint latest --max_steps 3") in line
    assert log == "# log: ./outputs/logs/node_1.log"
    explicit = _launch("scripts/post_train/train_grpo.sh", DRY_RUN="1", NNODES="4", NODE_RANK="3",
                       MASTER_ADDR="10.0.0.1", MASTER_PORT="1234", OUTPUT_DIR="runs/a")
    assert "--nnodes 4 --nproc_per_node 8 --node_rank 3 --master_addr 10.0.0.1 --master_port 1234 " in explicit.stdout
    assert "--output_dir runs/a " in explicit.stdout and "# log: runs/a/logs/node_3.log" in explicit.stdout


def test_multinode_dry_run_uses_pdsh_on_every_node():
    proc = _launch("run_post_train_multinode.sh", "--max_steps", "5", DRY_RUN="1", NODE_LIST="node-a,node-b",
                   RESUME="latest")
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip()
    assert line.startswith("pdsh -w node-a,node-b -f 2 ")
    assert f"cd {REPO_ROOT}" in line and "RESUME=latest" in line and "NODE_RANK" not in line
    assert line.rstrip("'").endswith("bash scripts/post_train/train_grpo.sh --max_steps 5")


def test_pdsh_dry_run_shows_no_secret(tmp_path):
    secrets_dir = tmp_path / "secrets"
    proc = _launch("run_post_train_multinode.sh", DRY_RUN="1", NODE_LIST="node-a,node-b", HF_TOKEN="secret123",
                   PDSH_SECRETS_DIR=str(secrets_dir))
    assert proc.returncode == 0, proc.stderr
    assert "secret123" not in proc.stdout + proc.stderr
    assert f". {secrets_dir}/env.{HOST}." in proc.stdout and "HF_TOKEN" not in proc.stdout
    # the names the secrets file carries (every HF_*/WANDB_*/SWANLAB_* setting of this environment): HF_TOKEN among them
    assert re.search(r"^# [^\n]*\bHF_TOKEN\b[^\n]*: sourced from ", proc.stderr, re.M), proc.stderr
    assert not secrets_dir.exists()  # a dry run writes no secrets file
    default = _launch("run_post_train_multinode.sh", DRY_RUN="1", NODE_LIST="node-a", HF_TOKEN="secret123")
    assert f". {REPO_ROOT}/.pdsh_env/env.{HOST}." in default.stdout and "secret123" not in default.stdout


def test_pdsh_tracker_and_hub_settings_go_through_the_secrets_file_and_stale_files_are_removed(tmp_path):
    """WANDB_*, SWANLAB_*, HF_* and any URL with credentials reach the nodes through the secrets file, never the pdsh
    command line; a start removes the files of launchers on this host that are gone (a SIGKILLed launcher), and
    keeps those of running launchers and of other hosts."""
    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir(mode=0o700)
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that no longer runs, as a SIGKILLed launcher's
    stale, live, other_host = (secrets_dir / f"env.{HOST}.{gone.pid}.abcdefgh",
                               secrets_dir / f"env.{HOST}.{os.getpid()}.abcdefgh", secrets_dir / "env.other-node.1.abc")
    for path in (stale, live, other_host):
        path.write_text("export HF_TOKEN=old\n")
    settings = {"WANDB_API_KEY": "wandbkey123", "WANDB_BASE_URL": "https://wandb.example", "SWANLAB_API_KEY": "swan123",
                "SWANLAB_WORKSPACE": "team", "HF_HUB_ENDPOINT": "https://user:hubpass123@hub.example",
                "MASTER_ADDR": "node-a", "TORCH_STORE_URL": "tcp://admin:torchpass123@10.0.0.1"}
    proc = _launch("run_post_train_multinode.sh", DRY_RUN="1", NODE_LIST="node-a,node-b",
                   PDSH_SECRETS_DIR=str(secrets_dir), **settings)
    assert proc.returncode == 0, proc.stderr
    command = proc.stdout
    for name, value in settings.items():
        if name == "MASTER_ADDR":
            assert "MASTER_ADDR=node-a" in command  # no secret: stays on the command line
        else:
            assert value not in command and f"{name}=" not in command, name
            assert name in proc.stderr.split(": sourced from")[0], name  # listed as sourced from the file
    assert not any(secret in proc.stdout + proc.stderr for secret in ("key123", "swan123", "pass123"))
    assert f". {secrets_dir}/env.{HOST}." in command
    assert not stale.exists() and live.exists() and other_host.exists()
    assert f"removed the stale secrets file {stale}" in proc.stderr


FAKE_PDSH = r"""#!/usr/bin/env bash
# fake `pdsh -w HOSTS -f N REMOTE`: records its argv, then runs REMOTE once per host as ssh would, in a fresh login
# environment (nothing inherited from the launching shell)
printf '%s\0' "$@" > "$FAKE_PDSH_ARGV"
while getopts w:f: opt; do [ "$opt" = w ] && hosts=$OPTARG; done
shift $((OPTIND - 1))
IFS=, read -r -a list <<< "$hosts"
status=0
for host in "${list[@]}"; do
  env -i PATH="$PATH" HOME="$HOME" bash -c "$1" || status=$?
done
exit $status
"""
# the script pdsh_train.sh runs on each "node": what it was given, and every command line of the machine meanwhile
NODE_PROBE = r"""#!/usr/bin/env bash
{
  printf 'HF_TOKEN=%s\n' "${HF_TOKEN-unset}"
  printf 'HUGGING_FACE_HUB_TOKEN=%s\n' "${HUGGING_FACE_HUB_TOKEN-unset}"
  printf 'HF_HUB_OFFLINE=%s\n' "${HF_HUB_OFFLINE-unset}"
  printf 'args=%s\n' "$*"
  printf 'secrets_files=%s\n' "$(stat -c '%a' "$PROBE_SECRETS_DIR"/env.* | tr '\n' ' ')"
  printf 'secrets_dir=%s\n' "$(stat -c '%a' "$PROBE_SECRETS_DIR")"
} >> "$PROBE_OUT"
cat /proc/[0-9]*/cmdline 2> /dev/null | tr '\0' ' ' >> "$PROBE_CMDLINES"
exit 7
"""


def test_pdsh_secrets_reach_the_node_through_its_environment_only(tmp_path):
    """With a fake pdsh that emulates ssh (a fresh environment), the remote script sees HF_TOKEN in its environment;
    no command line on the machine (pdsh's argv, the remote shell's, env's) holds it; the file is gone afterwards."""
    token = f"secret123-{os.getpid()} 'quoted' $HOME"  # a unique value that quoting must carry intact
    secrets_dir, out, cmdlines, argv_log = (tmp_path / name for name in ("secrets", "out", "cmdlines", "argv"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pdsh").write_text(FAKE_PDSH)
    (bin_dir / "pdsh").chmod(0o755)
    probe = tmp_path / "probe.sh"
    # where the probe writes is part of its text: nothing else crosses the fake ssh
    probe.write_text(f"PROBE_OUT={shlex.quote(str(out))}\nPROBE_CMDLINES={shlex.quote(str(cmdlines))}\n"
                     f"PROBE_SECRETS_DIR={shlex.quote(str(secrets_dir))}\n" + NODE_PROBE)
    inherited = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS and not k.startswith("HF_")}
    proc = run_group(["bash", str(REPO_ROOT / "scripts/post_train/pdsh_train.sh"), str(probe), "--flag", "a b"],
                     env={**inherited, "PATH": f"{bin_dir}:{os.environ['PATH']}", "NODE_LIST": "node-a,node-b",
                          "HF_TOKEN": token, "HUGGING_FACE_HUB_TOKEN": token + "-2", "HF_HUB_OFFLINE": "1",
                          "NCCL_DEBUG": "WARN",
                          "PDSH_SECRETS_DIR": str(secrets_dir), "FAKE_PDSH_ARGV": str(argv_log)}, timeout=30)
    assert proc.returncode == 7, proc.stderr  # pdsh's exit status comes back
    seen = out.read_text().splitlines()
    assert seen == [f"HF_TOKEN={token}", f"HUGGING_FACE_HUB_TOKEN={token}-2", "HF_HUB_OFFLINE=1", "args=--flag a b",
                    "secrets_files=600 ", "secrets_dir=700"] * 2  # both nodes
    argv = argv_log.read_text().split("\0")[:-1]
    assert argv[:4] == ["-w", "node-a,node-b", "-f", "2"] and f". {secrets_dir}/env." in argv[4]
    assert "NCCL_DEBUG=WARN" in argv[4]  # a variable that is no secret stays on the command line
    assert "HF_HUB_OFFLINE" not in argv[4]  # HF_*: through the file (hub settings may hold credentials)
    assert "secret123" not in "".join(argv) and "secret123" not in proc.stdout + proc.stderr
    listing = cmdlines.read_text()
    assert f". {secrets_dir}/env." in listing and "secret123" not in listing  # it saw pdsh's argv, but no secret
    assert list(secrets_dir.iterdir()) == []  # deleted when pdsh exited


def test_pdsh_secrets_file_is_deleted_when_the_launch_fails(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pdsh").write_text("#!/usr/bin/env bash\nexit 255\n")  # ssh refused on every node
    (bin_dir / "pdsh").chmod(0o755)
    proc = run_group(["bash", str(REPO_ROOT / "scripts/post_train/pdsh_train.sh"), "scripts/post_train/train_grpo.sh"],
                     env={**{k: v for k, v in os.environ.items() if k not in LAUNCH_VARS},
                          "PATH": f"{bin_dir}:{os.environ['PATH']}", "NODE_LIST": "node-a",
                          "HF_TOKEN": "secret123", "PDSH_SECRETS_DIR": str(tmp_path / "secrets")}, timeout=30)
    assert proc.returncode == 255 and list((tmp_path / "secrets").iterdir()) == []


@pytest.mark.parametrize("script, env_vars, message", [
    ("run_post_train_multinode.sh", {}, "NODE_LIST is not set"),
    ("scripts/post_train/train_grpo.sh", {}, "NNODES is not set"),
    ("scripts/post_train/train_grpo.sh", {"NNODES": "2"}, "NODE_RANK is not set"),
    ("scripts/post_train/train_grpo.sh", {"NNODES": "2", "NODE_RANK": "0"}, "MASTER_ADDR is not set"),
    ("scripts/post_train/train_grpo.sh", {"NODE_LIST": "node-x,node-y"}, "is not in NODE_LIST=node-x,node-y"),
])

def test_launchers_name_missing_variables(script, env_vars, message):
    proc = _launch(script, DRY_RUN="1", **env_vars)
    assert proc.returncode == 2 and message in proc.stderr and proc.stdout == ""
