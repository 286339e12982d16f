"""What the reward models and the held-out validation scorers hold, for the memory plan (:mod:`sage_grpo.plan.memory`).

* **Trained rewards** (``--reward_model`` unless ``--remote_reward_url`` scores it elsewhere, and ``--extra_rewards``)
  stay on every SP leader through the run: VideoAlign in bf16 (its Qwen2-VL base, :mod:`sage_grpo.plan.sizes`),
  CLIPScore's and PickScore's CLIP models in fp32.
* **Held-out metrics** (``--validation_metrics``, those the training reward does not score already, with validation
  on) are built once on the main process (rank 0) and stay there: VideoAlign in ``--dtype``, the CLIP models in fp32.
  Their weights are counted in every phase of the plan, whose peak is rank 0's.
* **Forwards**: VideoAlign's is :func:`reward_forward_bytes` (on the validation video, one per call, in the
  validation scoring phase); a CLIP scorer encodes ``FRAMES_PER_FORWARD`` frames per call, one layer's
  activations b·t·(4h + i)·4 plus its attention scores b·heads·t²·4 bytes (t = (image / patch)² + 1 tokens), an
  estimate like the reward's. Toys and plug-ins hold nothing the plan can know and are not counted.

CLIP sizes are exact, counted on the ``meta`` device from the scorer folder's ``config.json`` (``--clip_model``,
``--pickscore_model``, as the trainer finds them) or, when it is not there, from the released configs below.
"""

import dataclasses
import functools
from typing import List, Optional, Tuple

from sage_grpo.config.train import RewardConfig
from sage_grpo.plan.options import PlanOptions
from sage_grpo.plan.sizes import ModelSizes, _count, _on_meta
from sage_grpo.safe_io import read_json_object

FRAMES_PER_FORWARD = 64  # sage_grpo.rewards.clip_score: frames per image-encoder call
# The released configs (openai/clip-vit-large-patch14; PickScore_v1, a fine-tuned laion CLIP-ViT-H-14).
CLIP_L14 = {"projection_dim": 768,
            "text_config": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                            "num_attention_heads": 12, "max_position_embeddings": 77, "vocab_size": 49408},
            "vision_config": {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                              "num_attention_heads": 16, "image_size": 224, "patch_size": 14}}
CLIP_H14 = {"projection_dim": 1024,
            "text_config": {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                            "num_attention_heads": 16, "max_position_embeddings": 77, "vocab_size": 49408},
            "vision_config": {"hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32,
                              "num_attention_heads": 16, "image_size": 224, "patch_size": 14}}
CLIP_SCORERS = {"clipscore": ("clip_model", CLIP_L14, "CLIP ViT-L/14"),
                "pickscore": ("pickscore_model", CLIP_H14, "PickScore_v1, CLIP ViT-H/14")}
REWARD_FRAME_PIXELS, REWARD_FPS = 240 * 320, 2.0  # VideoAlign's max_frame_pixels and fps defaults
REWARD_PATCH, REWARD_MERGE = 14, 2  # Qwen2-VL: 14-pixel patches, 2x2 of them merged into one token
REWARD_TEXT_TOKENS = 256  # the prompt template and prompt around the video tokens


@dataclasses.dataclass(frozen=True)
class ScorerMemory:
    name: str
    weights: float  # bytes
    forward: float  # bytes of one call's activations
    note: str


Row = Tuple[str, float, str]  # (component, bytes, formula): a memory-plan Component's fields


def reward_models(reward: RewardConfig) -> List[str]:
    """Every reward model of ``avg`` (``--reward_model``, ``--extra_rewards``)."""
    return list(dict.fromkeys(["videoalign_local" if reward.reward_model == "auto" else reward.reward_model]
                              + list(reward.extra_rewards or {})))


def local_rewards(cfg: PlanOptions) -> List[str]:
    """The reward models of ``avg`` that run on this run's SP leaders (not the remote one)."""
    return reward_models(cfg.reward)[1:] if cfg.reward.remote_reward_url else reward_models(cfg.reward)


def held_out_rewards(cfg: PlanOptions) -> List[str]:
    """The reward models of the held-out validation metrics the trainer builds on the main process."""
    from sage_grpo.rewards.scorers import held_out, registry_name

    if not (cfg.validation.validation_interval > 0 or cfg.validation.validate_at_step0):
        return []
    kept, _ = held_out(cfg.validation.validation_metrics or [], reward_models(cfg.reward))
    return list(dict.fromkeys(registry_name(name) for name in kept))


def needs_videoalign(cfg: PlanOptions) -> bool:
    return "videoalign_local" in local_rewards(cfg) + held_out_rewards(cfg)


@dataclasses.dataclass(frozen=True)
class Scorers:
    """The reward models a run holds and what their forwards see, read once from its sections."""

    local: Tuple[str, ...]  # the trained rewards, on the SP leaders (:func:`local_rewards`)
    held_out: Tuple[str, ...]  # the held-out validation scorers, on rank 0 (:func:`held_out_rewards`)
    reward: RewardConfig  # the CLIP scorers' folders (--clip_model, --pickscore_model), --reward_batch_size
    model_root: str  # --pretrained_model_root, where a hub name's folder is found
    frames: int  # --sample_n_frames of a rollout video
    fps: int  # --video_fps, the rate the reward samples frames at
    validation_frames: int  # --validate_video_length

    @classmethod
    def of(cls, cfg: PlanOptions) -> "Scorers":
        return cls(tuple(local_rewards(cfg)), tuple(held_out_rewards(cfg)), cfg.reward, cfg.model.pretrained_model_root,
                   cfg.rollout.sample_n_frames, cfg.rollout.video_fps, cfg.validation.validate_video_length)


def reward_forward_bytes(frames: int, fps: int, batch: int, reward_shape: Tuple[int, int]) -> Tuple[int, int]:
    """(tokens, bytes) of VideoAlign on ``batch`` videos of ``frames`` frames at ``fps``: one layer's activations
    over the sampled video's and the prompt's tokens, bf16."""
    from sage_grpo.rewards.video_preprocess import num_sampled_frames

    hidden, intermediate = reward_shape
    try:
        sampled = num_sampled_frames(frames, fps, fps=REWARD_FPS)
    except ValueError:  # a video too short to sample: the reward sees it whole
        sampled = frames
    video_tokens = sampled // 2 * REWARD_FRAME_PIXELS // (REWARD_PATCH * REWARD_MERGE) ** 2
    tokens = batch * (video_tokens + REWARD_TEXT_TOKENS)
    return tokens, tokens * (4 * hidden + 3 * intermediate) * 2


@functools.lru_cache(maxsize=8)
def clip_sizes(config_file: Optional[str], name: str) -> Tuple[int, int, int, int, int]:
    """(parameters, vision hidden, vision intermediate, vision tokens, heads) of scorer ``name``'s CLIP model, from
    ``config_file`` or (None) the released config."""
    from transformers import CLIPConfig, CLIPModel

    config = read_json_object(config_file, f"{name}'s config") if config_file else CLIP_SCORERS[name][1]
    clip = CLIPConfig(text_config=config["text_config"], vision_config=config["vision_config"],
                      projection_dim=config.get("projection_dim", 512))
    vision = clip.vision_config
    tokens = (vision.image_size // vision.patch_size) ** 2 + 1
    return (_count(_on_meta(lambda: CLIPModel(clip))), vision.hidden_size, vision.intermediate_size, tokens,
            vision.num_attention_heads)


def _clip_memory(scorers: Scorers, name: str) -> ScorerMemory:
    from sage_grpo.rewards.clip_score import resolve_model_folder

    flag, _, label = CLIP_SCORERS[name]
    try:
        config = resolve_model_folder(getattr(scorers.reward, flag), scorers.model_root, f"--{flag}") / "config.json"
    except FileNotFoundError:
        config = None
    found = config is not None and config.is_file()
    params, hidden, intermediate, tokens, heads = clip_sizes(str(config) if found else None, name)
    forward = FRAMES_PER_FORWARD * tokens * (4 * hidden + intermediate + heads * tokens) * 4
    source = str(config) if found else f"released config, {label}"
    return ScorerMemory(name, params * 4, forward, f"{params / 1e6:.0f}M·4 fp32 ({source}); forward "
                        f"b·t·(4h + i + heads·t)·4, b = {FRAMES_PER_FORWARD} frames, t = {tokens}")


def _memory(scorers: Scorers, sizes: ModelSizes, name: str, dtype_bytes: int, validation: bool
            ) -> Optional[ScorerMemory]:
    """What reward model ``name`` holds with VideoAlign in ``dtype_bytes`` (the CLIP models are fp32), and one call's
    activations on a rollout batch or (``validation``) on one validation video; None when not counted."""
    if name in CLIP_SCORERS:
        return _clip_memory(scorers, name)
    if name != "videoalign_local":
        return None
    frames, batch = (scorers.validation_frames, 1) if validation else (scorers.frames, scorers.reward.reward_batch_size)
    tokens, forward = reward_forward_bytes(frames, scorers.fps, batch, sizes.reward_shape)
    return ScorerMemory(name, sizes.reward_params * dtype_bytes, forward,
                        f"VideoAlign {sizes.reward_params / 1e9:.2f}B·{dtype_bytes}; forward B_r·tokens·(4h + 3i)·2, "
                        f"{tokens} tokens")


def _counted(scorers: Scorers, sizes: ModelSizes, names, dtype_bytes: int, validation: bool):
    return [m for m in (_memory(scorers, sizes, name, dtype_bytes, validation) for name in names) if m is not None]


def resident_rows(scorers: Scorers, sizes: ModelSizes, compute_bytes: int) -> List[Row]:
    """The rewards' weights (SP leaders: VideoAlign in bf16) and the held-out scorers' (rank 0: VideoAlign in
    ``--dtype``), held through the run."""
    rows = [(f"reward model {m.name} (SP leaders)", m.weights, m.note.split(";")[0])
            for m in _counted(scorers, sizes, scorers.local, 2, False)]
    return rows + [(f"held-out scorer {m.name} (rank 0)", m.weights, m.note.split(";")[0])
                   for m in _counted(scorers, sizes, scorers.held_out, compute_bytes, True)]


def _largest_forward(memories: List[ScorerMemory], label: str) -> Row:
    if not memories:
        return (label, 0.0, "")
    largest = max(memories, key=lambda m: m.forward)
    return (f"{label}: {largest.name}", largest.forward, largest.note.split("; ")[-1])


def reward_forward_row(scorers: Scorers, sizes: ModelSizes) -> Row:
    """The largest forward of the rewards of ``avg`` on a rollout batch (they run one after another)."""
    return _largest_forward(_counted(scorers, sizes, scorers.local, 2, False), "reward forward (SP leaders)")


def validation_scoring_row(scorers: Scorers, sizes: ModelSizes, compute_bytes: int) -> Row:
    """The largest forward scoring one validation video: the training reward's or a held-out scorer's (rank 0)."""
    return _largest_forward(_counted(scorers, sizes, scorers.local, 2, True)
                            + _counted(scorers, sizes, scorers.held_out, compute_bytes, True),
                            "validation scoring forward (rank 0)")
