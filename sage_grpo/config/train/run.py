"""Sections of ``TrainConfig`` that say what a run keeps and watches: the run directory (logging, checkpoints,
resume), validation, the drift guard, and the reference's flags that have no effect."""

from dataclasses import dataclass
from typing import List, Optional

from sage_grpo.config.bounds import AT_LEAST_1, NON_NEGATIVE, NO_EFFECT, SEED, Bound
from sage_grpo.config.schema import config_field
from sage_grpo.config.sections import section

DRIFT_GUARD_ACTIONS = ("off", "warn", "stop", "rollback")  # --drift_guard (sage_grpo/rl/drift_guard.py)


@section("logging and checkpoints", "the run directory, checkpoints, resuming, trackers and saved rollouts")
@dataclass
class OutputConfig:
    output_dir: str = config_field("./outputs", "Run directory (logs, TensorBoard, samples, checkpoints)")
    overwrite_output_dir: bool = config_field(
        False, "Start over in a directory that holds another run, deleting that run's logs, media and checkpoints "
        "(only once the new run's configuration, models and reward have loaded)")
    save_interval: int = config_field(100, "Checkpoint every N steps (and always at the end)", bound=AT_LEAST_1)
    keep_checkpoints: int = config_field(
        0, "Keep only the newest N checkpoints (<= 0 keeps all)", bound="any integer (<= 0 keeps all)")
    resume_from_checkpoint: Optional[str] = config_field(
        None, "checkpoint-N directory to resume from; 'latest': the newest in --output_dir; 'auto': the newest if "
        "there is one, else a fresh start (for torchrun --max-restarts N: a restarted group resumes by itself)")
    allow_config_change: bool = config_field(
        False, "Resume even when run-defining settings (sampler, KL, optimizer, LoRA, reward, ...) differ from the "
        "checkpoint's; the differences are logged and recorded in config_changes.yaml")
    log_interval: int = config_field(1, "Console metrics line every N steps", bound=AT_LEAST_1)
    quiet: bool = config_field(False, "No progress bars (they are also off when stderr is not a terminal)")
    report_to: List[str] = config_field(
        ["tensorboard"], "Experiment trackers: any of tensorboard, wandb, swanlab (several: space- or "
        "comma-separated), or none; metrics.jsonl is always written", nargs="+")
    tracker_project_name: str = config_field("sage-grpo", "Project of the wandb / SwanLab run")
    run_name: Optional[str] = config_field(
        None, "Name of the wandb / SwanLab run (default: the --output_dir folder name)")
    save_rollout_videos: bool = config_field(True, "Write rollout mp4s and per-group reward JSON under rl_samples/")
    keep_rollout_steps: int = config_field(
        20, "Keep rollout media of only the newest N steps (<= 0 keeps all, as the reference)",
        bound="any integer (<= 0 keeps all)")
    debug_grad_flow: bool = config_field(False, "Log gradient and parameter-change diagnostics")
    debug_train_diagnostics_interval: int = config_field(
        1, "Diagnostics every N updates (with --debug_grad_flow)", bound=AT_LEAST_1)


@section("validation", "ODE sampling of fixed prompts during training, scored by the reward and held-out metrics")
@dataclass
class ValidationConfig:
    validation_interval: int = config_field(
        100, "Validate every N steps (0 disables)", bound=Bound(0, fix="use 0 to validate never, or a number of steps"))
    validate_at_step0: bool = config_field(False, "Validate before the first step")
    validation_prompts: Optional[List[str]] = config_field(
        None, "Validation prompts, used when --valid_video_csv gives none", nargs="+")
    valid_video_csv: Optional[List[str]] = config_field(
        None, "Validation CSV file(s) with 'prompt' and optional 'seed'", nargs="+")
    validation_global_seed: int = config_field(930, "Seed of validation videos without a CSV seed", bound=SEED)
    validation_num_inference_steps: int = config_field(40, "Validation denoising steps", bound=AT_LEAST_1)
    validation_timestep_shift: Optional[float] = config_field(
        None, "Flow shift of the validation (ODE) sampler; default: the version's scheduler config, else the "
        "reference's for the version (480p_t2v 5.0, 720p_t2v 9.0)",
        bound="the validation-shift-positive rule: > 0 when validation runs")
    validation_fixed_size: str = config_field("480x864", "Validation HxW ('HxW' or 'H*W'; 'none': rollout size)")
    validate_video_length: int = config_field(
        81, "Validation frame count", aliases=("validation_video_length", "video_length"), bound=AT_LEAST_1)
    validation_metrics: Optional[List[str]] = config_field(
        None, "Held-out metrics scoring the validation videos besides the training reward (logged as Validation/...): "
        "videoalign, clipscore, pickscore or any reward name, comma- or space-separated; each loads on the main "
        "process only, and only when given", nargs="+")
    validate_ema: bool = config_field(False, "Validate (sample and score) the EMA weights instead of the policy's")


@section("drift guard", "the drift proxy against the base model and the sentinel that warns, stops or rolls back")
@dataclass
class DriftGuardConfig:
    drift_proxy: bool = config_field(
        False, "At every validation (and at step 0), the frozen base model's denoising error of the validation "
        "videos: Validation/drift_proxy and drift_proxy_ratio (over step 0). The base model is free with LoRA "
        "(adapters off) and a fixed KL anchor, a frozen copy of the transformer otherwise")
    drift_proxy_sigmas: List[float] = config_field(
        [0.5, 0.75, 0.9], "Noise levels sigma in (0, 1) of the drift proxy's denoising error (one unguided base "
        "forward each per validation video)", nargs="+",
        bound="the drift-proxy-sigmas rule: each in (0, 1) when the drift proxy or guard is on")
    drift_guard: str = config_field(
        "off", "Drift sentinel at every validation (turns --drift_proxy on): warn (log, console, trackers), stop "
        "(checkpoint, then exit naming the bound crossed), rollback (to the newest checkpoint of a validation point "
        "that raised neither notice nor alarm; stop when it is rolled back to twice); off", choices=DRIFT_GUARD_ACTIONS)
    drift_guard_proxy_ratio: float = config_field(
        8.0, "Drift guard alarm bound: the drift proxy over its step-0 value (the base model's own samples)",
        bound="the drift-guard-bounds rule: > 1 when the drift proxy or guard is on")
    drift_guard_notice_ratio: float = config_field(
        2.0, "Drift guard notice bound (a warning that acts on nothing): the drift proxy over its step-0 value above "
        "this, or growing so that it would pass twice this within two validations; at or above "
        "--drift_guard_proxy_ratio: the trend alone",
        bound="the drift-guard-bounds rule: > 1 when the drift proxy or guard is on")
    drift_guard_window: int = config_field(
        3, "Drift guard: the last validation points whose means the per-dimension check compares with the start",
        bound="the drift-guard-bounds rule: >= 2 when the drift proxy or guard is on")
    drift_guard_heldout: Optional[List[str]] = config_field(
        None, "Drift guard: the dimensions whose fall while the training reward rises is an alarm naming them; unset: "
        "every score of the validation videos (each sub-reward of the training reward, e.g. VideoAlign's VQ, MQ, TA, "
        "and each held-out --validation_metrics key; not avg, not a manifold error); held-out keys (clipscore, "
        "pickscore, Overall, ...): only those; none: no dimension", nargs="+")
    drift_guard_reward_rise: float = config_field(
        0.0, "Drift guard bound: the training reward's rise since the first step (its mean over the window's "
        "validation intervals) above which a fallen dimension is an alarm", bound=NON_NEGATIVE)
    drift_guard_heldout_fall: float = config_field(
        0.05, "Drift guard bound: a watched dimension whose mean over the window fell below its first value by more "
        "than this fraction of it (and by --drift_guard_dimension_fall), while the training reward rose, is an alarm",
        bound="the drift-guard-bounds rule: >= 0 when the drift proxy or guard is on")
    drift_guard_dimension_fall: float = config_field(
        1.0, "Drift guard bound: a watched dimension whose mean over the window fell below its first value by more "
        "than this many times its standard deviation over the first validation's videos (the base model's), and by "
        "--drift_guard_heldout_fall, while the training reward rose, is an alarm",
        bound="the drift-guard-bounds rule: >= 0 when the drift proxy or guard is on")


@section("reference flags without effect", "accepted so the reference's launch lines run; setting one warns")
@dataclass
class CompatConfig:
    train_timestep_shift: float = config_field(
        3.0, "SFT leftover", no_effect="unused by GRPO in the reference too", bound=NO_EFFECT)
    flow_snr_type: str = config_field(
        "lognorm", "SFT leftover", choices=("uniform", "lognorm", "mix", "mode"),
        no_effect="unused by GRPO in the reference too")
    i2v_prob: float = config_field(
        0.3, "SFT leftover", no_effect="unused by GRPO in the reference too", bound=NO_EFFECT)
    num_workers: int = config_field(
        4, "DataLoader workers", no_effect="prompt CSVs are read in-process", bound=NO_EFFECT)
    prefetch_factor: int = config_field(
        2, "DataLoader prefetch", no_effect="prompt CSVs are read in-process", bound=NO_EFFECT)
