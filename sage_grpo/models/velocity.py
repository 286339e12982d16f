"""The classifier-free-guided velocity v_θ(x_t, t): the one transformer call shared by rollout and replay, the drift
proxy, generation and the memory planner's simulated step. The timesteps of a schedule's steps that it is called at
are :mod:`sage_grpo.pipeline.velocity`'s.

Text-to-video input, exactly as diffusers' ``HunyuanVideo15Pipeline`` builds it::

    hidden_states = cat([x_t, zeros (C ch: no image condition), zeros (1 ch: condition mask)], dim=1)   # 2C+1 ch
    image_embeds  = zeros(B, num_image_tokens, image_embed_dim)   # all-zero => the transformer masks them out (t2v)
    timestep      = 1000·σ_k per sample, fp32

Image-to-video (``embeds.image`` set, as diffusers' ``HunyuanVideo15ImageToVideoPipeline`` builds it; see
:mod:`sage_grpo.models.image_condition`)::

    hidden_states = cat([x_t, [z_ref, 0, ..., 0] (C ch), [1, 0, ..., 0] (1 ch: the i2v task mask)], dim=1)
    image_embeds  = the SigLIP states of the reference image, the same in both CFG branches (as in the reference)

Mean-flow transformers (``use_meanflow`` in the transformer's config: the step-distilled ``480p_i2v_step_distilled``)
take a second timestep ``timestep_r``, the end of the interval whose *average* velocity they predict; diffusers'
``HunyuanVideo15ImageToVideoPipeline`` passes the next point of the schedule, 1000·σ_{k+1} (0 at the last step), at
every step k. Rollouts, replay and generation pass the same (``pipeline.velocity.next_step_timesteps``), so a
replayed transition sees the velocity its rollout used; an SDE step treats that average velocity over [σ_{k+1}, σ_k]
as its velocity (docs/differences.md). A mean-flow call without ``timesteps_r`` is an error, never a silent
single-timestep call; other transformers ignore it.

Text layout. The valid tokens of every row (counted once by the prompt encoder) and the image condition's presence
give the call's :class:`~sage_grpo.models.transformer_forward.TextLayout`, passed in ``attention_kwargs``, so the
transformer forward reads nothing back from the device.

CFG (docs/reference.md#the-policy-loss, docs/reference.md#the-rollout-pipeline): ``v = v_u + s·(v_c − v_u)`` with s =
``guidance_scale``, computed in fp32, applied only when s > 1 as in the reference's ``denoise_step``; with s <= 1 only
the positive branch runs and v = v_c (diffusers' guider instead switches guidance off only at s = 1). Both branches run
in ONE transformer call on the doubled batch ``[negative; positive]`` (the reference's layout; diffusers makes two
calls). Gradients flow through both branches when grad is enabled.

Precision. The latent and the text embeddings are cast to the transformer's parameter dtype, as diffusers does. The
timestep is not: it stays fp32 for every model and precision, as in the reference (its scheduler's fp32 timesteps go
to the transformer under autocast). Rounded to bf16 it would become e.g. 988 instead of 989.58, so a bf16 reference
model would be evaluated at other times than an fp32 policy, and μ_θ − μ_ref would not vanish right after an anchor
refresh. diffusers' time embedding (0.42.1) casts its sinusoid to the *timestep's* dtype before its linear layers,
which fails against bf16 weights without autocast; so a transformer whose weights are not fp32 always runs under
autocast, at ``autocast_dtype`` or else at its own dtype. An fp32 transformer runs under ``autocast_dtype``
when one is given (fp32 master weights, bf16 compute) and plainly otherwise.
"""

import contextlib
from typing import Optional

import torch
from torch import Tensor

from sage_grpo.dtypes import compute_dtype
from sage_grpo.models.image_condition import ImageCondition
from sage_grpo.models.text_encoding import PromptEmbeds
from sage_grpo.models.transformer_forward import TEXT_LAYOUT_KEY, TextLayout

T2V_IMAGE_TOKENS = 729  # SigLIP tokens the pipeline feeds (as zeros) for text-to-video


def uses_meanflow(transformer) -> bool:
    """Whether ``transformer`` predicts average velocities and takes a second timestep (``use_meanflow``)."""
    return bool(getattr(transformer.config, "use_meanflow", False))


def _autocast(device: torch.device, dtype: Optional[torch.dtype]):
    return torch.autocast(device_type=device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def _compute_dtype(weights_dtype: torch.dtype, autocast_dtype: Optional[torch.dtype]) -> Optional[torch.dtype]:
    """The autocast dtype of a transformer call: ``autocast_dtype``, else the weights' dtype when it is not fp32
    (the fp32 timestep meets low-precision weights only under autocast), else None (no autocast)."""
    if autocast_dtype is not None:
        return autocast_dtype
    return weights_dtype if weights_dtype != torch.float32 else None


def t2v_model_input(latents: Tensor, dtype: torch.dtype) -> Tensor:
    """(B, 2C+1, T, h, w): the latent, a zero image condition and a zero condition mask."""
    x = latents.to(dtype)
    batch, _, frames, height, width = x.shape
    mask = torch.zeros(batch, 1, frames, height, width, dtype=dtype, device=x.device)
    return torch.cat([x, torch.zeros_like(x), mask], dim=1)


def model_input(latents: Tensor, image: Optional[ImageCondition], dtype: torch.dtype) -> Tensor:
    """(B, 2C+1, T, h, w): text-to-video without ``image``, else the latent, the reference frame's condition and the
    i2v task mask."""
    if image is None:
        return t2v_model_input(latents, dtype)
    if tuple(image.latents.shape[-2:]) != tuple(latents.shape[-2:]) or len(image) != latents.shape[0]:
        raise ValueError(f"image condition {tuple(image.latents.shape)} does not fit latents {tuple(latents.shape)}: "
                         "encode the reference image at the video's size")
    condition = image.condition_channels(latents.shape[2], dtype).to(latents.device)
    return torch.cat([latents.to(dtype), condition], dim=1)


def image_embeds_for(embeds: PromptEmbeds, batch: int, num_image_tokens: int, embed_dim: int, dtype: torch.dtype,
                     device: torch.device) -> Tensor:
    """(batch, N_img, D_img) ``image_embeds`` of one call: the SigLIP states of ``embeds.image`` (repeated over the
    CFG branches), or zeros (text-to-video: the transformer masks them out)."""
    if embeds.image is None:
        return torch.zeros(batch, num_image_tokens, embed_dim, dtype=dtype, device=device)
    states = embeds.image.embeds.to(device=device, dtype=dtype)
    return states.repeat(batch // states.shape[0], 1, 1)


def text_layout(embeds: PromptEmbeds, use_cfg: bool, num_image_tokens: int) -> Optional[TextLayout]:
    """The host-side text layout of one call on ``embeds`` (rows ``[negative; positive]`` with CFG, as the call
    stacks them), or None when the embeddings' valid tokens were not counted (the forward counts them then)."""
    if embeds.valid_tokens is None:
        return None
    positive = [pos for pos, _ in embeds.valid_tokens]
    counts = [neg for _, neg in embeds.valid_tokens] + positive if use_cfg else positive
    image_slots = num_image_tokens if embeds.image is not None else 0  # i2v: every image token is a valid slot
    return TextLayout(embeds.image is not None, tuple(image_slots + n for n in counts))


def cfg_velocity(transformer, latents: Tensor, timesteps: Tensor, embeds: PromptEmbeds, guidance_scale: float = 6.0,
                 *, autocast_dtype: Optional[torch.dtype] = None, num_image_tokens: int = T2V_IMAGE_TOKENS,
                 timesteps_r: Optional[Tensor] = None) -> Tensor:
    """Guided velocity, fp32 (B, C, T, h, w), for latents (B, C, T, h, w) at (B,) timesteps; ``timesteps_r``: the
    (B,) second timesteps a mean-flow transformer needs (module docstring), ignored by the others."""
    dtype = compute_dtype(transformer)  # the gathered weights' dtype under FSDP mixed precision
    hidden = model_input(latents, embeds.image, dtype)
    timestep = timesteps.to(device=latents.device, dtype=torch.float32)  # never rounded to the weights' dtype
    extra = {}
    if uses_meanflow(transformer):
        if timesteps_r is None:
            raise ValueError("a mean-flow transformer (use_meanflow, e.g. 480p_i2v_step_distilled) was called without "
                             "its second timestep timesteps_r; pass next_step_timesteps(sigmas, k, batch)")
        extra["timestep_r"] = timesteps_r.to(device=latents.device, dtype=torch.float32)
    streams = embeds.positive()
    use_cfg = guidance_scale > 1.0
    if use_cfg:
        hidden = torch.cat([hidden, hidden])
        timestep = torch.cat([timestep, timestep])
        extra = {key: torch.cat([value, value]) for key, value in extra.items()}
        streams = tuple(torch.cat([neg, pos]) for neg, pos in zip(embeds.negative(), embeds.positive()))
    text, text_mask, glyph, glyph_mask = streams
    image_embeds = image_embeds_for(embeds, hidden.shape[0], num_image_tokens, transformer.config.image_embed_dim,
                                    dtype, latents.device)
    layout = text_layout(embeds, use_cfg, image_embeds.shape[1])
    with _autocast(latents.device, _compute_dtype(dtype, autocast_dtype)):
        prediction = transformer(
            hidden_states=hidden, timestep=timestep,
            encoder_hidden_states=text.to(dtype), encoder_attention_mask=text_mask,
            encoder_hidden_states_2=glyph.to(dtype), encoder_attention_mask_2=glyph_mask,
            image_embeds=image_embeds, return_dict=False,
            attention_kwargs=None if layout is None else {TEXT_LAYOUT_KEY: layout}, **extra,
        )[0]
    prediction = prediction.float()
    if not use_cfg:
        return prediction
    v_uncond, v_cond = prediction.chunk(2)
    return v_uncond + guidance_scale * (v_cond - v_uncond)
