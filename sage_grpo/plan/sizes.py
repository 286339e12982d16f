"""Sizes the memory plan (:mod:`sage_grpo.plan.memory`) counts: the parameters of every model a run loads, and the
elements of the activations and the VAE decode, as formulas of the video, the text slots and the layout.

**Model sizes** are exact: each model is instantiated on the ``meta`` device (no memory) from the configs under
``--pretrained_model_root`` when it holds them, else from the known released configs (HunyuanVideo-1.5's
transformer = diffusers' defaults, 54 blocks of hidden 2048, 8.33B; its VAE = diffusers' defaults, 1.26B; the
Qwen2.5-VL-7B text model, 7.07B; the byT5-small glyph encoder, 0.22B; VideoAlign's Qwen2-VL-2B, 2.21B).

**Activations** are counted in elements per sample on one SP rank (the plan multiplies by the bytes per element and
the samples per call), save by save: :func:`block_saved_elements` for one dual-stream block,
:func:`checkpointed_block_elements` for one under activation checkpointing, :func:`saved_outside_blocks` for the
embedders and output layers, :func:`no_grad_forward_elements` for a no-grad forward; :func:`vae_decode_bytes` is the
peak of a VAE decode. They take the text slots (:class:`TextTokens`); :func:`forward_saved_elements` and
:func:`outside_saved_elements` read them, and the adapters, off a run's configuration. The symbols are those of
:mod:`sage_grpo.plan.components`' docstring.
"""

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch

from sage_grpo.config.train import LoRAConfig, ModelConfig
from sage_grpo.models.config_fields import read_model_config
from sage_grpo.plan.options import PlanOptions

# diffusers' HunyuanVideo-1.5 VAE tiles: 256-pixel squares overlapping by a quarter.
VAE_TILE_PIXELS, VAE_TILE_OVERLAP = 256, 0.25
# Tensors of (C_top, F, H, W) alive at once at the decoder's full-resolution stage (a resnet's input kept for the
# residual, its norm's output and activation, the causally padded copy a conv reads, the conv's output, ...): measured
# 6.0 with a live-storage tracker on the released decoder config (fp32, 5x32x32 and 9x32x64) and on the tiny VAE.
VAE_DECODE_LIVE_TENSORS = 6

# Released configs of the models whose folders are not under --pretrained_model_root (the transformer and the VAE
# are diffusers' defaults, which are the released 480p/720p configs).
REAL_TEXT_ENCODER_CONFIG = dict(  # Qwen2.5-VL-7B-Instruct's text model
    vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
    num_key_value_heads=4)
REAL_BYT5_CONFIG = dict(  # Glyph-SDXL-v2's byT5-small encoder (1510 tokens: bytes plus glyph colour/font tokens)
    vocab_size=1510, d_model=1472, d_ff=3584, num_layers=12, num_heads=6, d_kv=64, feed_forward_proj="gated-gelu",
    is_encoder_decoder=False, use_cache=False)
REAL_REWARD_CONFIG = dict(  # VideoAlign's base, Qwen2-VL-2B-Instruct
    text_config=dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                     num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True),
    vision_config=dict(depth=32, embed_dim=1280, hidden_size=1536, num_heads=16, mlp_ratio=4, patch_size=14,
                       spatial_merge_size=2, temporal_patch_size=2),
    tie_word_embeddings=True)
BYT5_PROJECTION_WIDTH = 2048  # HunyuanVideo15ByT5TextProjection's hidden width (fixed in diffusers)


# ====================================================================== model sizes

def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@dataclass(frozen=True)
class TransformerSizes:
    """Parameter counts and widths of a HunyuanVideo-1.5 transformer (counted on the meta device)."""

    config: Dict
    num_params: int  # P
    num_matrix_params: int  # P_mat: the trained 2-D weights (Muon's)
    block_params: int  # P_blk
    refiner_params: int  # the text token refiner (its own FSDP unit)
    lora_width: int  # sum of (in + out) over the Linear layers of the blocks: LoRA rank r trains r x this
    # The last block's text-stream output layers (attn.to_add_out, ff_context): the model discards that stream's
    # output, so they never get a gradient nor optimizer state. P_g = P - unused_params are the trained ones.
    unused_params: int
    unused_lora_width: int
    largest_matrix: Tuple[int, int] = (0, 0)  # (rows, cols) of the largest trained 2-D weight (Muon's largest step)
    largest_linear_side: int = 0  # max(in, out) over the blocks' Linear layers: LoRA's largest matrix is r x this

    @property
    def root_params(self) -> int:  # P_root: what fully_shard(root) keeps
        return self.num_params - self.config["num_layers"] * self.block_params - self.refiner_params

    @property
    def hidden(self) -> int:  # D
        return self.config["num_attention_heads"] * self.config["attention_head_dim"]

    @property
    def mlp_hidden(self) -> int:  # F
        return int(self.hidden * self.config["mlp_ratio"])


@dataclass(frozen=True)
class ModelSizes:
    transformer: TransformerSizes
    vae_config: Dict
    vae_params: int
    text_encoder_params: int
    text_encoder_shape: Tuple[int, int, int]  # (layers, hidden, intermediate) of the MLLM
    byt5_params: int
    reward_params: int
    reward_shape: Tuple[int, int]  # (hidden, intermediate) of the reward's language model
    sources: Dict[str, str]  # component -> where its config came from


def _read_json(path: Path, component: str) -> Optional[Dict]:  # checked before anything is built from it
    return read_model_config(path, component) if path.is_file() else None


def _on_meta(build):
    with torch.device("meta"):
        return build()


def _in(param: torch.nn.Parameter, modules) -> bool:
    return any(param is q for m in modules for q in m.parameters())


def transformer_sizes(config: Dict) -> TransformerSizes:
    from diffusers import HunyuanVideo15Transformer3DModel

    model = _on_meta(lambda: HunyuanVideo15Transformer3DModel.from_config(config))
    block, last = model.transformer_blocks[0], model.transformer_blocks[-1]
    unused = (last.attn.to_add_out, last.ff_context)

    def lora_width(modules) -> int:
        return sum(m.in_features + m.out_features for part in modules for m in part.modules()
                   if isinstance(m, torch.nn.Linear))

    return TransformerSizes(
        config=dict(model.config), num_params=_count(model),
        num_matrix_params=sum(p.numel() for p in model.parameters() if p.ndim == 2 and not _in(p, unused)),
        block_params=_count(block), refiner_params=_count(model.context_embedder),
        lora_width=lora_width([model.transformer_blocks]), unused_params=sum(_count(m) for m in unused),
        unused_lora_width=lora_width(unused),
        largest_matrix=tuple(max((p.shape for p in model.parameters() if p.ndim == 2 and not _in(p, unused)),
                                 key=lambda shape: shape[0] * shape[1])),
        largest_linear_side=max(max(m.in_features, m.out_features) for m in model.transformer_blocks.modules()
                                if isinstance(m, torch.nn.Linear)))


@functools.lru_cache(maxsize=8)
def read_model_sizes(root: str, transformer_version: str, with_reward: bool) -> ModelSizes:
    """Sizes of every model a run loads: from the configs under ``root`` where present, else the released ones."""
    from diffusers import AutoencoderKLHunyuanVideo15
    from transformers import (Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel, Qwen2VLConfig,
                              Qwen2VLForConditionalGeneration, T5Config, T5EncoderModel)

    from sage_grpo.models import layout

    root_path, sources = Path(root), {}

    def config_of(name: str, subdir: str, default: Dict) -> Dict:
        found = _read_json(root_path / subdir / "config.json", name)
        sources[name] = f"{root_path / subdir}/config.json" if found is not None else "released config"
        return found if found is not None else default

    # {}: diffusers' defaults, which are the released configs
    transformer = transformer_sizes(config_of("transformer", layout.transformer_layout(transformer_version).subdir, {}))
    vae_config = config_of("vae", layout.VAE.subdir, {})
    vae = _on_meta(lambda: AutoencoderKLHunyuanVideo15.from_config(vae_config))
    text_config = Qwen2_5_VLTextConfig(**_hf_fields(config_of("text_encoder", layout.TEXT_ENCODER.subdir,
                                                              REAL_TEXT_ENCODER_CONFIG)))
    text_encoder = _on_meta(lambda: Qwen2_5_VLTextModel(text_config))
    byt5_config = T5Config(**_hf_fields(config_of("text_encoder_2", layout.TEXT_ENCODER_2.subdir, REAL_BYT5_CONFIG)))
    byt5 = _on_meta(lambda: T5EncoderModel(byt5_config))
    reward_params, reward_shape = 0, (0, 0)
    if with_reward:
        reward_config = Qwen2VLConfig(**_hf_fields(_reward_base_config(root_path, sources)))
        reward_params = _count(_on_meta(lambda: Qwen2VLForConditionalGeneration(reward_config)))
        reward_shape = (reward_config.text_config.hidden_size, reward_config.text_config.intermediate_size)
    return ModelSizes(
        transformer=transformer, vae_config=dict(vae.config), vae_params=_count(vae),
        text_encoder_params=_count(text_encoder),
        text_encoder_shape=(text_config.num_hidden_layers, text_config.hidden_size, text_config.intermediate_size),
        byt5_params=_count(byt5), reward_params=reward_params, reward_shape=reward_shape, sources=sources)


def _hf_fields(config: Dict) -> Dict:
    """A transformers config.json without the bookkeeping keys its constructor does not take."""
    return {k: v for k, v in config.items() if k not in ("architectures", "transformers_version", "model_type",
                                                         "_name_or_path", "torch_dtype", "dtype")}


def _reward_base_config(root: Path, sources: Dict[str, str]) -> Dict:
    """VideoAlign's base-model config when the checkpoint's base model is found locally, else Qwen2-VL-2B's."""
    try:
        from sage_grpo.rewards.videoalign_checkpoint import resolve_checkpoint

        base = resolve_checkpoint(root).base_dir / "config.json"
    except FileNotFoundError:  # none here: plan for the released one (a garbled one is named: its ValueError goes up)
        base = None
    found = _read_json(base, "reward_base") if base is not None else None
    sources["reward"] = str(base) if found is not None else "released config (Qwen2-VL-2B)"
    return found if found is not None else REAL_REWARD_CONFIG


# ====================================================================== activations

@dataclass(frozen=True)
class TextTokens:
    """The text slots of one prompt as the blocks see them at their worst (every MLLM and byT5 slot valid):
    L_mllm, L_byt5 and the image slots L_img (zero embeddings for text-to-video, trimmed as padding)."""

    mllm: int  # L_mllm
    byt5: int  # L_byt5
    image: int  # L_img

    @property
    def total(self) -> int:  # T = L_mllm + L_byt5: the text tokens the blocks attend to
        return self.mllm + self.byt5

    @classmethod
    def of(cls, model: ModelConfig) -> "TextTokens":
        from sage_grpo.models.text_encoding import TextEncoderSettings

        return cls(model.text_max_length or TextEncoderSettings.max_length, model.byt5_max_length,
                   model.vision_num_semantic_tokens)


def video_token_count(sizes: ModelSizes, num_frames: int, height: int, width: int) -> int:
    """L: latent tokens of one video (the VAE's latent grid over the transformer's patches)."""
    from sage_grpo.models.geometry import video_tokens

    return video_tokens(sizes.vae_config, sizes.transformer.config, num_frames, height, width)


def text_token_count(model: ModelConfig) -> int:
    """T = L_mllm + L_byt5: the text slots the blocks attend to after the padding is trimmed (models/attention.py),
    at their worst (every MLLM and byT5 slot valid); text-to-video's L_image zero image slots are padding, trimmed."""
    return TextTokens.of(model).total


def block_saved_elements(t: TransformerSizes, video_tokens: int, text_tokens: int, sp: int) -> int:
    """Elements one dual-stream block saves for backward, per sample on one SP rank (no checkpointing).

    Each stream (n image tokens per rank, T text tokens) saves per token 13 D-wide tensors (norm1's input and
    output, the modulated attention input, q and k before and after their RMS norms, the attention output's copy
    that the output projection reads (a slice of the joint sequence, made contiguous), the projection's output for
    the gate, norm2's input and output, the modulated MLP input, the MLP output for the gate), 2 F-wide ones (the
    GELU's input and output), 4 norm statistics and 2·H RMS statistics; and per sample 9·D (the SiLU of the
    conditioning that feeds the modulation, its 6·D output, of which the gates are views, and the two 1 + scale).
    Attention saves q, k, v and its output over the whole sequence S with H/sp heads (4·S·D/sp), its log-sum-exp
    (S·H/sp), and at most a key-padding mask of S (no dense S x S mask, models/attention.py). Checked block by block
    against the tensors autograd saves (``tests/unit/test_bench.py``: exact in fp32 on the tiny and toy models).
    """
    d, f, heads = t.hidden, t.mlp_hidden, t.config["num_attention_heads"]
    n, seq = video_tokens // sp, video_tokens + text_tokens
    streams = (n + text_tokens) * (13 * d + 2 * f + 4 + 2 * heads) + 2 * 9 * d
    attention = seq * (4 * d + heads) // sp
    return streams + attention + seq


def outside_saved_elements(t: TransformerSizes, video_tokens: int, cfg: PlanOptions, sp: int) -> int:
    """Elements saved outside the dual-stream blocks, per sample, for the run ``cfg``: :func:`saved_outside_blocks`
    of its text slots (``--text_max_length``, ``--byt5_max_length``, ``--vision_num_semantic_tokens``) and adapters."""
    return saved_outside_blocks(t, video_tokens, TextTokens.of(cfg.model), lora_in_blocks_only(cfg.lora), sp)


def saved_outside_blocks(t: TransformerSizes, video_tokens: int, text: TextTokens, frozen_outside: bool,
                         sp: int) -> int:
    """Elements saved outside the dual-stream blocks, per sample: the patch embedding's input (C_in·L), the RoPE
    tables (2·n·h_d, shared by all blocks), the output norm and projection (3·D + 2 per token), the byT5 projection
    (its norm's input and output, 2·E2 + 2, and two GELUs' inputs and outputs, 4·2048), the image projection
    (4·E3 + D + 4) and the token refiner (its input, E1, and per refiner layer 10 D-wide and 2 F-wide saves, the
    statistics and the L_mllm² mask). With LoRA in the blocks only (``frozen_outside``, :func:`lora_in_blocks_only`)
    the frozen embedders and refiner save nothing: the RoPE tables and the output layers' saves remain."""
    c = t.config
    d, f, heads, n = t.hidden, t.mlp_hidden, c["num_attention_heads"], video_tokens // sp
    mllm = text.mllm
    if frozen_outside:  # frozen and upstream of every adapter: the embedders and refiner save nothing
        return 2 * n * c["attention_head_dim"] + n * (3 * d + 2)
    embed = c["in_channels"] * video_tokens + 2 * n * c["attention_head_dim"] + n * (3 * d + 2)
    byt5 = text.byt5 * (2 * c["text_embed_2_dim"] + 2 + 4 * BYT5_PROJECTION_WIDTH)
    image = text.image * (4 * c["image_embed_dim"] + d + 4)
    refiner = mllm * c["text_embed_dim"] + c["num_refiner_layers"] * (mllm * (10 * d + 2 * f + 4 + heads) + mllm * mllm)
    return embed + byt5 + image + refiner


def lora_in_blocks_only(lora: LoRAConfig) -> bool:
    """Whether a LoRA run's adapters sit only in the dual-stream blocks (the default ``all-linear`` targets,
    ``sage_grpo.models.lora``): then nothing upstream of the blocks takes part in the backward. Other targets (plain
    names reach the refiner's layers too) are planned as a full fine-tune's saves outside the blocks, an upper bound."""
    from sage_grpo.models.lora import ALL_LINEAR, check_targets

    return lora.use_lora and check_targets(lora.lora_target_modules) in ([], [ALL_LINEAR])


def checkpointed_block_elements(t: TransformerSizes, video_tokens: int, text_tokens: int, sp: int) -> int:
    """What a checkpointed block keeps until its backward, per sample: its two stream inputs, (n + T)·D."""
    return (video_tokens // sp + text_tokens) * t.hidden


def forward_saved_elements(t: TransformerSizes, video_tokens: int, cfg: PlanOptions, sp: int,
                           checkpointing: bool) -> Tuple[int, int]:
    """:func:`saved_for_backward` for the run ``cfg``: its text slots and adapters."""
    return saved_for_backward(t, video_tokens, TextTokens.of(cfg.model), lora_in_blocks_only(cfg.lora), sp,
                              checkpointing)


def saved_for_backward(t: TransformerSizes, video_tokens: int, text: TextTokens, frozen_outside: bool, sp: int,
                       checkpointing: bool) -> Tuple[int, int]:
    """What one training forward keeps for its backward, per sample, as (elements kept as they are, in the compute
    dtype; elements autograd saves, some in fp32 under autocast): with checkpointing every block's two stream inputs
    (:func:`checkpointed_block_elements`), where block 0's are views of the whole patch embedding output (L·D, not
    n·D, under SP) and of the stacked text slots (the L_img image slots too); without it every block's saves. Both
    with the saves outside the blocks (:func:`saved_outside_blocks`).

    The checkpointed inputs are plain tensors of the compute dtype (slope per block of the simulated launch: exactly
    (n + T)·D·c at 2, 8 and 54 blocks, ``sage_grpo/plan/simulate.py``)."""
    depth = t.config["num_layers"]
    outside = saved_outside_blocks(t, video_tokens, text, frozen_outside, sp)
    if not checkpointing:
        return 0, depth * block_saved_elements(t, video_tokens, text.total, sp) + outside
    block_zero = (video_tokens - video_tokens // sp + text.image) * t.hidden
    return depth * checkpointed_block_elements(t, video_tokens, text.total, sp) + block_zero, outside


def training_activation_elements(t: TransformerSizes, video_tokens: int, text: TextTokens, frozen_outside: bool,
                                 sp: int, checkpointing: bool) -> Tuple[int, int]:
    """Activations at their peak, the start of the backward, per sample, split as :func:`saved_for_backward`: the
    forward's, plus with checkpointing one block's saves while it is recomputed."""
    kept, saved = saved_for_backward(t, video_tokens, text, frozen_outside, sp, checkpointing)
    recomputed = block_saved_elements(t, video_tokens, text.total, sp) if checkpointing else 0
    return kept, saved + recomputed


def no_grad_forward_elements(t: TransformerSizes, video_tokens: int, text: TextTokens, sp: int, cfg_batch: bool,
                             adapters_active: bool) -> int:
    """Elements live at the peak of a no-grad transformer forward, per sample on one SP rank, in the compute dtype
    (the RoPE tables, fp32 and per call, are :func:`rope_table_elements`); read off the live tensors at the peak of
    the simulated rollout (``sage_grpo/plan/simulate.py``, the same at 8 and 32 ranks, sp 2 and 4).

    A no-grad forward keeps no saves: what is live is what the code still references. The peak is inside block 0,
    the only block whose image input is a view of the patch embedding's output for the whole video (the SP rank's
    tokens are a chunk of it, so all L·D stay), at the larger of two moments:

    - the image MLP's GELU: its input and output (2·n·F), the residual after attention, the attention output (a
      local of the block's forward) and the modulated MLP input (3·n·D); the text stream's residual, attention output
      and modulated MLP input (3·T·D);
    - the text MLP's GELU: 2·T·F and the same three text tensors, with the image stream's four (its MLP output too).

    With LoRA (the default targets adapt the MLP's first projection) the moment is that projection's out-of-place
    sum in peft: the base output, the scaled adapter output and their sum, one F-wide tensor more per token
    (``adapters_active``: ``--use_lora``, but a LoRA run's fixed reference runs with its adapters disabled).

    At both: the joint text input, (T + L_img)·D twice (diffusers stacks the per-sample concatenations of the
    [byT5, MLLM, image] slots and keeps the list), the three embedders' outputs (L_mllm + L_byt5 + L_img)·D, the zero
    image embeddings L_img·E3, the latent input C_in·L, and in a CFG batch (``cfg_batch``) the concatenated prompt
    embeddings L_mllm·E1 + L_byt5·E2 (without CFG they are the step's own, counted with the inputs).
    """
    c = t.config
    d, f, n, length = t.hidden, t.mlp_hidden, video_tokens // sp, video_tokens
    mllm, byt5, image, total = text.mllm, text.byt5, text.image, text.total
    # LoRA on the MLP's first projection adds out of place (peft: base + B(A(x))·scale): three F-wide tensors there
    lora = f if adapters_active else 0
    image_mlp = 3 * n * d + 2 * n * f + n * lora + 3 * total * d
    text_mlp = 4 * n * d + 2 * total * f + total * lora + 3 * total * d
    outside = (length * d + 2 * (total + image) * d + (mllm + byt5 + image) * d + image * c["image_embed_dim"]
               + c["in_channels"] * length)
    prompts = mllm * c["text_embed_dim"] + byt5 * c["text_embed_2_dim"] if cfg_batch else 0
    return max(image_mlp, text_mlp) + outside + prompts


def rope_table_elements(t: TransformerSizes, video_tokens: int) -> int:
    """The RoPE cos and sin tables of one transformer call, fp32: 2·L·h_d (the SP rank's rows are views of them)."""
    return 2 * video_tokens * t.config["attention_head_dim"]


# ====================================================================== VAE decode

def vae_decode_bytes(vae_config: Dict, frames: int, height: int, width: int, dtype_bytes: int, tiled: bool,
                     tile: int = VAE_TILE_PIXELS) -> float:
    """Peak bytes of ``vae.decode`` of one video of ``frames x height x width`` pixels.

    Untiled: VAE_DECODE_LIVE_TENSORS tensors of (C_top, F, H, W) at the decoder's full-resolution stage. Tiled
    (diffusers' tiles of ``tile`` pixels every ``tile·(1 - overlap)``, decoded row by row and held until they are
    blended): the larger of (a) one tile's full-resolution stage plus the decoded (3-channel) tiles before it, at
    its worst tile, and (b) all decoded tiles plus the blended rows and the video (2 videos), at the end.
    """
    top_channels = vae_config["block_out_channels"][0]
    if not tiled:
        return VAE_DECODE_LIVE_TENSORS * top_channels * frames * height * width * dtype_bytes
    spatial = vae_config["spatial_compression_ratio"]
    latent_tile = tile // spatial
    stride = int(latent_tile * (1 - VAE_TILE_OVERLAP))

    def spans(pixels: int) -> List[int]:  # tile extents in pixels along one axis, in decoding order
        latent = pixels // spatial
        return [min(latent_tile, latent - start) * spatial for start in range(0, latent, stride)]

    held = worst = 0
    for tile_height in spans(height):
        for tile_width in spans(width):
            worst = max(worst, VAE_DECODE_LIVE_TENSORS * top_channels * frames * tile_height * tile_width + held)
            held += 3 * frames * tile_height * tile_width
    return max(worst, held + 2 * 3 * frames * height * width) * dtype_bytes
