"""The GPU-relevant paths on the device of ``--device`` (tier ``device``; the CPU by default, so CI runs them too):
``bash scripts/test.sh --device cuda -m device`` runs this module and the ODE parity with diffusers
(``tests/unit/test_pipeline.py``) on a GPU.

Models are built the trainer's way (:func:`sage_grpo.models.bundle.build_models` with ``--device``), at the two
precisions a run can train in:

* ``fp32``: fp32 weights, no autocast;
* ``bf16``: ``--dtype bf16 --master_weight_type fp32``, the reference launch: the policy's fp32 master weights run
  under bf16 autocast, the KL reference holds bf16 weights.

Every test asserts that its models and outputs live on the device, so a CUDA run cannot pass on the CPU unnoticed.
"""

from dataclasses import replace

import pytest
import torch
from model_fixtures import TINY_IMAGE_TOKENS, TINY_TEXT, TINY_VIDEO

from sage_grpo import rl, sde
from sage_grpo.config.train import TrainConfig
from sage_grpo.export.weights import export_checkpoint, read_trained_weights
from sage_grpo.models.lora import LoraTraining
from sage_grpo.models.attention import install_joint_attention
from sage_grpo.models.bundle import build_models, resolve_device
from sage_grpo.pipeline.sampler import sampler_of
from sage_grpo.plan.memory import placement_of
from sage_grpo.rl import kl_mode_of
from sage_grpo.models.loading import load_transformer
from sage_grpo.optim.optimizers import build_optimizer
from sage_grpo.pipeline import cfg_velocity, step_timesteps

pytestmark = pytest.mark.device

PROMPTS = ["A cat walks on the grass"]
SEEDS = [11]
NUM_STEPS = 2


def tiny_train_config(root, device: torch.device, precision: str, **changes) -> TrainConfig:
    """A run's configuration on the tiny checkpoint at ``precision`` (fp32, or bf16 autocast on fp32 masters)."""
    return TrainConfig.of(pretrained_model_root=str(root), dtype=precision, master_weight_type="fp32",
                       device=str(device), grpo_sampling_steps=NUM_STEPS, enable_gradient_checkpointing=False,
                       vision_num_semantic_tokens=TINY_IMAGE_TOKENS, text_max_length=TINY_TEXT.max_length,
                       byt5_max_length=TINY_TEXT.max_length_2, **changes)


def assert_on(device: torch.device, *tensors: torch.Tensor) -> None:
    for tensor in tensors:
        assert tensor.device == device, f"a tensor is on {tensor.device}, not on the tested device {device}"


@pytest.fixture(scope="module", params=["fp32", "bf16"])
def bundle(request, tiny_root, device):
    """The policy (fp32 masters), the dual-KL reference (in --dtype) and the encoder of a tiny run on ``device``."""
    cfg = tiny_train_config(tiny_root, device, request.param, kl_weight=1e-3, use_dual_kl=True)
    models = build_models(cfg, kl_mode_of(cfg.trust_region), placement_of(cfg, resolve_device(cfg)))
    assert models.device == device and models.policy.dtype == torch.float32
    assert models.reference.dtype == (torch.bfloat16 if request.param == "bf16" else torch.float32)
    assert_on(device, *models.policy.parameters(), *models.reference.parameters(), *models.vae.parameters())
    models.cfg = cfg  # the tests read the run's configuration beside its models
    return models


@pytest.mark.parametrize("sde_type", sde.SDE_TYPES)
def test_replay_reproduces_rollout_log_probs_exactly(bundle, sde_type, device):
    """Rollout (no grad) then replay of every transition (grad on, per-sample step index, as the trainer's update):
    the same log-prob bit for bit. One sample: the rollout and the replay must see the same micro-batch composition
    (--mini_batch_size_per_update, default 1), which tests/unit/test_pipeline.py covers for larger micro-batches."""
    sampler = replace(sampler_of(bundle.cfg), kernel=sde.get_kernel(sde_type))
    assert sampler.autocast_dtype == (torch.bfloat16 if bundle.cfg.model.dtype == "bf16" else None)
    embeds = bundle.encode(PROMPTS)
    out = sampler.rollout(bundle.policy, bundle.vae, embeds, SEEDS, decode=False, **TINY_VIDEO)
    assert_on(device, out.latents, out.log_probs, embeds.embeds)
    assert torch.isfinite(out.log_probs).all()
    for k in range(NUM_STEPS):
        replayed = sampler.replay(bundle.policy, out.latents[:, k], out.latents[:, k + 1],
                                  torch.tensor([k], device=device), embeds)
        assert_on(device, replayed.log_prob, replayed.mean)
        assert replayed.log_prob.requires_grad
        assert torch.equal(replayed.log_prob, out.log_probs[:, k]), (sde_type, bundle.cfg.model.dtype, k)



def test_shuffled_micro_batches_replay_exactly(bundle, device):
    """--mini_batch_size_per_update 2: the update replays shuffled samples, each at its own permuted step, two per
    call, as the rollout ran them two per call at one shared step; the log-probs still agree bit for bit (the
    kernels' results per row do not depend on the row's place or its neighbours' step, at equal batch size)."""
    sampler = replace(sampler_of(bundle.cfg), micro_batch_size=2)
    embeds = bundle.encode(PROMPTS + ['A girl holding a paper with words "Hello, world!"'])
    out = sampler.rollout(bundle.policy, bundle.vae, embeds, SEEDS + [12], decode=False, **TINY_VIDEO)
    rows = torch.tensor([1, 0])
    for steps in (torch.tensor([0, 1]), torch.tensor([1, 0])):
        replayed = sampler.replay(bundle.policy, out.latents[rows, steps], out.latents[rows, steps + 1],
                                  steps.to(device), embeds.select(rows.tolist()))
        assert_on(device, replayed.log_prob)
        assert torch.equal(replayed.log_prob, out.log_probs[rows, steps]), (bundle.cfg.model.dtype, steps)

def test_first_policy_step_has_ratio_one_and_zero_stepwise_kl(bundle, device):
    """The trainer's first update on its own rollout (one sample, as the rollout's micro-batches of the default
    --mini_batch_size_per_update 1): r = exp(log p_new - log p_old) = 1 exactly (no clipping) and the step-wise KL
    exactly 0; the KL reference's means (computed and kept on the device) are finite."""
    sampler = sampler_of(bundle.cfg)
    embeds = bundle.encode(PROMPTS)
    out = sampler.rollout(bundle.policy, bundle.vae, embeds, SEEDS, decode=False, **TINY_VIDEO)
    with bundle.reference_on_device() as reference:
        assert_on(device, *reference.parameters())
        ref_means = sampler.transition_means(reference, out.latents, embeds, device)
    assert ref_means.device.type == device.type and torch.isfinite(ref_means).all()
    advantages = torch.tensor([1.0], device=device)
    bundle.policy.zero_grad(set_to_none=True)
    for k in range(NUM_STEPS):
        new = sampler.replay(bundle.policy, out.latents[:, k], out.latents[:, k + 1], torch.tensor([k], device=device),
                             embeds)
        old = out.log_probs[:, k]
        loss, metrics = rl.ppo_clipped_loss(new.log_prob, old, advantages, clip_range=1e-4)
        assert torch.equal(torch.exp(new.log_prob - old), torch.ones_like(old)), (bundle.cfg.model.dtype, k)
        assert metrics["ratio_mean"].item() == 1.0 and metrics["clipfrac"].item() == 0.0
        kl, parts = rl.dual_kl(new.mean, ref_means[:, k].to(device), new.std, old, new.log_prob, use_dual_kl=True)
        assert parts["kl_stepwise"].item() == 0.0 and torch.isfinite(kl), (bundle.cfg.model.dtype, k)
        assert_on(device, loss, kl)
        (loss + 1e-3 * kl).backward()
    grads = [p.grad for p in bundle.policy.parameters() if p.grad is not None]
    assert grads and all(g.dtype == torch.float32 for g in grads)  # fp32 master gradients under bf16 autocast
    assert_on(device, *grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0
    bundle.policy.zero_grad(set_to_none=True)


def velocity(transformer, embeds, latents, autocast_dtype) -> torch.Tensor:
    """The guided velocity at the schedule's second step, without gradients."""
    timesteps = step_timesteps(sde.shifted_sigmas(NUM_STEPS), 1, latents.shape[0])
    with torch.no_grad():
        return cfg_velocity(transformer, latents, timesteps, embeds, 6.0, autocast_dtype=autocast_dtype,
                            num_image_tokens=TINY_IMAGE_TOKENS)


@pytest.fixture(scope="module")
def lora_run(tiny_root, device, tmp_path_factory):
    """One LoRA update of a --dtype bf16 run (bf16 base, fp32 adapters under bf16 autocast) on the device; the
    model, the peft adapter folder it saved, the prompt embeddings, a latent and the parameters before the update."""
    cfg = tiny_train_config(tiny_root, device, "bf16", use_lora=True, lora_r=4, lora_alpha=8, kl_weight=0.0)
    models = build_models(cfg, kl_mode_of(cfg.trust_region), placement_of(cfg, resolve_device(cfg)))
    assert_on(device, *models.policy.parameters())
    before = {name: param.detach().clone() for name, param in models.policy.named_parameters()}
    sampler = sampler_of(cfg)
    embeds = models.encode(PROMPTS)
    out = sampler.rollout(models.policy, models.vae, embeds, SEEDS, decode=False, **TINY_VIDEO)
    optimizer = build_optimizer(models.trainable_named_parameters(), use_muon=False, lr=1e-2, weight_decay=0.0)
    new = sampler.replay(models.policy, out.latents[:, 1], out.latents[:, 2], torch.tensor([1], device=device),
                         embeds)
    loss, _ = rl.ppo_clipped_loss(new.log_prob, out.log_probs[:, 1], torch.ones(1, device=device), clip_range=1e-4)
    loss.backward()
    optimizer.step()
    folder = models.lora.save_folder(tmp_path_factory.mktemp("lora") / "adapter")
    return models, folder, embeds, out.latents[:, 1], before


def test_lora_update_moves_only_the_adapter_and_its_folder_reloads_on_the_device(lora_run, tiny_root, device):
    models, folder, embeds, latents, before = lora_run
    after = dict(models.policy.named_parameters())
    moved = {name for name, param in after.items() if not torch.equal(param.detach(), before[name])}
    trainable = {name for name, _ in models.trainable_named_parameters()}
    assert moved and moved <= trainable and all(".lora_" in name for name in trainable)
    assert all(after[name].dtype == torch.float32 for name in trainable)
    assert {p.dtype for name, p in after.items() if name not in trainable} == {torch.bfloat16}  # the frozen base

    fresh = load_transformer(tiny_root, dtype=torch.bfloat16, device=device)
    LoraTraining.create(fresh, r=4, alpha=8, dropout=0.0, target_modules=None, pretrained_path=str(folder),
                        with_anchor=False, seed=0, dtype=torch.float32)
    assert_on(device, *fresh.parameters())
    trained = models.lora.policy_state()
    reloaded = {name: param for name, param in fresh.named_parameters() if ".lora_" in name}
    assert reloaded.keys() == {name for name in after if ".lora_" in name}
    assert all(torch.equal(reloaded[name].detach(), after[name].detach()) for name in reloaded) and trained
    models.policy.eval()
    expected = velocity(models.policy, embeds, latents, torch.bfloat16)
    models.policy.train()
    assert_on(device, expected)
    assert torch.equal(velocity(fresh.eval(), embeds, latents, torch.bfloat16), expected)


def test_export_loads_back_on_the_device_with_the_same_velocity(lora_run, tiny_root, device, tmp_path):
    """Both export formats of the trained adapter, loaded on the device: the peft folder gives back the adapter's
    tensors exactly; the merged fp32 transformer (W + alpha/r B A, merged on the CPU) the velocity of the fp32 base
    with the adapter unmerged, to fp32 rounding (max |diff| 1.4e-6 measured on the
    CPU, 2026-11-23)."""
    from diffusers import HunyuanVideo15Transformer3DModel

    models, folder, embeds, latents, _ = lora_run
    adapter = export_checkpoint(folder, tiny_root, tmp_path / "adapter", export_format="lora")
    assert all(torch.equal(tensor.to(device), models.lora.policy_state()[name])
               for name, tensor in read_trained_weights(adapter).state.items())

    merged_folder = export_checkpoint(folder, tiny_root, tmp_path / "merged", export_format="transformer")
    merged = HunyuanVideo15Transformer3DModel.from_pretrained(merged_folder, torch_dtype=torch.float32).to(device)
    install_joint_attention(merged)
    unmerged = load_transformer(tiny_root, dtype=torch.float32, device=device)
    LoraTraining.create(unmerged, r=4, alpha=8, dropout=0.0, target_modules=None, pretrained_path=str(folder),
                        with_anchor=False, seed=0, dtype=torch.float32)
    assert_on(device, *merged.parameters(), *unmerged.parameters())
    ours, expected = velocity(merged, embeds, latents, None), velocity(unmerged.eval(), embeds, latents, None)
    assert_on(device, ours)
    assert float((expected - velocity(load_transformer(tiny_root, dtype=torch.float32, device=device), embeds,
                                      latents, None)).abs().max()) > 1e-4  # the adapter changes the velocity
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
