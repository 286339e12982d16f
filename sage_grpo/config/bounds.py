"""The range of every number a command takes, one table per config: each ``int`` and ``float`` option (lists and
optional ones included) of ``post_train.py``, ``generate.py`` and ``python -m sage_grpo.evaluate`` has an entry.

An entry is a :class:`Bound`, checked by :func:`sage_grpo.config.validation.check_bounds` before anything loads (a
value outside it is one ``ConfigError`` line: ``[rule] --flag value must be > 0 ... Fix: ...``), or a sentence saying
why the table holds no bound for it (a rule between several options, checked by its own function of
``validation.py``; an option without effect; any integer meaning something). A test fails on a numeric option with
no entry, so a new one cannot go unchecked by oversight. ``nan`` and ``inf`` are refused before the bounds, for every
float option (:func:`~sage_grpo.config.validation.check_finite_options`).
"""

from dataclasses import dataclass
from typing import Dict, Optional, Union

MAX_TOKENS = 1 << 16  # no stream of HunyuanVideo-1.5 is near it (1000, 256, 729); a larger one is a typo or a bomb


@dataclass(frozen=True)
class Bound:
    """``low <= value <= high`` (``<`` where open; None: unbounded on that side). ``rule`` names the rule in the
    message (default ``<option>-positive``, ``-nonnegative`` or ``-range``), ``why`` follows the range, ``fix`` is the
    valid alternative offered (default: the option's default)."""

    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    high_open: bool = False
    rule: Optional[str] = None
    why: str = ""
    fix: Optional[str] = None

    def holds(self, value: float) -> bool:
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below  # False for nan, which no comparison passes

    def text(self) -> str:
        """The range as the message says it: ``> 0``, ``>= 1``, ``in [0, 1)``."""
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"

    def rule_for(self, name: str) -> str:
        if self.rule:
            return self.rule
        if self.high is None and self.low == 0:
            return f"{name}-{'positive' if self.low_open else 'nonnegative'}"
        return f"{name}-positive" if self.high is None and self.low == 1 else f"{name}-range"


Entry = Union[Bound, str]
POSITIVE = Bound(0, low_open=True)  # a float that must be > 0
AT_LEAST_1 = Bound(1)  # a count: an integer >= 1
NON_NEGATIVE = Bound(0)
TOKENS = Bound(1, MAX_TOKENS, fix="see --help for the default")
UNIT_OPEN_HIGH = Bound(0, 1, high_open=True)  # [0, 1)
SEED = "check_seeds: an integer in [0, 2**63)"
NO_EFFECT = "no effect (accepted for compatibility with the reference)"

TRAIN_BOUNDS: Dict[str, Entry] = {
    "learning_rate": POSITIVE, "weight_decay": NON_NEGATIVE, "max_steps": AT_LEAST_1, "warmup_steps": NON_NEGATIVE,
    "gradient_accumulation_steps": AT_LEAST_1, "max_grad_norm": POSITIVE, "train_timestep_shift": NO_EFFECT,
    "batch_size": AT_LEAST_1, "num_workers": NO_EFFECT, "prefetch_factor": NO_EFFECT,
    "num_generations": Bound(2, rule="group-size", why=": GRPO needs groups of at least 2 videos of a prompt (a group "
                             "of one has advantage 0 for every sample: nothing is learnt)",
                             fix="use --num_generations 4 (the reference's)"),
    "remote_reward_retries": NON_NEGATIVE, "remote_reward_timeout": POSITIVE,
    # the reward plan (rewards/videoalign_inputs.py) adds the checkpoint's own minimums before any model loads
    "videoalign_fps": POSITIVE, "videoalign_num_frames": AT_LEAST_1, "videoalign_max_pixels": AT_LEAST_1,
    **{name: Bound(0, rule="kl-nonnegative", fix="use --kl_weight 0 to disable the KL terms")
       for name in ("kl_weight", "kl_coef", "kl_min_coef")},
    "update_ref_model_step": "the anchor-interval rule: >= 1 with --use_moving_KL (unused without it)",
    "dual_kl_moving_weight": NON_NEGATIVE, "dual_kl_step_weight": NON_NEGATIVE,
    "debug_train_diagnostics_interval": AT_LEAST_1, "save_interval": AT_LEAST_1, "log_interval": AT_LEAST_1,
    "seed": SEED, "validation_global_seed": SEED, "i2v_prob": NO_EFFECT,
    "validation_interval": Bound(0, fix="use 0 to validate never, or a number of steps"),
    "validation_timestep_shift": "the validation-shift-positive rule: > 0 when validation runs",
    "validate_video_length": AT_LEAST_1,  # and 1 + a multiple of the VAE's temporal ratio (models/geometry.py)
    "drift_proxy_sigmas": "the drift-proxy-sigmas rule: each in (0, 1) when the drift proxy or guard is on",
    "drift_guard_proxy_ratio": "the drift-guard-bounds rule: > 1 when the drift proxy or guard is on",
    "drift_guard_window": "the drift-guard-bounds rule: >= 2 when the drift proxy or guard is on",
    "drift_guard_reward_rise": NON_NEGATIVE,
    "drift_guard_heldout_fall": "the drift-guard-bounds rule: >= 0 when the drift proxy or guard is on",
    "lora_r": AT_LEAST_1, "lora_alpha": AT_LEAST_1,
    "lora_dropout": Bound(0, 1, high_open=True, rule="lora-dropout", fix="use 0.0"),
    "sp_size": AT_LEAST_1, "dp_replicate": AT_LEAST_1,
    "reference_batch_size": Bound(0, rule="reference-batch", fix="use 0 (auto)"),
    "replay_group_size": "the replay-group rule: in [0, the trained steps per sample]",
    "image_cache_gb": NON_NEGATIVE, "gpu_memory_gb": POSITIVE,
    "grpo_sampling_steps": Bound(1, rule="sampling-steps", fix="use 20"),
    "sample_n_frames": AT_LEAST_1,  # and 1 + a multiple of the VAE's temporal ratio (models/geometry.py)
    "eta": Bound(0, low_open=True, rule="eta-positive", why=" (0 is a zero-noise SDE with no log-probability)",
                 fix="use --eta 0.5 (the reference's value)"),
    "cfg_scale": POSITIVE, "infer_flow_shift_video": POSITIVE,
    "video_bucket_hw_base_size": "its choices (the resolution buckets)",
    "rollout_height": AT_LEAST_1, "rollout_width": AT_LEAST_1,  # and multiples of the VAE's and patch's sizes
    "mini_batch_size_per_update": AT_LEAST_1, "clip_range": POSITIVE, "adv_clip_max": POSITIVE,
    "timestep_fraction": Bound(0, 1, low_open=True, rule="timestep-fraction", fix="use 1.0"),
    "num_inner_epochs": Bound(1, rule="inner-epochs", fix="use 1 (the reference)"),
    "sde_window_size": "the sde-window rule: in [0, --grpo_sampling_steps]",
    "sde_window_stride": "the sde-window rule: >= 0",
    "video_fps": AT_LEAST_1, "validation_num_inference_steps": AT_LEAST_1,
    "ema_decay": Bound(0, 1, high_open=True, rule="ema-decay", fix="use 0.999, or 0 for no EMA"),
    "lr_num_cycles": Bound(1, rule="lr-schedule-shape", fix="use --lr_num_cycles 1"),
    "lr_power": Bound(0, low_open=True, rule="lr-schedule-shape", fix="use --lr_power 1.0"),
    "text_max_length": TOKENS, "byt5_max_length": TOKENS, "vision_num_semantic_tokens": TOKENS,
    "reward_batch_size": AT_LEAST_1,
    "keep_rollout_steps": "any integer (<= 0 keeps all)", "keep_checkpoints": "any integer (<= 0 keeps all)",
    "collective_timeout_minutes": POSITIVE, "max_failed_reward_steps": NON_NEGATIVE,
    "cpu_threads": Bound(0, fix="use 0 (OMP_NUM_THREADS, else 1)"),
}

# generate.py's and the evaluation's sampling options (the evaluation hands them to generate.py unchanged)
SAMPLING_BOUNDS: Dict[str, Entry] = {
    "num_inference_steps": AT_LEAST_1,
    "video_length": AT_LEAST_1,  # and 1 + a multiple of the VAE's temporal ratio (pipeline/generation.py)
    "guidance_scale": POSITIVE, "flow_shift": POSITIVE,
    "text_max_length": TOKENS, "byt5_max_length": TOKENS, "vision_num_semantic_tokens": TOKENS,
}
GENERATE_BOUNDS: Dict[str, Entry] = {
    **SAMPLING_BOUNDS, "seed": SEED,
    "cache_start_step": NON_NEGATIVE, "cache_end_step": NON_NEGATIVE,  # and start < end, with --enable_cache
    "total_steps": "no effect (the TaylorSeer cache counts steps itself)", "cache_step_interval": AT_LEAST_1,
}
EVALUATE_BOUNDS: Dict[str, Entry] = {
    **SAMPLING_BOUNDS, "seeds": SEED, "picture_frames": AT_LEAST_1, "picture_height": Bound(8, fix="use 128"),
}
