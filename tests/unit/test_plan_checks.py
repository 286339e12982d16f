"""The planner's up-front checks: the trainer's token layout, the exit status of a launch that does not
fit, attention backends that cannot run here."""
import pytest
import torch

from sage_grpo.plan import report as planner
from sage_grpo.config import ConfigError
from sage_grpo.models.attention import check_attention_runs

# the reference launch's shape without the flags that do not matter here (released configs: no checkpoint needed)
LAUNCH = ["--pretrained_model_root", "/nonexistent", "--batch_size", "2", "--num_generations", "4", "--enable_fsdp",
          "--enable_gradient_checkpointing", "--validation_interval", "0"]


@pytest.mark.parametrize("sp, world", [(4, 8), (8, 16)])
def test_tokens_the_sp_degree_does_not_divide_are_refused(sp, world, capsys):
    """81 x 352 x 624 is 18,018 latent tokens: sp 4 and 8 leave a remainder, the trainer refuses, so does the plan."""
    with pytest.raises(SystemExit) as exit_info:
        planner.main(["--world_size", str(world), "--sp_size", str(sp)] + LAUNCH)
    assert exit_info.value.code == 2
    err = capsys.readouterr()
    assert "tokens-divisible-by-sp" in err.err and "18018 latent tokens" in err.err
    assert "peak per GPU" not in err.out  # no plan printed for a launch the trainer would not start


def test_a_launch_that_does_not_fit_exits_1(capsys):
    with pytest.raises(SystemExit) as exit_info:
        planner.main(["--world_size", "8", "--sp_size", "2", "--gpu_memory_gb", "24"] + LAUNCH)
    assert exit_info.value.code == 1
    out = capsys.readouterr().out
    assert "fits in 24 GB: NO" in out and out.strip().splitlines()[-1].startswith("peak per GPU: ")


def test_a_launch_that_fits_exits_0(capsys):
    planner.main(["--world_size", "8", "--sp_size", "2", "--gpu_memory_gb", "80"] + LAUNCH)  # no SystemExit
    assert "fits in 80 GB: yes" in capsys.readouterr().out


@pytest.mark.parametrize("backend", ["_native_efficient", "_native_cudnn"])
def test_backends_without_a_cpu_kernel_are_refused_up_front(backend):
    with pytest.raises(ConfigError, match=rf"--attention_backend {backend} cannot run on cpu.*native"):
        check_attention_runs(backend, torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("backend", ["native", "_native_math", "_native_flash"])
def test_backends_that_run_here_pass(backend):
    check_attention_runs(backend, torch.device("cpu"), torch.bfloat16)
    check_attention_runs(backend, torch.device("meta"), torch.bfloat16)  # nothing to run on: the package check only


def test_unknown_backend_is_refused():
    with pytest.raises(ConfigError, match="unknown attention backend"):
        check_attention_runs("fast", torch.device("cpu"), torch.float32)
