"""Sections of ``TrainConfig`` that say what a step samples and how it is scored: the data, the rollout and its
SDE, the reward."""

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from sage_grpo.config.bounds import AT_LEAST_1, NON_NEGATIVE, POSITIVE, SEED, Bound
from sage_grpo.config.schema import config_field
from sage_grpo.config.sections import section
from sage_grpo.sde.registry import SDE_TYPES  # the SDE table's names (torch-free): --sde_type's choices
# The reference's 16:9 resolution buckets (docs/reference.md#the-rollout): bucket base size -> (height, width).
# The one bucket table: rollouts (--video_bucket_hw_base_size) and generate.py's --resolution both read it.
RESOLUTION_BUCKETS = {256: (192, 336), 480: (352, 624), 640: (480, 864), 720: (544, 960), 960: (720, 1280),
                      1440: (1080, 1920)}
DEFAULT_REWARD_WEIGHTS = '{"VQ":0.5,"MQ":0.5,"TA":1.0}'
# The CLIPScore and PickScore checkpoints (hub names, found as <model root>/<name after its last '/'>): the trainer's
# flags and the evaluation's read them here (sage_grpo/rewards/clip_score.py, pick_score.py).
DEFAULT_CLIP_MODEL = "openai/clip-vit-large-patch14"
PICKSCORE_MODEL = "yuvalkirstain/PickScore_v1"
PICKSCORE_PROCESSOR = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"


@section("data", "training prompts and how many videos a step draws")
@dataclass
class DataConfig:
    train_video_csv: Optional[List[str]] = config_field(
        None, "Prompt CSV file(s) with a 'prompt' column (optional index, seed, ref_image_path); "
        "default assets/demo_train.csv", nargs="+")
    batch_size: int = config_field(
        2, "Prompts (rollout videos) per data-parallel rank per step", on_card=True, bound=AT_LEAST_1)
    num_generations: int = config_field(
        4, "GRPO group size G: videos per prompt, across all ranks", defines_run=True, on_card=True,
        bound=Bound(2, rule="group-size", why=": GRPO needs groups of at least 2 videos of a prompt (a group "
                             "of one has advantage 0 for every sample: nothing is learnt)",
                             fix="use --num_generations 4 (the reference's)"))
    seed: int = config_field(
        42, "Base seed: data order, shuffles and per-rank RNG (seed + dp_rank)", defines_run=True, on_card=True,
        bound=SEED)


@section("rollout and SDE", "sampling the rollout videos: the SDE, its schedule, guidance and video size")
@dataclass
class RolloutConfig:
    sde_type: str = config_field(
        "sage_grpo", "SDE used for rollouts and log-probs", choices=SDE_TYPES, defines_run=True, on_card=True)
    eta: float = config_field(
        0.5, "SDE noise level eta", defines_run=True, on_card=True,
        bound=Bound(0, low_open=True, rule="eta-positive", why=" (0 is a zero-noise SDE with no log-probability)",
                 fix="use --eta 0.5 (the reference's value)"))
    grpo_sampling_steps: int = config_field(
        20, "Rollout denoising steps; every one is an SDE step and a trained step", defines_run=True, on_card=True,
        bound=Bound(1, rule="sampling-steps", fix="use 20"))
    infer_flow_shift_video: float = config_field(
        5.0, "Flow shift of the rollout sigma schedule", defines_run=True, on_card=True, bound=POSITIVE)
    cfg_scale: float = config_field(
        6.0, "Classifier-free guidance scale s in rollouts, training and validation; s <= 1: no guidance (conditional "
        "velocity). Unset: the version's guider config (cfg-distilled: 1.0) when the model root has one, else 6.0",
        defines_run=True, on_card=True, bound=POSITIVE)
    neg_prompt: str = config_field("", "Negative prompt for CFG", defines_run=True)
    sample_n_frames: int = config_field(81, "Frames per rollout video", defines_run=True, bound=AT_LEAST_1)
    video_bucket_hw_base_size: int = config_field(
        480, "Rollout resolution bucket", choices=tuple(RESOLUTION_BUCKETS), defines_run=True,
        bound="its choices (the resolution buckets)")
    rollout_height: Optional[int] = config_field(
        None, "Rollout height override (default: from the bucket)", defines_run=True, bound=AT_LEAST_1)
    rollout_width: Optional[int] = config_field(
        None, "Rollout width override (default: from the bucket)", defines_run=True, bound=AT_LEAST_1)
    video_fps: int = config_field(24, "Frame rate of saved videos and of reward frame sampling", bound=AT_LEAST_1)
    use_same_noise: bool = config_field(
        False, "All members of a group start from the same initial noise", defines_run=True)
    sde_window_size: int = config_field(
        0, "Train only a window of this many consecutive denoising steps (SDE steps; ODE steps elsewhere, not "
        "trained); 0: off, every step SDE and trained (the reference)", defines_run=True,
        bound="the sde-window rule: in [0, --grpo_sampling_steps]")
    sde_window_stride: int = config_field(
        1, "Optimizer updates between two one-step moves of the --sde_window_size window (wrapping to step 0 after "
        "the last position); 0: the window stays on the first steps", defines_run=True,
        bound="the sde-window rule: >= 0")


@section("reward", "the reward model, its weights and the remote reward server")
@dataclass
class RewardConfig:
    reward_model: str = config_field(
        "videoalign_local", "Reward model: videoalign_local, a built-in toy reward, or a dotted path "
        "'package.module:callable'", defines_run=True, on_card=True)
    reward_weights: str = config_field(
        DEFAULT_REWARD_WEIGHTS, "JSON weights of the sub-rewards, avg = sum w_m * m; '' or '{}': the reward's fallback "
        "weights (VideoAlign: VQ = MQ = TA = 1, as the reference)", defines_run=True, on_card=True)
    reward_kwargs: str = config_field(
        "{}", "JSON constructor arguments of the reward model, e.g. '{\"target_rgb\": [0, 0, 1]}' for target_color",
        defines_run=True)
    reward_aggregation: str = config_field(
        "sum", "sum: group advantages of the weighted reward sum avg (the reference); advantage: the weighted sum "
        "of each weighted reward's own group advantages (DanceGRPO)", choices=("sum", "advantage"),
        defines_run=True)
    reward_checkpoint_mode: str = config_field(
        "v3", "Key-remapping mode for the VideoReward state dict", choices=("v1", "v2", "v3"), defines_run=True)
    reward_batch_size: int = config_field(4, "Videos per reward-model forward", bound=AT_LEAST_1)
    reward_from_mp4: bool = config_field(False, "Score the saved mp4 files (strict reference parity) instead of tensors")
    videoalign_fps: Optional[float] = config_field(
        None, "Frames per second of video VideoAlign sees (default: the checkpoint's data_config.fps)",
        defines_run=True, bound=POSITIVE)
    videoalign_num_frames: Optional[int] = config_field(
        None, "Fixed frame count VideoAlign sees instead of a rate; excludes --videoalign_fps (default: the "
        "checkpoint's data_config)", defines_run=True, bound=AT_LEAST_1)
    videoalign_max_pixels: Optional[int] = config_field(
        None, "Pixel budget (H x W) of each frame VideoAlign sees (default: the checkpoint's "
        "data_config.max_frame_pixels)", defines_run=True, bound=AT_LEAST_1)
    remote_reward_url: Optional[str] = config_field(
        None, "Score --reward_model on a reward server (scripts/reward_server.py), e.g. http://host:8765; unset: "
        "locally")
    remote_reward_retries: int = config_field(
        3, "Retries of a remote reward request after a connection error, timeout or 5xx (backoff 0.5 s, doubling); "
        "then its samples score NaN", bound=NON_NEGATIVE)
    remote_reward_timeout: float = config_field(600.0, "Seconds one remote reward request may take", bound=POSITIVE)
    max_failed_reward_steps: int = config_field(
        3, "Stop after this many consecutive steps that trained on nothing: the reward failed on every sample, or "
        "the loss was not finite so the update was skipped (0: never stop)", bound=NON_NEGATIVE)
    extra_rewards: Optional[Dict[str, Any]] = config_field(
        None, "Further reward models summed into avg with --reward_model: name=weight words (a bare name: 1.0), or a "
        "mapping name -> weight or -> {weight, sub_reward, kwargs} (YAML, or JSON on the command line), e.g. "
        "--extra_rewards clipscore=0.5 pickscore=0.01; naming --reward_model sets its weight (default 1.0)",
        defines_run=True)
    clip_model: str = config_field(
        DEFAULT_CLIP_MODEL, "CLIPScore's model (training on clipscore, or --validation_metrics clipscore): a local "
        "CLIP folder, or a hub name found as <pretrained_model_root>/<name after its last '/'>")
    pickscore_model: str = config_field(PICKSCORE_MODEL, "PickScore's model (folder, or <root>/<name>)")
    pickscore_processor: str = config_field(PICKSCORE_PROCESSOR, "PickScore's processor (folder, or <root>/<name>)")
