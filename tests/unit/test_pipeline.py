"""Rollout and replay on the tiny checkpoint: shapes, seeding, exact replay, ODE parity with diffusers, the CFG switch,
fp32 timesteps for every precision and an exact zero KL to a freshly refreshed anchor."""

from dataclasses import replace

import pytest
import torch
from model_fixtures import TINY_IMAGE_TOKENS, TINY_TEXT, TINY_VIDEO

from sage_grpo import rl, sde
from sage_grpo.config.train import TrainConfig
from sage_grpo.config.validation import parse_size
from sage_grpo.models import PromptEncoder, load_components
from sage_grpo.models.loading import load_transformer
from sage_grpo.models.resolution import bucket_hw, resolution_hw
from sage_grpo.models.vae import decode_latents
from sage_grpo.pipeline import VideoSize, cfg_velocity, latent_shape, replay_step, rollout, step_timesteps
from sage_grpo.pipeline.sampler import Sampler
from sage_grpo.rl.grad_balance import grad_balance_scales

PROMPTS = ["A cat walks on the grass", 'A girl holding a paper with words "Hello, world!"', "A dog runs on a beach"]
SEEDS = [11, 12, 13]
NUM_STEPS = 4
LATENT = (4, 2, 2, 2)  # (C, T, h, w) of TINY_VIDEO


@pytest.fixture(scope="module")
def embeds(tiny_encoder):
    return tiny_encoder.encode(PROMPTS)


def tiny_sampler(sde_type="sage_grpo", guidance_scale=6.0, **settings):
    return Sampler.build(sde_type, 0.5, NUM_STEPS, 5.0, guidance_scale, num_image_tokens=TINY_IMAGE_TOKENS, **settings)


def run(components, embeds, seeds=SEEDS, sde_type="sage_grpo", guidance_scale=6.0, micro_batch_size=1, sigmas=None,
        **kwargs):
    sampler = tiny_sampler(sde_type, guidance_scale, micro_batch_size=micro_batch_size)
    sampler = sampler if sigmas is None else replace(sampler, sigmas=sigmas)
    return rollout(sampler, components.transformer, components.vae, embeds, seeds, VideoSize(**TINY_VIDEO), **kwargs)


@pytest.fixture(scope="module")
def sage_rollout(tiny_components, embeds):
    return run(tiny_components, embeds)


def test_rollout_shapes_and_ranges(sage_rollout):
    out = sage_rollout
    assert out.videos.shape == (3, 3, 5, 16, 16) and out.videos.dtype == torch.float32
    assert out.videos.min() >= 0 and out.videos.max() <= 1 and out.videos.std() > 0
    assert out.latents.shape == (3, NUM_STEPS + 1, *LATENT) and out.latents.dtype == torch.float32
    assert out.log_probs.shape == (3, NUM_STEPS) and torch.isfinite(out.log_probs).all()
    assert torch.equal(out.sigmas, sde.shifted_sigmas(NUM_STEPS, 5.0))
    assert torch.equal(out.timesteps, 1000 * out.sigmas[:-1])
    assert out.seeds == SEEDS and out.deterministic == [False] * NUM_STEPS
    # x_0 is fp32 noise from a CPU generator seeded with the sample's seed.
    for row, seed in enumerate(SEEDS):
        expected = torch.randn(LATENT, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(out.latents[row, 0], expected)
    assert (out.latents[:, 1:] != out.latents[:, :-1]).any(dim=(2, 3, 4, 5)).all()


def test_a_sample_does_not_depend_on_its_batch(tiny_components, embeds, sage_rollout):
    alone = run(tiny_components, embeds.select([2]), seeds=SEEDS[2:])
    assert torch.equal(alone.latents[0], sage_rollout.latents[2])
    assert torch.equal(alone.log_probs[0], sage_rollout.log_probs[2])
    again = run(tiny_components, embeds, initial_latents=sage_rollout.latents[:, 0])
    assert torch.equal(again.latents, sage_rollout.latents)  # same x_0 -> same SDE noise too


@pytest.mark.parametrize("sde_type", sde.SDE_TYPES)
def test_replay_reproduces_rollout_log_probs_exactly(tiny_components, embeds, sde_type):
    out = run(tiny_components, embeds.select([0, 1]), seeds=SEEDS[:2], sde_type=sde_type, decode=False)
    transformer = tiny_components.transformer
    for k in range(NUM_STEPS):
        for row in range(2):
            sample = slice(row, row + 1)
            for index in (k, torch.tensor([k])):  # shared int index and per-sample LongTensor index
                replayed = replay_step(tiny_sampler(sde_type), transformer, out.latents[sample, k],
                                       out.latents[sample, k + 1], index, embeds.select([row]))  # grad enabled
                assert torch.equal(replayed.log_prob, out.log_probs[sample, k]), (sde_type, k, row)
                assert replayed.log_prob.requires_grad


def test_replay_with_micro_batches(tiny_components, embeds):
    out = run(tiny_components, embeds.select([0, 1]), seeds=SEEDS[:2], micro_batch_size=2, decode=False)
    for k in range(NUM_STEPS):
        replayed = replay_step(tiny_sampler(), tiny_components.transformer, out.latents[:, k], out.latents[:, k + 1],
                               torch.tensor([k, k]), embeds.select([0, 1]))
        assert torch.equal(replayed.log_prob, out.log_probs[:, k])


def test_replay_gradients_flow_through_both_cfg_branches(tiny_components, embeds, sage_rollout):
    transformer = tiny_components.transformer
    conditioning = embeds.select([0])
    conditioning.embeds.requires_grad_(True)
    conditioning.neg_embeds.requires_grad_(True)
    transformer.zero_grad()
    out = replay_step(tiny_sampler(), transformer, sage_rollout.latents[:1, 1], sage_rollout.latents[:1, 2], 1,
                      conditioning)
    out.log_prob.sum().backward()
    assert conditioning.embeds.grad.abs().sum() > 0 and conditioning.neg_embeds.grad.abs().sum() > 0
    assert transformer.proj_out.weight.grad.abs().sum() > 0
    assert out.mean.shape == (1, *LATENT) and out.std.shape == ()
    transformer.zero_grad(set_to_none=True)


def test_cfg_velocity_formula(tiny_components, embeds):
    transformer, conditioning = tiny_components.transformer, embeds.select([1])
    latents = torch.randn(1, *LATENT, generator=torch.Generator().manual_seed(0))
    timesteps = step_timesteps(sde.shifted_sigmas(NUM_STEPS), 1, 1)
    with torch.no_grad():
        v_cond = cfg_velocity(transformer, latents, timesteps, conditioning, 1.0, num_image_tokens=TINY_IMAGE_TOKENS)
        swapped = type(conditioning)(*conditioning.negative(), *conditioning.positive())
        v_uncond = cfg_velocity(transformer, latents, timesteps, swapped, 1.0, num_image_tokens=TINY_IMAGE_TOKENS)
        guided = cfg_velocity(transformer, latents, timesteps, conditioning, 6.0, num_image_tokens=TINY_IMAGE_TOKENS)
    torch.testing.assert_close(guided, v_uncond + 6.0 * (v_cond - v_uncond), rtol=1e-5, atol=1e-5)


def _record_calls(transformer, calls):
    """Forward pre-hook appending each call's keyword arguments (the velocity passes them all by keyword)."""
    return transformer.register_forward_pre_hook(lambda module, args, kwargs: calls.append(kwargs), with_kwargs=True)


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_no_guidance_at_scales_up_to_one(tiny_components, embeds, scale):
    """As the reference's denoise_step: guidance only for s > 1; s <= 1 runs the positive branch alone (v = v_c)."""
    transformer, conditioning = tiny_components.transformer, embeds.select([1])
    latents = torch.randn(1, *LATENT, generator=torch.Generator().manual_seed(0))
    timesteps = step_timesteps(sde.shifted_sigmas(NUM_STEPS), 1, 1)
    calls = []
    handle = _record_calls(transformer, calls)
    try:
        with torch.no_grad():
            velocity = cfg_velocity(transformer, latents, timesteps, conditioning, scale,
                                    num_image_tokens=TINY_IMAGE_TOKENS)
            cfg_velocity(transformer, latents, timesteps, conditioning, 1.5, num_image_tokens=TINY_IMAGE_TOKENS)
    finally:
        handle.remove()
    assert [call["hidden_states"].shape[0] for call in calls] == [1, 2]  # s > 1: one call on [negative; positive]
    assert torch.equal(calls[0]["encoder_hidden_states"], conditioning.embeds)
    swapped = type(conditioning)(*conditioning.negative(), *conditioning.positive())
    with torch.no_grad():
        v_uncond = cfg_velocity(transformer, latents, timesteps, swapped, 1.0, num_image_tokens=TINY_IMAGE_TOKENS)
    assert not torch.allclose(velocity, v_uncond)  # what v_u + s*(v_c - v_u) would have mixed in


def test_policy_and_bf16_reference_see_the_same_fp32_timesteps(tiny_root, tiny_components, embeds, sage_rollout):
    """The trainer's --dtype bf16 models: an fp32 policy and a bf16 reference under bf16 autocast, and a bf16 model
    with no autocast requested (generate.py --dtype bf16). All get t = 1000*sigma_k in fp32; rounded to the bf16
    weights' dtype, 1000*sigma_1 = 989.58 would be 988."""
    policy, reference = tiny_components.transformer, load_transformer(tiny_root, dtype=torch.bfloat16)
    seen = {"policy": [], "reference": [], "reference, no autocast": []}
    runs = [("policy", policy, torch.bfloat16), ("reference", reference, torch.bfloat16),
            ("reference, no autocast", reference, None)]
    for name, model, autocast_dtype in runs:
        handle = _record_calls(model, seen[name])
        try:
            with torch.no_grad():
                for k in range(NUM_STEPS):
                    replay_step(tiny_sampler(autocast_dtype=autocast_dtype), model, sage_rollout.latents[:1, k],
                                sage_rollout.latents[:1, k + 1], k, embeds.select([0]))
        finally:
            handle.remove()
    expected = [step_timesteps(sage_rollout.sigmas, k, 2) for k in range(NUM_STEPS)]  # (2,): CFG doubles the batch
    assert 1000 * sage_rollout.sigmas[1] != (1000 * sage_rollout.sigmas[1]).bfloat16().float()  # bf16 would move it
    for name, calls in seen.items():
        timesteps = [call["timestep"] for call in calls]
        assert all(t.dtype == torch.float32 for t in timesteps), name
        assert all(torch.equal(t, e) for t, e in zip(timesteps, expected)) and len(timesteps) == NUM_STEPS, name


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_moving_kl_to_a_freshly_refreshed_anchor_is_zero(tiny_root, precision):
    """The trainer's reference means and dual KL (trainer.reference_means / policy_update) on a policy that has moved
    away from the base: KL_pos > 0 against the base, exactly 0 once the anchor is refreshed from the policy, when
    policy and reference run at the same precision (bf16: bf16 weights under bf16 autocast)."""
    from sage_grpo.models.bundle import build_models, resolve_device
    from sage_grpo.pipeline.sampler import sampler_of
    from sage_grpo.plan.memory import placement_of
    from sage_grpo.rl import kl_mode_of

    cfg = TrainConfig.of(pretrained_model_root=str(tiny_root), dtype=precision, master_weight_type=precision,
                      device="cpu", kl_weight=1e-5, enable_gradient_checkpointing=False,
                      vision_num_semantic_tokens=TINY_IMAGE_TOKENS,
                      text_max_length=TINY_TEXT.max_length, byt5_max_length=TINY_TEXT.max_length_2)
    bundle = build_models(cfg, kl_mode_of(cfg.trust_region), placement_of(cfg, resolve_device(cfg)))
    noise = torch.Generator().manual_seed(5)
    with torch.no_grad():  # stands in for some optimizer updates
        for param in bundle.policy.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=noise).to(param.dtype))
    embeds = bundle.encode(PROMPTS[:1])
    sampler = replace(sampler_of(cfg), sigmas=sde.shifted_sigmas(NUM_STEPS))
    rollout_out = sampler.rollout(bundle.policy, bundle.vae, embeds, SEEDS[:1], **TINY_VIDEO)

    def kl_parts():
        parts = []
        for k in range(NUM_STEPS):
            x, x_next = rollout_out.latents[:, k], rollout_out.latents[:, k + 1]
            with torch.no_grad(), bundle.reference_on_device() as reference:
                ref_mean = sampler.replay(reference, x, x_next, k, embeds).mean
            out = sampler.replay(bundle.policy, x, x_next, torch.tensor([k]), embeds)
            parts.append(rl.dual_kl(out.mean, ref_mean, out.std, rollout_out.log_probs[:, k], out.log_prob,
                                    use_dual_kl=True)[1])
        return parts

    assert all(part["kl_moving"] > 0 for part in kl_parts())  # the base model as the anchor
    bundle.copy_policy_to_reference()
    refreshed = kl_parts()
    assert all(part["kl_moving"] == 0.0 and part["kl_stepwise"] == 0.0 for part in refreshed), refreshed


# Tolerances of the ODE parity with diffusers (max |diff|) per precision. fp32: the same math. bf16: diffusers keeps
# the latents (rounded after every Euler step) and the timesteps (989.58 -> 988) in bf16, ours keeps both in fp32
# with bf16 compute; measured on the CPU (2026-11-23): latents 0.073, frames 0.018; the tolerances are twice that.
PARITY_ATOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (0.15, 0.04)}  # (latents, frames)


@pytest.mark.device
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_ode_rollout_matches_diffusers_pipeline(tiny_root, tiny_components, device, dtype):
    """Our deterministic rollout (generate.py's sampler) against diffusers' ``HunyuanVideo15Pipeline`` with every
    component in ``dtype`` on ``--device``, from the same initial latents (rounded to ``dtype``, as diffusers
    does)."""
    from diffusers import ClassifierFreeGuidance, FlowMatchEulerDiscreteScheduler, HunyuanVideo15Pipeline

    on_cpu_fp32 = device.type == "cpu" and dtype == torch.float32
    c = tiny_components if on_cpu_fp32 else load_components(tiny_root, dtype=dtype, device=device)
    encoder = PromptEncoder.from_components(c, TINY_TEXT)
    embeds = encoder.encode(PROMPTS[:2])
    noise = torch.stack([torch.randn(LATENT, generator=torch.Generator().manual_seed(s)) for s in SEEDS[:2]])
    noise = noise.to(dtype).float()
    ours = run(c, embeds, seeds=SEEDS[:2], deterministic=True, guidance_scale=6.0, initial_latents=noise)
    assert ours.latents.device == device and c.transformer.device == device and c.transformer.dtype == dtype
    pipe = HunyuanVideo15Pipeline(c.text_encoder, c.tokenizer, c.transformer, c.vae,
                                  FlowMatchEulerDiscreteScheduler.from_config(c.scheduler_config), c.text_encoder_2,
                                  c.tokenizer_2, ClassifierFreeGuidance(guidance_scale=6.0))
    pipe.set_progress_bar_config(disable=True)
    pipe.tokenizer_max_length, pipe.tokenizer_2_max_length = TINY_TEXT.max_length, TINY_TEXT.max_length_2
    pipe.prompt_template_encode_start_idx = encoder.crop_start
    pipe.vision_num_semantic_tokens = TINY_IMAGE_TOKENS
    # negative_prompt=None: diffusers encodes "" per prompt (a plain "" string fails for batches > 1 in 0.42.1).
    common = dict(negative_prompt=None, num_inference_steps=NUM_STEPS, output_type="latent", **TINY_VIDEO)
    latents = pipe(prompt=PROMPTS[:2], latents=noise.to(device), **common).frames
    assert pipe.scheduler.config.shift == 5.0 and latents.device == device
    torch.testing.assert_close(pipe.scheduler.sigmas.cpu(), ours.sigmas, rtol=0, atol=1e-6)
    latent_atol, frames_atol = PARITY_ATOL[dtype]
    torch.testing.assert_close(latents.float(), ours.final_latents, rtol=0, atol=latent_atol)
    # Decoded frames (one prompt: the 0.42.1 VAE's mid-block attention fails on batches > 1).
    common["output_type"] = "pt"
    frames = pipe(prompt=PROMPTS[1:2], latents=noise[1:2].to(device), **common).frames  # (1, F, 3, H, W)
    torch.testing.assert_close(frames.float().cpu().permute(0, 2, 1, 3, 4), ours.videos[1:2], rtol=0,
                               atol=frames_atol)


def test_deterministic_steps_and_overrides(tiny_components, embeds, sage_rollout):
    flags = [True, False, True, False]
    mixed = run(tiny_components, embeds, deterministic=flags, decode=False)
    sigmas = mixed.sigmas
    with torch.no_grad():
        for k in (0, 2):  # Euler steps: x' = x + dt * v
            v = cfg_velocity(tiny_components.transformer, mixed.latents[:1, k], step_timesteps(sigmas, k, 1),
                             embeds.select([0]), 6.0, num_image_tokens=TINY_IMAGE_TOKENS)
            assert torch.equal(mixed.latents[:1, k + 1], mixed.latents[:1, k] + (sigmas[k + 1] - sigmas[k]) * v)
    assert mixed.deterministic == flags and torch.isfinite(mixed.log_probs).all()
    custom = torch.tensor([1.0, 0.9, 0.6, 0.0])
    generators = [torch.Generator().manual_seed(99) for _ in SEEDS]
    other = run(tiny_components, embeds, sigmas=custom, sde_generators=generators, decode=False)
    assert other.latents.shape[1] == 4 and torch.equal(other.sigmas, custom)
    assert torch.equal(other.latents[:, 0], sage_rollout.latents[:, 0])  # x_0 still from the seeds
    with pytest.raises(ValueError, match="deterministic has 2 entries"):
        run(tiny_components, embeds, deterministic=[True, False])


def test_decode_divides_by_the_scaling_factor_once(tiny_components, sage_rollout):
    vae, final = tiny_components.vae, sage_rollout.final_latents
    with torch.no_grad():
        expected = vae.decode(final[:1] / vae.config.scaling_factor).sample
    torch.testing.assert_close(decode_latents(vae, final[:1]), (expected / 2 + 0.5).clamp(0, 1), rtol=0, atol=0)
    assert torch.equal(decode_latents(vae, final), sage_rollout.videos)


def test_sizes_and_resolution_table(tiny_components):
    assert bucket_hw() == (352, 624) and bucket_hw(640) == (480, 864) and bucket_hw(960) == (720, 1280)
    assert resolution_hw("480p") == (480, 864) and resolution_hw("720p", "16:9") == (720, 1280)
    assert resolution_hw("480p", "9:16") == (848, 480)  # diffusers' closest-ratio bucket for base 640
    assert parse_size("480x864") == (480, 864)
    assert parse_size("") is None  # no size given: the caller's default (the one rule of every size flag)
    for bad in ("480", "480x", "0x16", "axb"):
        with pytest.raises(ValueError, match="HEIGHTxWIDTH"):
            parse_size(bad)
    with pytest.raises(ValueError, match="unknown bucket base size 500"):
        bucket_hw(500)
    assert latent_shape(tiny_components.vae.config, 81, 352, 624) == (4, 21, 44, 78)
    with pytest.raises(ValueError, match="1 \\+ a multiple of 4"):
        latent_shape(tiny_components.vae.config, 80, 16, 16)
    with pytest.raises(ValueError, match="multiples of 8"):
        latent_shape(tiny_components.vae.config, 5, 20, 16)


def test_the_sampler_is_decided_once():
    from sage_grpo.pipeline.sampler import Sampler, sampler_of

    cfg = TrainConfig.of(sde_type="cps", eta=0.7, grpo_sampling_steps=6, infer_flow_shift_video=3.0, cfg_scale=4.0,
                      dtype="bf16", vision_num_semantic_tokens=4, mini_batch_size_per_update=1)
    sampler = sampler_of(cfg)
    assert (sampler.sde_type, sampler.eta, sampler.num_steps, sampler.guidance_scale) == ("cps", 0.7, 6, 4.0)
    assert sampler.autocast_dtype == torch.bfloat16 and sampler.num_image_tokens == 4
    assert torch.equal(sampler.sigmas, sde.shifted_sigmas(6, 3.0))
    validation = sampler.with_schedule(10, 5.0)
    assert validation.num_steps == 10 and validation.sde_type == "cps" and validation.guidance_scale == 4.0
    assert torch.equal(sampler.grad_balance_scales(), grad_balance_scales("cps", sampler.sigmas, 0.7))
    with pytest.raises(ValueError):
        Sampler.build("flow_grpo", 0.0, 6, 3.0, 4.0)  # no noise: no log-probability
