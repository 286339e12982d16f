"""The topic groups ``--help`` shows the flags in: every flag of every command is placed here, once.

A command's groups are ``(title, description, field names)`` in the order ``--help`` prints them (flags in the order
listed). :func:`sage_grpo.config.schema.build_parser` reads them through :func:`grouped_fields`, so ``post_train.py``,
``python -m sage_grpo.plan``, ``generate.py``, ``python -m sage_grpo.evaluate`` and ``scripts/reward_server.py`` all
show their flags by topic. **A new flag goes into one group of its command's table below.** A flag no table places
still works and is shown under "other options", but tests/unit/test_help_groups.py fails and names this file.
"""

import dataclasses
from typing import Any, Dict, List, Tuple

FlagGroups = Tuple[Tuple[str, str, Tuple[str, ...]], ...]
UNGROUPED = "other options"
UNGROUPED_TEXT = "flags without a topic yet (declare one in sage_grpo/config/help_groups.py)"

TRAIN_GROUPS: FlagGroups = (
    ("model", "the checkpoint tree, the transformer version and the precision it is trained in", (
        "pretrained_model_root", "pretrained_transformer_version", "post_train_type", "dtype", "master_weight_type",
        "attention_backend", "text_max_length", "byt5_max_length", "vision_num_semantic_tokens")),
    ("data", "training prompts and how many videos a step draws", (
        "train_video_csv", "batch_size", "num_generations", "seed")),
    ("rollout and SDE", "sampling the rollout videos: the SDE, its schedule, guidance and video size", (
        "sde_type", "eta", "grpo_sampling_steps", "infer_flow_shift_video", "cfg_scale", "neg_prompt",
        "sample_n_frames", "video_bucket_hw_base_size", "rollout_height", "rollout_width", "video_fps",
        "use_same_noise", "sde_window_size", "sde_window_stride")),
    ("reward", "the reward model, its weights and the remote reward server", (
        "reward_model", "reward_weights", "reward_kwargs", "reward_aggregation", "reward_checkpoint_mode",
        "reward_batch_size", "reward_from_mp4", "videoalign_fps", "videoalign_num_frames", "videoalign_max_pixels",
        "remote_reward_url", "remote_reward_retries", "remote_reward_timeout", "max_failed_reward_steps",
        "extra_rewards", "clip_model", "pickscore_model", "pickscore_processor")),
    ("GRPO update", "advantages, the clipped ratio, the gradient-norm equalizer and the trained steps", (
        "clip_range", "adv_clip_max", "timestep_fraction", "use_grad_balancing", "enable_timestep_permutation",
        "num_inner_epochs", "sde_window_equalizer")),
    ("KL and trust region", "the moving reference anchor, the step-wise KL and the adaptive KL coefficient", (
        "kl_weight", "kl_coef", "kl_min_coef", "use_moving_KL", "update_ref_model_step", "use_dual_kl",
        "dual_kl_moving_weight", "dual_kl_step_weight", "stepwise_kl_reference")),
    ("optimisation", "optimizer, learning-rate schedule and run length", (
        "learning_rate", "lr_scheduler", "warmup_steps", "lr_num_cycles", "lr_power", "weight_decay", "use_muon",
        "max_grad_norm", "max_grad_norm_units", "gradient_accumulation_steps", "max_steps", "ema_decay")),
    ("LoRA", "train LoRA adapters instead of every weight", (
        "use_lora", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "pretrained_lora_path")),
    ("parallelism and memory", "FSDP2, Ulysses, the memory plan's placements, the device", (
        "sp_size", "dp_replicate", "enable_fsdp", "fsdp_param_dtype", "enable_gradient_checkpointing",
        "gradient_reduction", "mini_batch_size_per_update", "reference_mode_offload", "reference_placement",
        "reference_batch_size", "offload_text_encoders", "image_cache_gb", "vae_tiling", "gpu_memory_gb",
        "ignore_memory_plan", "collective_timeout_minutes", "device", "cpu_threads")),
    ("throughput", "levers that change how fast a step runs, not what it computes", (
        "replay_group_size", "async_reward", "mixed_length_attention")),
    ("logging and checkpoints", "the run directory, checkpoints, resuming, trackers and saved rollouts", (
        "output_dir", "overwrite_output_dir", "save_interval", "keep_checkpoints", "resume_from_checkpoint",
        "allow_config_change", "log_interval", "quiet", "report_to", "tracker_project_name", "run_name",
        "save_rollout_videos", "keep_rollout_steps", "debug_grad_flow", "debug_train_diagnostics_interval")),
    ("validation", "ODE sampling of fixed prompts during training, scored by the reward and held-out metrics", (
        "validation_interval", "validate_at_step0", "validation_prompts", "valid_video_csv", "validation_global_seed",
        "validation_num_inference_steps", "validation_timestep_shift", "validation_fixed_size",
        "validate_video_length", "validation_metrics", "validate_ema")),
    ("drift guard", "the drift proxy against the base model and the sentinel that warns, stops or rolls back", (
        "drift_proxy", "drift_proxy_sigmas", "drift_guard", "drift_guard_proxy_ratio", "drift_guard_window",
        "drift_guard_heldout", "drift_guard_reward_rise", "drift_guard_heldout_fall")),
    ("reference flags without effect", "accepted so the reference's launch lines run; setting one warns", (
        "train_timestep_shift", "flow_snr_type", "i2v_prob", "num_workers", "prefetch_factor")),
)

GENERATE_GROUPS: FlagGroups = (
    ("prompts", "what to render", (
        "prompt", "valid_video_csv", "image_path", "negative_prompt", "seed")),
    ("model", "the checkpoint root, the transformer version and the trained weights", (
        "model_path", "resolution", "cfg_distilled", "model_version", "checkpoint_path", "lora_path", "dtype",
        "attention_backend", "device", "text_max_length", "byt5_max_length", "vision_num_semantic_tokens")),
    ("sampling", "the ODE sampler and the video size", (
        "num_inference_steps", "video_length", "aspect_ratio", "fixed_size", "guidance_scale", "flow_shift")),
    ("output", "where the videos go", (
        "output_path", "save_generation_config")),
    ("speed and memory", "offloading, compilation, attention kernels and the feature cache (CUDA)", (
        "offloading", "group_offloading", "overlap_group_offloading", "enable_torch_compile", "use_sageattn",
        "sage_blocks_range", "enable_cache", "cache_type", "no_cache_block_id", "cache_start_step", "cache_end_step",
        "total_steps", "cache_step_interval")),
    ("reference flags without effect", "features of the reference's inference stack that are not reimplemented", (
        "sr", "save_pre_sr_video", "rewrite", "enable_step_distill", "sparse_attn")),
)

EVALUATE_GROUPS: FlagGroups = (
    ("what to evaluate", "checkpoints, prompts, seeds, metrics and the output folder", (
        "checkpoints", "prompts", "seeds", "metrics", "reward_weights", "output")),
    ("scorer models", "where the scorers' weights are", (
        "model_path", "clip_model", "pickscore_model", "pickscore_processor")),
    ("sampling", "generate.py's settings, the same for every checkpoint", (
        "num_inference_steps", "resolution", "model_version", "video_length", "aspect_ratio", "fixed_size",
        "guidance_scale", "flow_shift", "negative_prompt", "text_max_length", "byt5_max_length",
        "vision_num_semantic_tokens", "dtype", "attention_backend", "offloading", "device")),
    ("pictures", "the side-by-side frames", (
        "picture_frames", "picture_height")),
)

REWARD_SERVER_GROUPS: FlagGroups = (
    ("reward", "the reward served (the trainer's reward flags)", (
        "reward_model", "reward_kwargs", "pretrained_model_root", "reward_checkpoint_mode", "dtype", "device",
        "video_fps", "reward_batch_size", "reward_from_mp4", "videoalign_fps", "videoalign_num_frames",
        "videoalign_max_pixels")),
    ("server", "where it listens, who may call it and how much a request may carry", (
        "host", "port", "auth_token_file", "max_request_mb", "max_videos_per_request", "max_buffered_mb",
        "max_connections", "header_timeout_s", "idle_timeout_s", "request_timeout_s")),
)

# Each command's config class (module.QualifiedName) -> its groups. A config class not named here keeps one flat
# list of flags (the test's scan of sage_grpo/ for config classes fails on it).
FLAG_GROUPS: Dict[str, FlagGroups] = {
    "sage_grpo.config.train.TrainConfig": TRAIN_GROUPS,
    "sage_grpo.config.generate.GenerateConfig": GENERATE_GROUPS,
    "sage_grpo.evaluate.config.EvaluateConfig": EVALUATE_GROUPS,
    "sage_grpo.config.reward_server.RewardServerConfig": REWARD_SERVER_GROUPS,
}


def class_key(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def grouped_fields(cls: type) -> List[Tuple[str, str, List[Any]]]:
    """``cls``'s fields as ``(title, description, fields)`` in ``--help`` order; fields its table does not place come
    last under :data:`UNGROUPED`. A class without a table: one untitled group (``title`` None) of every field."""
    fields = {field.name: field for field in dataclasses.fields(cls)}
    table = FLAG_GROUPS.get(class_key(cls))
    if table is None:
        return [(None, None, list(fields.values()))]
    groups, placed = [], set()
    for title, description, names in table:
        members = [fields[name] for name in names if name in fields and name not in placed]
        placed.update(field.name for field in members)
        groups.append((title, description, members))
    rest = [field for name, field in fields.items() if name not in placed]
    if rest:
        groups.append((UNGROUPED, UNGROUPED_TEXT, rest))
    return groups
