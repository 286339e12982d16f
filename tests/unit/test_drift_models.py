"""The drift proxy on the tiny real-class models: where its frozen base model comes from (a copy only where the run has
none: LoRA disables its adapters, a fixed anchor is the base) and the validation metric's arithmetic."""
import pytest
import torch
from model_fixtures import TINY_IMAGE_TOKENS, TINY_TEXT

from sage_grpo.config.train import TrainConfig
from sage_grpo.data import PromptItem
from sage_grpo.models.bundle import build_models, resolve_device
from sage_grpo.pipeline.drift import DriftProxyMetric
from sage_grpo.pipeline.sampler import sampler_of
from sage_grpo.pipeline.validation import ValidationSample, ValidationSamples
from sage_grpo.pipeline.velocity import cfg_velocity
from sage_grpo.plan.memory import placement_of
from sage_grpo.rl import drift_watch_of, kl_mode_of
from sage_grpo.rl.drift import proxy_noise

LATENT = (1, 4, 2, 2, 2)  # (B, C, T, h, w) of 5 frames of 16 x 16 with the tiny VAE


def bundle_of(root, **flags):
    cfg = TrainConfig.of(pretrained_model_root=str(root), dtype="fp32", device="cpu", enable_gradient_checkpointing=False,
                      vision_num_semantic_tokens=TINY_IMAGE_TOKENS, text_max_length=TINY_TEXT.max_length,
                      byt5_max_length=TINY_TEXT.max_length_2, cfg_scale=1.0, drift_proxy=True, **flags)
    kl_mode = kl_mode_of(cfg.trust_region)
    watch = drift_watch_of(cfg.drift, cfg.validation.validation_interval, cfg.lora.use_lora, kl_mode)
    return cfg, build_models(cfg, kl_mode, placement_of(cfg, resolve_device(cfg))), watch


def velocity(model, bundle, x):
    return cfg_velocity(model, x, torch.full((1,), 500.0), bundle.encode(["a red disk"]), 1.0,
                        num_image_tokens=TINY_IMAGE_TOKENS)


@pytest.mark.parametrize("flags, source", [({}, "copy"),
                                           ({"use_moving_KL": False}, "reference"), ({"use_lora": True}, "lora")])
@torch.no_grad()
def test_the_base_model_stays_the_base_while_the_policy_and_its_anchor_move(tiny_root, flags, source):
    _, bundle, watch = bundle_of(tiny_root, **flags)
    assert watch.base_copy == (source == "copy") and (bundle.base is not None) == (source == "copy")
    x = torch.randn(LATENT, generator=torch.Generator().manual_seed(0))
    with bundle.base_on_device() as base:
        before = velocity(base, bundle, x)
        assert {"copy": bundle.base, "reference": bundle.reference, "lora": bundle.policy}[source] is base
    assert torch.equal(before, velocity(bundle.policy, bundle, x))  # step 0: the policy is the base model
    noise = torch.Generator().manual_seed(1)
    for _, param in bundle.trainable_named_parameters():  # stands in for training (LoRA: the adapters)
        param.add_(0.1 * torch.randn(param.shape, generator=noise))
    if bundle.reference is not None and watch.base_copy:
        bundle.copy_policy_to_reference()  # the moving anchor follows the policy; the base does not
    moved = velocity(bundle.policy, bundle, x)
    with bundle.base_on_device() as base:
        assert torch.equal(velocity(base, bundle, x), before)
    assert not torch.allclose(moved, before) and torch.equal(velocity(bundle.policy, bundle, x), moved)
    if source == "copy":
        assert not any(p.requires_grad for p in bundle.base.parameters()) and not bundle.base.training


@torch.no_grad()
def test_the_validation_metric_is_the_base_models_reconstruction_error_by_hand(tiny_root):
    cfg, bundle, _ = bundle_of(tiny_root, use_moving_KL=False)
    x0 = torch.randn(LATENT, generator=torch.Generator().manual_seed(2))
    embeds = bundle.encode(["a red disk"])
    samples = ValidationSamples(4, sampler_of(cfg), bundle, True,
                                [ValidationSample(PromptItem(0, "a red disk", 930), embeds, x0[:, None])])
    value = DriftProxyMetric((0.5,))(samples)["drift_proxy"]
    # σ = 0.5, ε from the sample's seed: x_σ = 0.5·x0 + 0.5·ε, the base's unguided velocity at t = 500,
    # x̂0 = x_σ − 0.5·v
    eps = proxy_noise([930], 1, LATENT[1:])[0]
    noisy = 0.5 * x0 + 0.5 * eps
    x0_hat = noisy - 0.5 * velocity(bundle.reference, bundle, noisy)
    assert value == pytest.approx(float((x0_hat - x0).pow(2).mean()), rel=1e-6)
