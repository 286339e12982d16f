"""A pretrained tiny HunyuanVideo-1.5 of the toy world, trained from scratch on the CPU.

:func:`write_toy_checkpoint` writes a checkpoint of the real classes in the real layout (``sage_grpo.models.layout``),
then trains two of its components on toy videos (:mod:`sage_grpo.toy.world`):

1. the VAE (``AutoencoderKLHunyuanVideo15``) as an autoencoder of toy videos: L1 + MSE reconstruction (disk pixels
   weighted 10x) of the decoded posterior sample plus a small KL to N(0, I); its ``scaling_factor`` is then set to
   1/std of the latent means, so scaled latents have unit variance, as the flow-matching schedule assumes;
2. the transformer (``HunyuanVideo15Transformer3DModel``) by rectified flow matching in that latent space with the
   schedule and conditioning the GRPO loop uses: x_σ = (1 − σ)·z + σ·ε with σ drawn through the same time shift as
   the sampling schedule, target velocity ε − z, the model called through
   :func:`sage_grpo.pipeline.velocity.cfg_velocity` at timestep 1000·σ, prompts encoded by the (random, frozen) text
   encoders of the checkpoint, and 10% of prompts replaced by the empty negative prompt so classifier-free guidance
   works.

The text encoders stay random and frozen; their outputs still tell the prompts apart, and the tokenizer is trained
with the toy vocabulary so that every word is a token of its own. The transformer's byT5 glyph projection
(``context_embedder_2``, 90% of its parameters) is set to zeros: toy prompts never quote text, so its input is all
padding and its output is masked out of attention (the model computes the same with any values there), and zeros
need not be stored (:mod:`sage_grpo.toy.committed`). Everything is seeded: a seed gives the same checkpoint on a given
machine and torch build, not across machines (the demo therefore reads the committed one, ``assets/toy_ckpt``).

The writer finishes with :func:`evaluate_checkpoint`: ODE samples of the pretrained model against true toy videos,
their VAE reconstructions and the same architecture with random weights, scored by manifold error and by how often
the prompt's named factors are followed. The report is saved as ``toy_report.json`` in the checkpoint root.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from sage_grpo.models.layout import DEFAULT_TRANSFORMER_VERSION, SCHEDULER, TEXT_ENCODER, VAE, transformer_layout
from sage_grpo.models.loading import load_components
from sage_grpo.models.text_encoding import PromptEncoder, TextEncoderSettings
from sage_grpo.models.tiny import write_tiny_hunyuan, write_variant_configs
from sage_grpo.pipeline.sampler import Sampler
from sage_grpo.pipeline.velocity import cfg_velocity
from sage_grpo.toy import world
from sage_grpo.toy.manifold import fit_manifold, prompt_adherence

# Wider than the tiny test transformer (2 heads x 8), still milliseconds per call: 4 heads x 16, 2 dual-stream blocks.
TOY_TRANSFORMER_CONFIG: Dict = dict(
    in_channels=9, out_channels=4, num_attention_heads=4, attention_head_dim=16, num_layers=2, num_refiner_layers=1,
    mlp_ratio=4.0, patch_size=1, patch_size_t=1, text_embed_dim=16, text_embed_2_dim=32, image_embed_dim=12,
    rope_axes_dim=(4, 6, 6), target_size=64, task_type="t2v",
)
# The real temporal compression (9 frames -> 3 latent frames) and spatial 4 (16 x 16 -> 4 x 4): 48 latent tokens.
TOY_VAE_CONFIG: Dict = dict(
    latent_channels=4, block_out_channels=(8, 16, 16), layers_per_block=1, spatial_compression_ratio=4,
    temporal_compression_ratio=4, downsample_match_channel=False, upsample_match_channel=False,
)
# Toy prompts have no quoted text, so the byT5 glyph stream is all padding: 2 slots keep its 2048-wide projection cheap.
TOY_TEXT = TextEncoderSettings(max_length=16, max_length_2=2)
TOY_IMAGE_TOKENS = 4
TOY_FLOW_SHIFT = 3.0
# The tiny Qwen text model is initialised with std 0.02 embeddings, so its hidden states are ~0.02 and the words that
# tell toy prompts apart barely register; scaled to std ~1 they do (the encoder stays random and frozen).
TEXT_EMBEDDING_SCALE = 50.0
REPORT_FILE = "toy_report.json"
COMPLETE_MARKER = ".complete"
DEAD_PREFIX = "context_embedder_2."  # the byT5 glyph projection: all-padding input, masked output (zeroed)


@dataclass
class PretrainSettings:
    """Budget of the two training phases (the defaults take a few minutes on 2 cores)."""

    seed: int = 0
    vae_steps: int = 900
    vae_batch: int = 8
    vae_lr: float = 3e-3
    vae_kl_weight: float = 1e-4
    flow_steps: int = 1000
    flow_batch: int = 64
    flow_lr: float = 3e-3
    flow_dataset: int = 4096  # pre-encoded true videos the transformer trains on
    uncond_fraction: float = 0.1
    eval_samples: int = 32
    eval_steps: int = 8
    guidance_scale: float = 1.0


def toy_recipe(settings) -> Dict:
    """Everything that decides what :func:`write_toy_checkpoint` trains, as JSON data: ``settings`` (a
    :class:`PretrainSettings` or its dict) and the module's fixed sizes and constants."""
    settings = asdict(settings) if isinstance(settings, PretrainSettings) else dict(settings)
    recipe = {"settings": settings, "transformer_config": TOY_TRANSFORMER_CONFIG, "vae_config": TOY_VAE_CONFIG,
              "text": asdict(TOY_TEXT), "image_tokens": TOY_IMAGE_TOKENS, "flow_shift": TOY_FLOW_SHIFT,
              "text_embedding_scale": TEXT_EMBEDDING_SCALE, "zeroed": DEAD_PREFIX}
    return json.loads(json.dumps(recipe))  # tuples as lists, as read back from a file


def zero_dead_projection(transformer) -> None:
    """Set the byT5 glyph projection to zeros (toy prompts never reach it; see the module docstring)."""
    with torch.no_grad():
        for name, param in transformer.named_parameters():
            if name.startswith(DEAD_PREFIX):
                param.zero_()


def toy_corpus() -> str:
    """Every word of the toy prompts, so the tiny BPE tokenizer gives each its own token."""
    return " " + " ".join(world.training_prompts())


def _eta(done: int, total: int, started: float) -> str:
    """``, eta 1m05s`` for the steps left of a training phase at its pace so far ("" once it is done)."""
    from sage_grpo.tracking.run_dir import eta_text

    return f", {eta_text(done, total, time.perf_counter() - started)}" if done < total else ""


def _log(message: str, log: Optional[Callable[[str], None]]) -> None:
    if log is not None:
        log(message)


def _cosine_lr(optimizer: torch.optim.Optimizer, base: float, step: int, total: int, warmup: int = 50) -> None:
    lr = base * min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / total))
    for group in optimizer.param_groups:
        group["lr"] = lr


def _random_prompts(count: int, generator: torch.Generator) -> List[str]:
    prompts = world.training_prompts()
    return [prompts[i] for i in torch.randint(len(prompts), (count,), generator=generator).tolist()]


def allow_batched_vae_attention(vae) -> None:
    """Let the VAE's mid-block attention take batches larger than one.

    diffusers 0.42's ``HunyuanVideo15AttnBlock`` expands its causal mask to (B, S, S), which
    scaled_dot_product_attention broadcasts against the (B, 1, S, C) queries as (B, B, S, S) and fails for B > 1
    (the pipelines decode one video at a time). An (S, S) mask broadcasts correctly and is the same mask; it is set
    on these instances only.
    """
    from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import HunyuanVideo15AttnBlock

    def unbatched_mask(n_frame, n_hw, dtype, device, batch_size=None):
        return HunyuanVideo15AttnBlock.prepare_causal_attention_mask(n_frame, n_hw, dtype, device)

    for module in vae.modules():
        if isinstance(module, HunyuanVideo15AttnBlock):
            module.prepare_causal_attention_mask = unbatched_mask


def train_vae(vae, settings: PretrainSettings, generator: torch.Generator, log=None) -> Dict[str, float]:
    """Autoencoder training of ``vae`` (fp32, in place) on fresh toy videos; returns the final losses."""
    allow_batched_vae_attention(vae)
    vae.train().requires_grad_(True)
    optimizer = torch.optim.AdamW(vae.parameters(), lr=settings.vae_lr, weight_decay=0.0)
    background = torch.tensor(world.BACKGROUND).view(1, 3, 1, 1, 1) * 2 - 1
    started = time.perf_counter()
    for step in range(settings.vae_steps):
        videos, _ = world.sample_videos(_random_prompts(settings.vae_batch, generator), generator)
        target = videos * 2 - 1  # the VAE works on [-1, 1]
        posterior = vae.encode(target).latent_dist
        latents = posterior.mean + posterior.std * torch.randn(posterior.mean.shape, generator=generator)
        recon = vae.decode(latents).sample
        # the disk covers ~10% of the pixels: weight them 10x so the background does not dominate the loss
        weight = 1 + 9 * ((target - background).abs().sum(dim=1, keepdim=True) > 0.05).float()
        error = recon - target
        rec_loss = (error.abs() * weight).mean() + (error.pow(2) * weight).mean()
        kl = posterior.kl().mean() / posterior.mean[0].numel()
        loss = rec_loss + settings.vae_kl_weight * kl
        _cosine_lr(optimizer, settings.vae_lr, step, settings.vae_steps)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        optimizer.step()
        if step % 100 == 0 or step == settings.vae_steps - 1:
            _log(f"vae step {step + 1}/{settings.vae_steps}: reconstruction {rec_loss.item():.4f}, kl "
                 f"{kl.item():.3f}{_eta(step + 1, settings.vae_steps, started)}", log)
    vae.eval().requires_grad_(False)
    return {"vae_reconstruction_loss": rec_loss.item(), "vae_kl": kl.item()}


@torch.no_grad()
def encode_dataset(vae, settings: PretrainSettings, generator: torch.Generator):
    """(N, C, T, h, w) posterior means of fresh toy videos (unscaled) and their prompts."""
    allow_batched_vae_attention(vae)
    prompts, means = [], []
    for start in range(0, settings.flow_dataset, 64):
        batch = _random_prompts(min(64, settings.flow_dataset - start), generator)
        videos, _ = world.sample_videos(batch, generator)
        means.append(vae.encode(videos * 2 - 1).latent_dist.mean)
        prompts += batch
    return torch.cat(means), prompts


def train_flow(transformer, encoder: PromptEncoder, latents: torch.Tensor, prompts: Sequence[str],
               settings: PretrainSettings, generator: torch.Generator, log=None) -> Dict[str, float]:
    """Rectified flow matching of ``transformer`` (fp32, in place) on scaled latents (N, C, T, h, w)."""
    transformer.train().requires_grad_(True)
    # Toy prompts never quote text, so the byT5 stream is all padding; its 2048-wide projection (90% of the
    # parameters) keeps its random weights and costs no gradients.
    transformer.context_embedder_2.requires_grad_(False)
    trainable = [p for p in transformer.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=settings.flow_lr, weight_decay=0.0)
    encoder.precompute(sorted(set(prompts)))
    ema_loss = None
    started = time.perf_counter()
    for step in range(settings.flow_steps):
        rows = torch.randint(latents.shape[0], (settings.flow_batch,), generator=generator)
        clean = latents[rows]
        batch_prompts = [prompts[i] if float(torch.rand((), generator=generator)) >= settings.uncond_fraction else ""
                         for i in rows.tolist()]
        embeds = encoder.encode(batch_prompts)
        u = torch.rand(settings.flow_batch, generator=generator)
        sigma = TOY_FLOW_SHIFT * u / (1 + (TOY_FLOW_SHIFT - 1) * u)  # the sampling schedule's time shift
        noise = torch.randn(clean.shape, generator=generator)
        s = sigma.view(-1, 1, 1, 1, 1)
        noisy = (1 - s) * clean + s * noise
        velocity = cfg_velocity(transformer, noisy, sigma * 1000, embeds, 1.0, num_image_tokens=TOY_IMAGE_TOKENS)
        loss = (velocity - (noise - clean)).pow(2).mean()
        _cosine_lr(optimizer, settings.flow_lr, step, settings.flow_steps)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        value = loss.item()
        ema_loss = value if ema_loss is None else 0.98 * ema_loss + 0.02 * value
        if step % 250 == 0 or step == settings.flow_steps - 1:
            _log(f"flow step {step + 1}/{settings.flow_steps}: loss {ema_loss:.4f}"
                 f"{_eta(step + 1, settings.flow_steps, started)}", log)
    transformer.eval().requires_grad_(False)
    return {"flow_matching_loss": ema_loss}


def _summary(videos: torch.Tensor, prompts: Sequence[str]) -> Dict[str, float]:
    fit = fit_manifold(videos)
    adherence = prompt_adherence(prompts, fit)
    return {"manifold_error_mean": float(fit.error.mean()), "manifold_error_median": float(fit.error.median()),
            "prompt_adherence": float(adherence[~adherence.isnan()].mean())}


@torch.no_grad()
def sample_toy(transformer, vae, encoder: PromptEncoder, prompts: Sequence[str], seeds: Sequence[int], *,
               num_steps: int, guidance_scale: float) -> torch.Tensor:
    """ODE samples (B, 3, F, H, W) in [0, 1] with the GRPO loop's sampler (deterministic steps)."""
    sampler = Sampler.euler(num_steps, TOY_FLOW_SHIFT, guidance_scale, micro_batch_size=len(seeds),
                            num_image_tokens=TOY_IMAGE_TOKENS)
    return sampler.rollout(transformer, vae, encoder.encode(list(prompts)), list(seeds), num_frames=world.NUM_FRAMES,
                           height=world.HEIGHT, width=world.WIDTH, deterministic=True).videos


@torch.no_grad()
def evaluate_checkpoint(transformer, vae, encoder: PromptEncoder, settings: PretrainSettings,
                        random_transformer=None) -> Dict[str, Dict[str, float]]:
    """Manifold error and prompt adherence of true videos, VAE reconstructions, the model's ODE samples and (given)
    a random-weight transformer's samples, on the same prompts."""
    generator = torch.Generator().manual_seed(settings.seed + 7)
    prompts = _random_prompts(settings.eval_samples, generator)
    true_videos, _ = world.sample_videos(prompts, generator)
    recon = (vae.decode(vae.encode(true_videos * 2 - 1).latent_dist.mean).sample / 2 + 0.5).clamp(0, 1)
    seeds = list(range(1000, 1000 + len(prompts)))
    report = {"true_videos": _summary(true_videos, prompts), "vae_reconstructions": _summary(recon, prompts)}
    sample = lambda model: sample_toy(model, vae, encoder, prompts, seeds, num_steps=settings.eval_steps,  # noqa: E731
                                      guidance_scale=settings.guidance_scale)
    report["pretrained_samples"] = _summary(sample(transformer), prompts)
    if random_transformer is not None:
        report["random_model_samples"] = _summary(sample(random_transformer), prompts)
    return report


def cpu_name() -> str:
    """The CPU model (from /proc/cpuinfo where there is one), else what ``platform`` says."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> Dict:
    """The machine a checkpoint is trained on (recorded: the result depends on it)."""
    import platform

    return {"cpu": cpu_name(), "platform": platform.platform(), "threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def write_toy_checkpoint(root, settings: PretrainSettings = PretrainSettings(), log=None) -> Dict:
    """Write, train and evaluate the toy checkpoint under ``root``; returns the report (also in toy_report.json).

    The ``.complete`` marker is written last: a folder without it is an interrupted run (callers build into a
    temporary folder and rename it into place, see ``scripts/make_toy_checkpoint.py``).
    """
    root = Path(root)
    start = time.perf_counter()
    torch.manual_seed(settings.seed)
    generator = torch.Generator().manual_seed(settings.seed)
    write_tiny_hunyuan(root, seed=settings.seed, transformer_config=TOY_TRANSFORMER_CONFIG,
                       vae_config=TOY_VAE_CONFIG, tokenizer_corpus=toy_corpus(), dtype=torch.float32)
    components = load_components(root, dtype=torch.float32)
    with torch.no_grad():
        components.text_encoder.embed_tokens.weight.mul_(TEXT_EMBEDDING_SCALE)
    components.text_encoder.save_pretrained(root / TEXT_ENCODER.subdir)
    FlowMatchEulerDiscreteScheduler(shift=TOY_FLOW_SHIFT).save_pretrained(root / SCHEDULER.subdir)
    # the toy model is sampled without guidance at its own shift: its variant configs say so (no override warnings)
    write_variant_configs(root, DEFAULT_TRANSFORMER_VERSION, 1.0, TOY_FLOW_SHIFT)
    vae, transformer = components.vae, components.transformer
    zero_dead_projection(transformer)
    random_transformer = load_components(root, dtype=torch.float32, load_vae=False,
                                         load_text_encoders=False).transformer

    timings, losses = {}, {}
    phase = time.perf_counter()
    losses.update(train_vae(vae, settings, generator, log))
    latents, prompts = encode_dataset(vae, settings, generator)
    scaling = 1.0 / float(latents.std())
    vae.register_to_config(scaling_factor=scaling)
    vae.save_pretrained(root / VAE.subdir)
    timings["vae_seconds"] = time.perf_counter() - phase
    _log(f"vae trained in {timings['vae_seconds']:.0f} s; latent scaling factor {scaling:.4f}", log)

    phase = time.perf_counter()
    encoder = PromptEncoder.from_components(components, TOY_TEXT, cache=True)
    losses.update(train_flow(transformer, encoder, latents * scaling, prompts, settings, generator, log))
    transformer.save_pretrained(root / transformer_layout(DEFAULT_TRANSFORMER_VERSION).subdir)
    timings["flow_seconds"] = time.perf_counter() - phase
    _log(f"transformer trained in {timings['flow_seconds']:.0f} s", log)

    phase = time.perf_counter()
    evaluation = evaluate_checkpoint(transformer, vae, encoder, settings, random_transformer)
    timings["eval_seconds"] = time.perf_counter() - phase
    timings["total_seconds"] = time.perf_counter() - start
    report = {"settings": asdict(settings), "losses": losses, "evaluation": evaluation, "timings": timings,
              "flow_shift": TOY_FLOW_SHIFT, "torch": torch.__version__, "machine": machine()}
    (root / REPORT_FILE).write_text(json.dumps(report, indent=2))
    (root / COMPLETE_MARKER).write_text("ok\n")
    return report
