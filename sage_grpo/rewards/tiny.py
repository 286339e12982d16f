"""A tiny random-weight VideoReward in the released on-disk layout, for tests and CPU demos.

``write_tiny_video_reward(root)`` writes, deterministically for a given seed, in about a second and < 5 MB::

    <root>/VideoReward/model_config.json             detailed_special prompt, special-token pooling, LoRA r=4,
                                                      the released checkpoint's inference_config statistics
    <root>/VideoReward/tiny-qwen2-vl-base/           base model: Qwen2-VL config + safetensors, an offline
                                                      byte-level BPE Qwen2 tokenizer, chat template,
                                                      preprocessor_config.json (model_name_or_path points here)
    <root>/VideoReward/checkpoint-1/                 LoRA form: adapter_model.safetensors, adapter_config.json,
                                                      non_lora_state_dict.pth
    <root>/VideoReward/checkpoint-2/model.pth        full form of the same weights (the latest checkpoint)

Both checkpoints hold the same network, so they must score identically. ``key_layout`` picks the state-dict
naming: ``"legacy"`` (pre-4.52 transformers, like the released checkpoint; load with mode v1 or v3) or
``"current"`` (transformers >= 4.52; load with v2 or v3). The weights are random: scores are meaningless
but depend on the video and the prompt, which is all the plumbing tests need. ``model_config.json`` holds only keys
VideoAlign's own dataclasses accept (``DataConfig``, ``ModelConfig``, ``PEFTLoraConfig``), so its ``inference.py``
loads the folder too; the frames are therefore sized as VideoAlign sizes them: a video smaller than
``max_frame_pixels`` (56x84) is enlarged to qwen-vl-utils' minimum of 128x28x28 pixels (a 64x96 video to 280x392,
16x16 to 336x336), one larger is shrunk to the budget; the model's width keeps CPU forwards in the tens of ms.

``write_tiny_clip_scorers(root)`` writes the evaluation scorers' stand-ins (``CLIPModel`` + ``CLIPProcessor``, 1-layer
towers on 16x16 images, an offline byte-level CLIP tokenizer) under the folder names of the real hub repos.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from ..models.tiny_tokenizer import QWEN_SPECIAL_TOKENS, build_tiny_qwen_tokenizer
from .prompt_templates import DETAILED_SPECIAL_TEMPLATE
from .video_preprocess import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

BASE_DIRNAME = "tiny-qwen2-vl-base"
LORA_STEP = 1
FULL_STEP = 2
# The released VideoReward's inference_config (KlingTeam/VideoReward model_config.json).
RELEASED_NORM_STATS = {
    "VQ_mean": 3.6757, "VQ_std": 2.2476, "MQ_mean": 1.1646, "MQ_std": 1.3811, "TA_mean": 2.8105, "TA_std": 2.5121,
}
_CORPUS = (
    DETAILED_SPECIAL_TEMPLATE,
    "system\nYou are a helpful assistant.\nuser\nassistant\n",
    "A cat walks on the grass, realistic. A red ball bounces on a wooden floor. The camera pans over a city at "
    "night. A dog runs along the beach at sunset.",
)


def tiny_qwen2_vl_config(tokenizer):
    """A ~0.2M-parameter Qwen2-VL: 2 text layers of width 64, a 2-block vision tower of width 32."""
    from transformers import Qwen2VLConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS}
    return Qwen2VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1e6},
            bos_token_id=None, eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
        ),
        vision_config=dict(
            depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2,
            patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
        ),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )


def tiny_model_config_json(lora_r: int = 4) -> dict:
    """``model_config.json`` with the released checkpoint's field names and choices, scaled down."""
    return {
        "data_config": {
            "meta_data": "unused", "data_dir": "unused",
            "max_frame_pixels": 56 * 84, "fps": 2.0, "num_frames": None,
            "eval_dim": ["VQ", "MQ", "TA"], "prompt_template_type": "detailed_special", "sample_type": "uniform",
        },
        "model_config": {
            "model_name_or_path": BASE_DIRNAME, "output_dim": 1, "use_special_tokens": True,
            "reward_token": "special", "torch_dtype": "bfloat16",
        },
        "peft_lora_config": {
            "lora_enable": True, "vision_lora": False, "lora_r": lora_r, "lora_alpha": 2 * lora_r,
            "lora_dropout": 0.05, "lora_target_modules": None,
            "lora_namespan_exclude": ["lm_head", "rm_head", "embed_tokens", "visual"],
            "lora_modules_to_save": None, "lora_task_type": "CAUSAL_LM", "use_rslora": False, "num_lora_modules": -1,
        },
        "inference_config": dict(RELEASED_NORM_STATS),
    }


def to_key_layout(state_dict: dict[str, torch.Tensor], layout: str) -> dict[str, torch.Tensor]:
    """Rename transformers-5 PEFT keys into ``layout``: ``"current"`` (unchanged) or ``"legacy"`` (pre-4.52)."""
    if layout == "current":
        return dict(state_dict)
    if layout != "legacy":
        raise ValueError(f"key_layout must be 'legacy' or 'current', got {layout!r}")
    renames = (("base_model.model.model.visual.", "base_model.model.visual."),
               ("base_model.model.model.language_model.", "base_model.model.model."))
    out = {}
    for key, value in state_dict.items():
        for old, new in renames:
            if key.startswith(old):
                key = new + key[len(old):]
                break
        out[key] = value
    return out


def _write_base(base_dir: Path, seed: int):
    from transformers import Qwen2VLForConditionalGeneration

    tokenizer = build_tiny_qwen_tokenizer(list(_CORPUS) * 4, vocab_size=1200)
    tokenizer.save_pretrained(base_dir)
    torch.manual_seed(seed)
    Qwen2VLForConditionalGeneration(tiny_qwen2_vl_config(tokenizer)).save_pretrained(base_dir)
    (base_dir / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Qwen2VLImageProcessor", "image_mean": list(OPENAI_CLIP_MEAN),
        "image_std": list(OPENAI_CLIP_STD), "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
        "min_pixels": 56 * 56, "max_pixels": 28 * 28 * 1280,
    }, indent=2))


def _randomize_trained_weights(model: torch.nn.Module, seed: int) -> set[str]:
    """Give the parts VideoAlign trains (LoRA, rm_head, embeddings, merger) non-trivial values.

    Returns the state-dict keys of the non-LoRA trained tensors (what ``non_lora_state_dict.pth`` holds).
    """
    gen = torch.Generator().manual_seed(seed + 1)
    non_lora = set()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.05)
            elif "rm_head" in name or "embed_tokens" in name or "visual.merger" in name:
                param.add_(torch.randn(param.shape, generator=gen) * 0.05)
                non_lora.add(name)
    keys = set(model.state_dict())
    non_lora |= {k for k in keys if k.endswith("lm_head.weight")}  # tied to embed_tokens
    return non_lora


def write_tiny_video_reward(output_root: str | Path, *, seed: int = 0, key_layout: str = "legacy") -> Path:
    """Write the tiny VideoReward under ``<output_root>/VideoReward`` and return that folder."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    from .videoalign import build_reward_model, load_reward_tokenizer
    from .videoalign_checkpoint import ResolvedCheckpoint, VideoRewardConfig

    reward_dir = Path(output_root) / "VideoReward"
    base_dir = reward_dir / BASE_DIRNAME
    base_dir.mkdir(parents=True, exist_ok=True)
    _write_base(base_dir, seed)
    config_path = reward_dir / "model_config.json"
    config_path.write_text(json.dumps(tiny_model_config_json(), indent=2))

    lora_dir, full_dir = reward_dir / f"checkpoint-{LORA_STEP}", reward_dir / f"checkpoint-{FULL_STEP}"
    resolved = ResolvedCheckpoint(reward_dir, lora_dir, LORA_STEP, "lora", base_dir,
                                  VideoRewardConfig.from_file(config_path))
    tokenizer = load_reward_tokenizer(base_dir, use_special_tokens=True)
    torch.manual_seed(seed)
    model = build_reward_model(resolved, tokenizer, device=torch.device("cpu"), dtype=torch.float32,
                               attn_implementation="sdpa", position_mode="sequential")
    non_lora_keys = _randomize_trained_weights(model, seed)
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}

    lora_dir.mkdir(exist_ok=True)
    adapter = {k: v.contiguous() for k, v in get_peft_model_state_dict(model).items()}
    save_file(to_key_layout(adapter, key_layout), lora_dir / "adapter_model.safetensors")
    adapter_config = model.peft_config["default"].to_dict()
    adapter_config["target_modules"] = sorted(adapter_config["target_modules"])
    adapter_config["base_model_name_or_path"] = BASE_DIRNAME  # relative, so the folder can move
    (lora_dir / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2, default=str))
    torch.save(to_key_layout({k: state[k] for k in sorted(non_lora_keys)}, key_layout),
               lora_dir / "non_lora_state_dict.pth")

    full_dir.mkdir(exist_ok=True)
    torch.save(to_key_layout(state, key_layout), full_dir / "model.pth")
    return reward_dir


def gradient_videos(batch: int = 3, frames: int = 9, height: int = 64, width: int = 96, seed: int = 0) -> torch.Tensor:
    """(B, 3, F, H, W) moving sinusoidal colour gradients in [0.1, 0.9]: smooth, codec-friendly test videos whose
    scores differ with the content (tests, ``benchmarks/videoalign_codec.py``)."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.linspace(0, 1, height).view(1, 1, height, 1)
    x = torch.linspace(0, 1, width).view(1, 1, 1, width)
    t = torch.linspace(0, 1, frames).view(1, frames, 1, 1)
    videos = []
    for _ in range(batch):
        a, b, phase = torch.rand(3, 3, generator=gen)
        channels = [0.5 + 0.4 * torch.sin(2 * math.pi * (a[c] * x + b[c] * y + 0.5 * t + phase[c])) for c in range(3)]
        videos.append(torch.cat(channels, dim=0))
    return torch.stack(videos)


# ---------------------------------------------------------------- the evaluation scorers (CLIPScore, PickScore)
TINY_CLIP_IMAGE_SIZE = 16
PICKSCORE_LOGIT_SCALE = 4.6052  # ln 100, PickScore_v1's learnt temperature, so tiny scores have its scale


def _tiny_clip_processor():
    """A ``CLIPProcessor``: an offline byte-level CLIP tokenizer (every byte a token, with and without CLIP's
    ``</w>`` word end, no merges) and CLIP's image processor at 16x16 with the OpenAI mean/std."""
    from tokenizers import pre_tokenizers
    from transformers import CLIPImageProcessor, CLIPProcessor, CLIPTokenizer

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    vocab.update({char: 2 + i for i, char in enumerate(alphabet)})
    vocab.update({char + "</w>": 2 + len(alphabet) + i for i, char in enumerate(alphabet)})
    size = TINY_CLIP_IMAGE_SIZE
    images = CLIPImageProcessor(size={"shortest_edge": size}, crop_size={"height": size, "width": size},
                                image_mean=list(OPENAI_CLIP_MEAN), image_std=list(OPENAI_CLIP_STD))
    return CLIPProcessor(image_processor=images, tokenizer=CLIPTokenizer(vocab=vocab, merges=[]))


def _write_tiny_clip_model(folder: Path, vocab_size: int, seed: int, logit_scale: float | None) -> None:
    from transformers import CLIPConfig, CLIPModel

    text = dict(vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2, max_position_embeddings=77, bos_token_id=0, eos_token_id=1, pad_token_id=1)
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  image_size=TINY_CLIP_IMAGE_SIZE, patch_size=8)
    extra = {} if logit_scale is None else {"logit_scale_init_value": logit_scale}
    config = CLIPConfig(text_config=text, vision_config=vision, projection_dim=8, **extra)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = CLIPModel(config)
    model.save_pretrained(folder)  # config.json + model.safetensors


def write_tiny_clip_scorers(root: str | Path, *, seed: int = 0) -> Path:
    """Tiny random-weight stand-ins of the evaluation scorers, in the layout ``download_weights.sh --eval_scorers``
    gives (``<root>/<hub repo name>``): ``clip-vit-large-patch14/`` (CLIPModel + its processor),
    ``PickScore_v1/`` (CLIPModel only, logit scale ln 100) and ``CLIP-ViT-H-14-laion2B-s32B-b79K/`` (the processor
    PickScore uses). transformers' own classes, 1-layer towers; a seed gives identical files."""
    from sage_grpo.config.train import DEFAULT_CLIP_MODEL, PICKSCORE_MODEL, PICKSCORE_PROCESSOR

    root = Path(root)
    processor = _tiny_clip_processor()
    vocab_size = len(processor.tokenizer)
    clip_dir = root / DEFAULT_CLIP_MODEL.split("/")[-1]
    _write_tiny_clip_model(clip_dir, vocab_size, seed + 10, None)
    processor.save_pretrained(clip_dir)
    _write_tiny_clip_model(root / PICKSCORE_MODEL.split("/")[-1], vocab_size, seed + 11, PICKSCORE_LOGIT_SCALE)
    processor.save_pretrained(root / PICKSCORE_PROCESSOR.split("/")[-1])
    return root
