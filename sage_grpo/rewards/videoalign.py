"""Local VideoAlign reward (``videoalign_local``): VideoReward scores for decoded rollouts or mp4 files.

``VideoAlignReward(model_root)`` loads ``<model_root>/VideoReward`` (see ``videoalign_checkpoint``) and is a reward
callable: ``videos (B, 3, F, H, W)`` in [0, 1] at ``video_fps`` plus B prompts give ``{"VQ", "MQ", "TA",
"Overall"}``, each a float32 CPU tensor ``(B,)``. The frames it sees follow the checkpoint's ``data_config`` (``fps`` or
``num_frames``, ``max_frame_pixels``) unless ``sampling`` (``--videoalign_fps`` / ``--videoalign_num_frames`` /
``--videoalign_max_pixels``) overrides them. With an ``inference_config`` in ``model_config.json`` (and
``use_norm``) each head is standardised, ``x -> (x - K_mean) / K_std``; ``Overall = VQ + MQ + TA`` afterwards.

Departures from the reference, all deliberate:

* the B videos of a call go through one padded forward instead of one forward per video (same scores up to
  float round-off; ``build_reward_fn(batch_size=1)`` restores one-at-a-time calls);
* decoded tensors are scored directly. The reference writes each rollout to mp4 (uint8 truncation + H.264,
  ``imageio.mimsave`` defaults) and scores the decoded file; ``from_mp4=True`` / ``score_files`` take that
  path (decoded with imageio-ffmpeg rather than torchvision/PyAV, which may differ by a colour level). On the
  tiny model the codec moves normalised scores by up to 4.9e-3 per head and 1.1e-2 for Overall on smooth moving
  gradients (mean pixel error ~3/255; the same videos' Overall spans 0.24), and by up to 3.2e-2 per head on
  per-pixel noise, the codec's worst case (``python benchmarks/videoalign_codec.py``: 3 sizes x 4 seeds);
* the root is an argument (the reference hard-codes ``./ckpts``), attention is SDPA/eager (no flash-attn),
  and dtype/device are arguments (the reference always runs bf16 on the local GPU).

Everything else follows the reference, including VideoAlign's sequential (not M-RoPE) position ids, see
``videoalign_model``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from .prompt_templates import REWARD_TOKENS, build_prompt
from ..safe_io import CheckpointError, read_json_object
from ..video_io import read_video_frames, write_video
from .video_preprocess import PROCESSOR_MAX_PIXELS, PROCESSOR_MIN_PIXELS
from .videoalign_checkpoint import (
    CHECKPOINT_MODES,
    LoraSettings,
    ResolvedCheckpoint,
    load_checkpoint_weights,
    resolve_checkpoint,
)
from .videoalign_inputs import SamplingOverrides, VideoAlignInputBuilder, VideoInputSpec
from .videoalign_model import VideoRewardModel

HEADS = ("VQ", "MQ", "TA")


def load_reward_tokenizer(base_dir: Path, use_special_tokens: bool):
    """The base tokenizer (right padding) with the three reward tokens registered when the config asks."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(base_dir), padding_side="right", local_files_only=True)
    if use_special_tokens:
        tokenizer.add_special_tokens({"additional_special_tokens": list(REWARD_TOKENS)})
    return tokenizer


def load_chat_template(base_dir: Path, tokenizer) -> str:
    """The processor's chat template (what the reference renders with), else the tokenizer's own."""
    if (base_dir / "chat_template.jinja").is_file():
        return (base_dir / "chat_template.jinja").read_text()
    if (base_dir / "chat_template.json").is_file():
        template = read_json_object(base_dir / "chat_template.json", "the chat template").get("chat_template")
        if not isinstance(template, str):
            raise CheckpointError(f"{base_dir / 'chat_template.json'}: 'chat_template' must be a string")
        return template
    if tokenizer.chat_template:
        return tokenizer.chat_template
    raise FileNotFoundError(f"no chat template in {base_dir} (chat_template.jinja/.json or tokenizer_config.json)")


def lora_target_modules(model: torch.nn.Module, exclude: tuple[str, ...], num_lora_modules: int) -> list[str]:
    """VideoAlign's targets: every Linear/Embedding whose qualified name contains no excluded substring."""
    names = [
        name for name, module in model.named_modules()
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)) and not any(ex in name for ex in exclude)
    ]
    return names[-num_lora_modules:] if num_lora_modules > 0 else names


def build_reward_model(
    resolved: ResolvedCheckpoint,
    tokenizer,
    *,
    device: torch.device,
    dtype: torch.dtype,
    attn_implementation: str,
    position_mode: str,
) -> torch.nn.Module:
    """Base Qwen2-VL + ``rm_head`` (+ resized embeddings, + PEFT LoRA) before the checkpoint weights load.

    The LoRA form starts from the base weights (``rm_head`` stays randomly initialised until the checkpoint
    loads, as in VideoAlign); ``model.pth`` overwrites every tensor, so the full form only needs the
    architecture from ``config.json``.
    """
    cfg = resolved.config
    init_kwargs = dict(
        output_dim=cfg.output_dim,
        reward_token=cfg.reward_token,
        special_token_ids=tuple(tokenizer.convert_tokens_to_ids(list(REWARD_TOKENS))) if cfg.use_special_tokens
        else None,
        pad_token_id=tokenizer.pad_token_id,
        position_mode=position_mode,
    )
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(resolved.base_dir), local_files_only=True)
    with torch.device(device):
        model = VideoRewardModel._from_config(
            config, dtype=dtype, attn_implementation=attn_implementation, **init_kwargs
        )
    if resolved.form == "lora":
        _load_base_weights(model, resolved.base_dir, dtype, attn_implementation)
    if cfg.use_special_tokens:
        model.resize_token_embeddings(len(tokenizer))
    model.to(device=device, dtype=dtype)
    if cfg.lora is not None:
        model = _with_lora(model, cfg.lora)
    return model


def _load_base_weights(model: torch.nn.Module, base_dir: Path, dtype: torch.dtype, attn_implementation: str) -> None:
    """The LoRA form's starting point: the base Qwen2-VL weights copied into ``model``, every tensor but
    ``rm_head`` (which stays randomly initialised until the checkpoint loads, as in VideoAlign)."""
    from transformers import Qwen2VLForConditionalGeneration

    # Load through the parent class: transformers' legacy-key conversion for Qwen2-VL checkpoints is
    # registered under that class name, not under subclasses.
    base = Qwen2VLForConditionalGeneration.from_pretrained(
        str(base_dir), dtype=dtype, attn_implementation=attn_implementation, local_files_only=True
    )
    result = model.load_state_dict(base.state_dict(), strict=False)
    if result.unexpected_keys or set(result.missing_keys) != {"rm_head.weight"}:
        raise RuntimeError(
            f"base model {base_dir} does not fit VideoRewardModel: missing {result.missing_keys}, "
            f"unexpected {result.unexpected_keys}"
        )


def _with_lora(model: torch.nn.Module, lora: LoraSettings) -> torch.nn.Module:
    """``model`` wrapped with the checkpoint's PEFT LoRA (``lora``: its config's ``lora`` settings) on
    VideoAlign's targets (:func:`lora_target_modules`)."""
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(
        target_modules=lora_target_modules(model, lora.namespan_exclude, lora.num_lora_modules),
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        task_type=lora.task_type,
        use_rslora=lora.use_rslora,
        bias="none",
        modules_to_save=list(lora.modules_to_save) if lora.modules_to_save else None,
    ))


def processor_pixel_budget(base_dir: Path) -> tuple[int, int]:
    """(min_pixels, max_pixels) of the base model's Qwen2-VL video processor, read as transformers reads them: the
    first of ``video_preprocessor_config.json`` and ``preprocessor_config.json`` (Qwen2-VL-2B-Instruct has only the
    latter: 3136 .. 12845056), its ``min_pixels`` / ``max_pixels`` over its ``size`` (``shortest_edge`` /
    ``longest_edge``), else the processor class's defaults."""
    for name in ("video_preprocessor_config.json", "preprocessor_config.json"):
        path = base_dir / name
        if path.is_file():
            raw = read_json_object(path, "the preprocessor config")
            size = raw.get("size") or {}
            return (int(raw.get("min_pixels", size.get("shortest_edge", PROCESSOR_MIN_PIXELS))),
                    int(raw.get("max_pixels", size.get("longest_edge", PROCESSOR_MAX_PIXELS))))
    return PROCESSOR_MIN_PIXELS, PROCESSOR_MAX_PIXELS


def _input_spec(resolved: ResolvedCheckpoint, vision_config) -> VideoInputSpec:
    cfg = resolved.config
    mean_std = {}
    preprocessor = resolved.base_dir / "preprocessor_config.json"
    if preprocessor.is_file():
        raw = read_json_object(preprocessor, "the preprocessor config")
        mean_std = {k: tuple(raw[k]) for k in ("image_mean", "image_std") if k in raw}
    processor_min, processor_max = processor_pixel_budget(resolved.base_dir)
    return VideoInputSpec(
        fps=cfg.fps if cfg.num_frames is None else None,
        num_frames=cfg.num_frames,
        max_pixels=cfg.max_frame_pixels,
        processor_min_pixels=processor_min,
        processor_max_pixels=processor_max,
        patch_size=vision_config.patch_size,
        temporal_patch_size=vision_config.temporal_patch_size,
        merge_size=vision_config.spatial_merge_size,
        **mean_std,
    )


class VideoAlignReward:
    """VideoReward as a reward callable: ``(videos (B,3,F,H,W) in [0,1], prompts) -> {VQ, MQ, TA, Overall}``."""

    metric_names = ("VQ", "MQ", "TA", "Overall")
    accepts_uint8 = True  # uint8 videos in [0, 255] score as the same videos / 255 (only the sampled frames convert)

    def __init__(
        self,
        model_root: str | Path = "./ckpts",
        *,
        checkpoint_step: int | None = None,
        checkpoint_mode: str = "v3",
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.bfloat16,
        video_fps: float = 24.0,
        use_norm: bool = True,
        from_mp4: bool = False,
        position_mode: str = "sequential",
        attn_implementation: str = "sdpa",
        sampling: SamplingOverrides | None = None,
    ):
        if checkpoint_mode not in CHECKPOINT_MODES:
            raise ValueError(f"checkpoint_mode {checkpoint_mode!r} is not one of {CHECKPOINT_MODES} (default 'v3')")
        if attn_implementation not in ("sdpa", "eager"):
            raise ValueError(f"attn_implementation {attn_implementation!r}: use 'sdpa' or 'eager' (no flash-attn)")
        resolved = resolve_checkpoint(model_root, checkpoint_step)
        cfg = resolved.config
        if cfg.sample_type != "uniform":
            raise ValueError(f"data_config.sample_type {cfg.sample_type!r} is not supported; only 'uniform' is")
        build_prompt("", cfg.prompt_template_type)  # fail now, not at the first rollout, on unknown templates
        from transformers import AutoConfig

        # the frame budget is settled (and an override checked) before the model loads
        vision_config = AutoConfig.from_pretrained(str(resolved.base_dir), local_files_only=True).vision_config
        spec = (sampling or SamplingOverrides()).apply(_input_spec(resolved, vision_config))
        self.checkpoint = resolved
        self.device = torch.device(device)
        self.video_fps = float(video_fps)
        self.use_norm = use_norm
        self.from_mp4 = from_mp4
        self.tokenizer = load_reward_tokenizer(resolved.base_dir, cfg.use_special_tokens)
        self.model = build_reward_model(
            resolved, self.tokenizer, device=self.device, dtype=dtype,
            attn_implementation=attn_implementation, position_mode=position_mode,
        )
        load_checkpoint_weights(self.model, resolved, checkpoint_mode)
        self.model.eval().requires_grad_(False)
        # PEFT injects the LoRA layers in place; calling the inner module avoids PeftModel's causal-LM forward.
        self.network: VideoRewardModel = self.model.get_base_model() if cfg.lora is not None else self.model
        self.inputs = VideoAlignInputBuilder(
            self.tokenizer,
            load_chat_template(resolved.base_dir, self.tokenizer),
            spec,
            cfg.prompt_template_type,
        )

    def __call__(self, videos: torch.Tensor, prompts: list[str]) -> dict[str, torch.Tensor]:
        if videos.ndim != 5 or videos.shape[1] != 3:
            raise ValueError(f"videos must be (B, 3, F, H, W) in [0, 1], got shape {tuple(videos.shape)}")
        if len(prompts) != videos.shape[0]:
            raise ValueError(f"{videos.shape[0]} videos but {len(prompts)} prompts")
        if self.from_mp4:
            with tempfile.TemporaryDirectory(prefix="videoalign_") as tmp:
                paths = [write_video(Path(tmp) / f"{i}.mp4", v if v.is_floating_point() else v.float().div_(255.0),
                                     fps=self.video_fps) for i, v in enumerate(videos)]
                return self.score_files(paths, prompts)
        frames = [self.inputs.frames_from_tensor(video, self.video_fps) for video in videos]
        return self.score_frames(frames, prompts)

    def score_files(self, paths: list[str | Path], prompts: list[str]) -> dict[str, torch.Tensor]:
        """Score video files the way the reference does (decode to uint8, sample at the file's fps)."""
        frames = []
        for path in paths:
            decoded, fps = read_video_frames(path)
            frames.append(self.inputs.frames_from_uint8(decoded, fps))
        return self.score_frames(frames, prompts)

    def score_frames(self, frames: list[torch.Tensor], prompts: list[str]) -> dict[str, torch.Tensor]:
        """Score already sampled + resized frames ``(T, 3, h, w)`` in [0, 255] (one entry per prompt)."""
        batch = self.inputs.build(frames, prompts)
        return self.scores_from_logits(self.logits(batch))

    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Pooled reward-head outputs ``(B, K)`` (float32) for a batch from ``inputs.build``."""
        batch = {k: v.to(self.device) for k, v in batch.items()}
        with torch.inference_mode():
            return self.network(**batch).float()

    def scores_from_logits(self, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        if logits.ndim != 2 or logits.shape[1] < 3:
            raise ValueError(f"VideoReward produced logits of shape {tuple(logits.shape)}; need (B, >=3)")
        values = logits.detach().double().cpu()
        stats = self.checkpoint.config.norm_stats if self.use_norm else None
        scores = {}
        for column, head in enumerate(HEADS):
            x = values[:, column]
            if stats is not None:
                x = (x - stats[f"{head}_mean"]) / stats[f"{head}_std"]
            scores[head] = x
        scores["Overall"] = scores["VQ"] + scores["MQ"] + scores["TA"]
        return {k: v.float() for k, v in scores.items()}
