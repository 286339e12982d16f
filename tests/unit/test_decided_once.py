"""Each decision made once and handed on: what is decided at setup is not re-decided per step."""
import pytest
import torch

from sage_grpo import sde
from sage_grpo.sde import registry
from sage_grpo.config.train import TrainConfig
from sage_grpo.config.sections import fields_by_name
from sage_grpo.pipeline.sampler import Sampler


def test_the_sde_names_are_listed_once():
    """--sde_type's choices are the SDE table's names (a live view: a table line is a choice), each kernel known by
    its own name."""
    choices = fields_by_name(TrainConfig)["sde_type"].metadata["choices"]
    assert choices is sde.SDE_TYPES and list(choices) == list(sde.SDE_KERNELS) == ["sage_grpo", "dance_grpo",
                                                                                  "flow_grpo", "cps"]
    assert [sde.get_kernel(name).name for name in choices] == list(choices)


def test_a_sampler_with_an_unknown_sde_fails_at_construction():
    with pytest.raises(ValueError, match="unknown sde_type 'ddim'; valid choices: sage_grpo, dance_grpo"):
        Sampler.build("ddim", 0.5, 4, 5.0, 6.0)


def test_the_sampler_holds_the_kernel_and_steps_never_look_it_up(monkeypatch):
    sampler = Sampler.build("cps", 0.5, 4, 5.0, 6.0)
    assert sampler.kernel is sde.get_kernel("cps") and sampler.sde_type == "cps"
    monkeypatch.setattr(registry, "SDE_KERNELS", {})  # any lookup by name would now fail
    x, v = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    out = sde.step(sampler.kernel, v, x, sampler.sigmas, 1, sampler.eta, generator=torch.Generator().manual_seed(0))
    assert out.prev_sample.shape == x.shape and torch.isfinite(out.log_prob).all()
    sde.check_schedule(sampler.kernel, sampler.sigmas, sampler.eta)


def test_token_divisibility_is_checked_once_per_shape():
    from sage_grpo.config.validation import ConfigError, check_sequence_parallel_tokens
    from sage_grpo.distributed.sequence_parallel import local_chunk

    check_sequence_parallel_tokens.cache_clear()
    x = torch.arange(12.0).view(1, 12, 1)
    for _ in range(5):  # five forwards of one shape: one check, four cache hits
        assert torch.equal(local_chunk(x, 1, 2, 1), x[:, 6:])
    info = check_sequence_parallel_tokens.cache_info()
    assert (info.misses, info.hits) == (1, 4)
    for _ in range(2):  # a failing shape is never cached: it raises, with the setup's message, every time
        with pytest.raises(ConfigError, match=r"\[tokens-divisible-by-sp\] 12 latent tokens per video cannot be split"):
            local_chunk(x, 1, 5, 0)


def test_the_parallel_layout_has_one_rule_used_by_the_validator_and_parallel_dims():
    from sage_grpo.config import validation
    from sage_grpo.distributed import parallel_dims

    assert parallel_dims.check_parallel_layout is validation.check_parallel_layout  # imported, not a second copy
    expected = r"\[heads-divisible-by-sp\] the transformer has 3 attention heads, not divisible by --sp_size 2"
    with pytest.raises(validation.ConfigError, match=expected):
        validation.validate_train_config(TrainConfig.of(sp_size=2), world_size=2, num_attention_heads=3)
    with pytest.raises(validation.ConfigError, match=expected):
        parallel_dims.ParallelDims(world_size=2, sp_size=2, num_attention_heads=3)


def test_beta_is_a_device_tensor_for_the_whole_run_when_the_controller_has_a_device():
    from sage_grpo.rl import AdaptiveKLController

    kls = [1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 0.0, 0.0, 5.0]
    make = lambda **kw: AdaptiveKLController.from_flags(1.0, 0.5, 0.2, horizon=4, window=2, **kw)
    on_floats, on_device = make(), make(device=torch.device("cpu"))
    assert isinstance(on_device.kl_coef, torch.Tensor) and on_device.kl_coef.dtype == torch.float64  # before any update
    for kl in kls:  # warm-up and adjustment alike: one type, the same values as the float controller
        expected = on_floats.update(kl)
        beta = on_device.update(torch.tensor(kl, dtype=torch.float64))
        assert isinstance(beta, torch.Tensor) and beta.shape == () and float(beta) == expected
    resumed = make(device=torch.device("cpu"))
    resumed.load_state_dict(on_device.state_dict())
    assert isinstance(resumed.kl_coef, torch.Tensor) and float(resumed.kl_coef) == float(on_device.kl_coef)


def test_the_memory_plan_asks_the_runs_kl_mode_not_the_flags(monkeypatch):
    from sage_grpo.models.placement import Placement
    from sage_grpo.plan import memory as planner
    from sage_grpo import rl

    cfg = TrainConfig.of(kl_weight=1e-5, use_lora=False)  # by the flags: a KL anchor held beside the policy
    placement = Placement(True, False, "auto")

    def component_names():
        phases = planner.plan_memory(cfg, planner.sizes_of(cfg), 1, 80.0, placement).phases
        return {c.name for phase in phases for c in phase.components}

    assert "reference (KL anchor) shards" in component_names()
    monkeypatch.setattr(rl, "kl_mode_of", lambda config: rl.NO_KL)  # the one decision says: no reference
    assert "reference (KL anchor) shards" not in component_names()
