"""--reference_batch_size: transitions per no-grad forward of the KL reference means. A batched forward is
not bit-identical to one transition per forward on the CPU (measured: up to 1.3e-6 apart on the toy and tiny models,
fp32), so auto keeps --mini_batch_size_per_update off CUDA; on CUDA the plan takes the largest batch that does not
raise the step's peak."""

import dataclasses

import pytest
import torch
from model_fixtures import TINY_IMAGE_TOKENS

from sage_grpo.config import ConfigError, parse_cli
from sage_grpo.config.train import TrainConfig
from sage_grpo.config.validation import validate_train_config
from sage_grpo.pipeline.sampler import Sampler
from sage_grpo.plan import memory as planner


def test_cpu_keeps_the_update_batch_unless_told():
    cfg = TrainConfig.of(sp_size=1, validation_interval=0, batch_size=4, mini_batch_size_per_update=2)
    assert planner.resolve_placement(cfg, sharded=False, device_type="cpu").reference_batch_size == 2
    told = cfg.replace(reference_batch_size=8)
    assert planner.resolve_placement(told, sharded=False, device_type="cpu").reference_batch_size == 8
    # a plan made for a GPU does not carry its batch onto a CPU device
    plan = planner.plan_launch(cfg, 1, 80.0)
    assert planner.resolve_placement(cfg, sharded=False, device_type="cpu", plan=plan).reference_batch_size == 2


def test_cuda_auto_takes_the_largest_batch_under_the_peak():
    cfg = TrainConfig.of(sp_size=2, validation_interval=0, batch_size=2, grpo_sampling_steps=16)
    assert planner.reference_batch_candidates(cfg) == [1, 2, 4, 8, 16, 32]
    assert planner.reference_batch_candidates(cfg.replace(sde_window_size=3)) == [1, 2, 4, 6]
    # this launch's whole rollout batch (2 x 16 transitions) fits under its training peak; at 4 prompts (4 x 16)
    # the largest candidate would not
    assert planner.plan_launch(cfg, 8, 80.0).placement.reference_batch_size == 32
    cfg = cfg.replace(batch_size=4)
    faithful = planner.plan_launch(cfg.replace(reference_batch_size=1), 8, 80.0)
    auto = planner.plan_launch(cfg, 8, 80.0)
    chosen = auto.placement.reference_batch_size
    assert 1 < chosen < 64 and auto.peak.bytes == faithful.peak.bytes  # batched, and the peak did not move
    reference = auto.phase("reference").bytes
    assert reference > faithful.phase("reference").bytes
    larger = planner.plan_launch(cfg.replace(reference_batch_size=2 * chosen), 8, 80.0)
    assert larger.peak.bytes > faithful.peak.bytes  # the next candidate would have raised the peak
    assert larger.placement.reference_batch_size == 2 * chosen  # an explicit value is taken as given


def test_negative_is_refused():
    with pytest.raises(ConfigError, match="--reference_batch_size -1 must be >= 0"):
        validate_train_config(parse_cli(TrainConfig, ["--reference_batch_size", "-1", "--sp_size", "1",
                                                       "--num_generations", "2"]))


def test_the_sampler_runs_its_own_batch(tiny_components, tiny_encoder):
    """``with_micro_batch`` changes the transitions per forward of the means and nothing else: 2 forwards of 3
    transitions for 2 samples x 3 steps."""
    sampler = Sampler.build("sage_grpo", 0.5, 3, 5.0, 6.0, num_image_tokens=TINY_IMAGE_TOKENS)
    batched = sampler.with_micro_batch(3)
    assert dataclasses.replace(batched, micro_batch_size=1) == sampler
    calls = []
    handle = tiny_components.transformer.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append(kwargs["hidden_states"].shape[0]), with_kwargs=True)
    try:
        latents = torch.randn(2, 4, 4, 2, 2, 2, generator=torch.Generator().manual_seed(1))
        batched.transition_means(tiny_components.transformer, latents, tiny_encoder.encode(["a", "b c"]),
                                 torch.device("cpu"))
    finally:
        handle.remove()
    assert calls == [6, 6]  # 3 transitions x 2 CFG branches per forward
