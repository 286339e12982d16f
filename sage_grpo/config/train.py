"""``TrainConfig``: every option of ``post_train.py``, declared once.

Field names, types and defaults follow the reference's *effective* behaviour (its argparse defaults, which win over its
dataclass defaults; reference_spec §1.1-§1.2). Options the reference does not expose as flags but that we make
configurable (rollout size, sampler settings, logging retention, ...) are grouped after the reference flags. Options
the reference accepts but ignores are accepted with a warning (``no_effect``).
"""

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from sage_grpo.config.schema import config_field

# The one list of SDE names (``--sde_type`` choices of the reference); sde/registry.py maps each to its kernel. It
# lives here, below sde, so that the config needs no torch.
SDE_TYPES = ("sage_grpo", "dance_grpo", "flow_grpo", "cps")
# The reference's 16:9 resolution buckets (spec §2.4): bucket base size -> (height, width). The one bucket table:
# rollouts (--video_bucket_hw_base_size) and generate.py's --resolution both read it.
RESOLUTION_BUCKETS = {256: (192, 336), 480: (352, 624), 640: (480, 864), 720: (544, 960), 960: (720, 1280),
                      1440: (1080, 1920)}
# Backends of diffusers' attention dispatcher offered by --attention_backend (AttentionBackendName values; see
# sage_grpo/models/attention.py).
ATTENTION_BACKENDS = ("native", "_native_math", "_native_efficient", "_native_flash", "_native_cudnn", "flash",
                      "flash_varlen", "_flash_3", "_flash_varlen_3", "sage", "sage_varlen", "xformers", "flex")
# --mixed_length_attention: how rows of different valid text lengths (the CFG pair) attend (models/attention.py)
MIXED_LENGTH_ATTENTION = ("auto", "mask", "split")
DEFAULT_REWARD_WEIGHTS = '{"VQ":0.5,"MQ":0.5,"TA":1.0}'
DRIFT_GUARD_ACTIONS = ("off", "warn", "stop", "rollback")  # --drift_guard (sage_grpo/rl/drift_guard.py)
# The CLIPScore and PickScore checkpoints (hub names, found as <model root>/<name after its last '/'>): the trainer's
# flags and the evaluation's read them here (sage_grpo/rewards/clip_score.py, pick_score.py).
DEFAULT_CLIP_MODEL = "openai/clip-vit-large-patch14"
PICKSCORE_MODEL = "yuvalkirstain/PickScore_v1"
PICKSCORE_PROCESSOR = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"


@dataclass
class TrainConfig:
    # ---------------------------------------------------------------- model
    pretrained_model_root: str = config_field("ckpts", "Root of the checkpoint tree (see ckpts/README.md)")
    pretrained_transformer_version: str = config_field(
        "480p_t2v", "Transformer subfolder under <root>/transformer/ (480p_t2v, 720p_t2v, 480p_t2v_distilled, ...)",
        aliases=("model_version",))
    post_train_type: str = config_field(
        "grpo", "Post-training algorithm; only grpo is implemented (the reference's 'standard' crashes)",
        choices=("grpo", "standard"))
    dtype: str = config_field("bf16", "Dtype the transformer is loaded in", choices=("bf16", "fp32"))
    master_weight_type: str = config_field(
        "fp32", "Dtype of the trained (FSDP) parameters; gradients are reduced in fp32", choices=("fp32", "bf16"))
    # ---------------------------------------------------------------- optimisation
    learning_rate: float = config_field(1e-5, "Optimizer learning rate")
    weight_decay: float = config_field(0.01, "Decoupled weight decay (Muon and AdamW)")
    max_steps: int = config_field(10000, "Outer steps (rollout batches); one optimizer update each by default")
    warmup_steps: int = config_field(
        500, "Linear warm-up updates of every --lr_scheduler but constant (the reference's constant schedule ignores "
        "it)")
    gradient_accumulation_steps: int = config_field(
        1, "Rollout batches per optimizer update (the reference multiplies by steps x batch size internally)")
    max_grad_norm: float = config_field(1.0, "Gradient-norm clip at each update")
    use_muon: bool = config_field(True, "Muon for matrix parameters (AdamW for the rest); false: AdamW everywhere")
    train_timestep_shift: float = config_field(3.0, "SFT leftover", no_effect="unused by GRPO in the reference too")
    flow_snr_type: str = config_field(
        "lognorm", "SFT leftover", choices=("uniform", "lognorm", "mix", "mode"),
        no_effect="unused by GRPO in the reference too")
    # ---------------------------------------------------------------- data
    batch_size: int = config_field(2, "Prompts (rollout videos) per data-parallel rank per step")
    num_workers: int = config_field(4, "DataLoader workers", no_effect="prompt CSVs are read in-process")
    prefetch_factor: int = config_field(2, "DataLoader prefetch", no_effect="prompt CSVs are read in-process")
    num_generations: int = config_field(4, "GRPO group size G: videos per prompt, across all ranks")
    train_video_csv: Optional[List[str]] = config_field(
        None, "Prompt CSV file(s) with a 'prompt' column (optional index, seed, ref_image_path); "
        "default assets/demo_train.csv", nargs="+")
    # ---------------------------------------------------------------- reward
    reward_model: str = config_field(
        "videoalign_local", "Reward model: videoalign_local, a built-in toy reward, or a dotted path "
        "'package.module:callable'")
    reward_weights: str = config_field(
        DEFAULT_REWARD_WEIGHTS, "JSON weights of the sub-rewards, avg = sum w_m * m; '' or '{}': the reward's fallback "
        "weights (VideoAlign: VQ = MQ = TA = 1, as the reference)")
    reward_kwargs: str = config_field(
        "{}", "JSON constructor arguments of the reward model, e.g. '{\"target_rgb\": [0, 0, 1]}' for target_color")
    reward_checkpoint_mode: str = config_field(
        "v3", "Key-remapping mode for the VideoReward state dict", choices=("v1", "v2", "v3"))
    remote_reward_url: Optional[str] = config_field(
        None, "Score --reward_model on a reward server (scripts/reward_server.py), e.g. http://host:8765; unset: "
        "locally")
    # (our own reward options, docs/configuration.md "Reward options")
    remote_reward_retries: int = config_field(
        3, "Retries of a remote reward request after a connection error, timeout or 5xx (backoff 0.5 s, doubling); "
        "then its samples score NaN")
    remote_reward_timeout: float = config_field(600.0, "Seconds one remote reward request may take")
    reward_aggregation: str = config_field(
        "sum", "sum: group advantages of the weighted reward sum avg (the reference); advantage: the weighted sum "
        "of each weighted reward's own group advantages (DanceGRPO)", choices=("sum", "advantage"))
    extra_rewards: Optional[Dict[str, Any]] = config_field(
        None, "Further reward models summed into avg with --reward_model: name=weight words (a bare name: 1.0), or a "
        "mapping name -> weight or -> {weight, sub_reward, kwargs} (YAML, or JSON on the command line), e.g. "
        "--extra_rewards clipscore=0.5 pickscore=0.01; naming --reward_model sets its weight (default 1.0)")
    clip_model: str = config_field(
        DEFAULT_CLIP_MODEL, "CLIPScore's model (training on clipscore, or --validation_metrics clipscore): a local "
        "CLIP folder, or a hub name found as <pretrained_model_root>/<name after its last '/'>")
    pickscore_model: str = config_field(PICKSCORE_MODEL, "PickScore's model (folder, or <root>/<name>)")
    pickscore_processor: str = config_field(PICKSCORE_PROCESSOR, "PickScore's processor (folder, or <root>/<name>)")
    videoalign_fps: Optional[float] = config_field(
        None, "Frames per second of video VideoAlign sees (default: the checkpoint's data_config.fps)")
    videoalign_num_frames: Optional[int] = config_field(
        None, "Fixed frame count VideoAlign sees instead of a rate; excludes --videoalign_fps (default: the "
        "checkpoint's data_config)")
    videoalign_max_pixels: Optional[int] = config_field(
        None, "Pixel budget (H x W) of each frame VideoAlign sees (default: the checkpoint's "
        "data_config.max_frame_pixels)")
    # ---------------------------------------------------------------- KL / trust region
    kl_weight: float = config_field(1e-5, "KL switch (>0 loads a reference model) and the controller's target/max beta")
    kl_coef: float = config_field(
        1e-7, "Adaptive KL coefficient beta of the first inner iteration (the warm-up then starts from --kl_min_coef); "
        "0 with --kl_min_coef 0: beta stays 0, no KL term and no reference model (the reference's KL runs only while "
        "beta > 0)")
    kl_min_coef: float = config_field(
        1e-7, "Lower bound of the adaptive KL coefficient and start of its warm-up; 0 means --kl_coef (the "
        "reference's 'kl_min_coef or kl_coef')")
    use_moving_KL: bool = config_field(True, "Moving anchor: copy the policy into the reference periodically")
    update_ref_model_step: int = config_field(10, "Anchor refresh interval, in optimizer updates")
    use_dual_kl: bool = config_field(
        True, "Add the step-wise (velocity) KL term, log pi_prev - log pi_theta (--stepwise_kl_reference)")
    dual_kl_moving_weight: float = config_field(1.0, "Weight of the mean-matching (position) KL term")
    dual_kl_step_weight: float = config_field(0.1, "Weight of the step-wise (velocity) KL term")
    # ---------------------------------------------------------------- sampler / GRPO
    sde_type: str = config_field("sage_grpo", "SDE used for rollouts and log-probs", choices=SDE_TYPES)
    use_grad_balancing: bool = config_field(True, "Gradient-norm equalizer across timesteps")
    enable_timestep_permutation: bool = config_field(True, "Per-sample random order of the trained steps")
    debug_grad_flow: bool = config_field(False, "Log gradient and parameter-change diagnostics")
    debug_train_diagnostics_interval: int = config_field(1, "Diagnostics every N updates (with --debug_grad_flow)")
    # ---------------------------------------------------------------- output / logging
    output_dir: str = config_field("./outputs", "Run directory (logs, TensorBoard, samples, checkpoints)")
    save_interval: int = config_field(100, "Checkpoint every N steps (and always at the end)")
    log_interval: int = config_field(1, "Console metrics line every N steps")
    quiet: bool = config_field(False, "No progress bars (they are also off when stderr is not a terminal)")
    seed: int = config_field(42, "Base seed: data order, shuffles and per-rank RNG (seed + dp_rank)")
    # ---------------------------------------------------------------- validation
    validation_global_seed: int = config_field(930, "Seed of validation videos without a CSV seed")
    i2v_prob: float = config_field(0.3, "SFT leftover", no_effect="unused by GRPO in the reference too")
    validation_interval: int = config_field(100, "Validate every N steps (0 disables)")
    validate_at_step0: bool = config_field(False, "Validate before the first step")
    validation_prompts: Optional[List[str]] = config_field(
        None, "Validation prompts, used when --valid_video_csv gives none", nargs="+")
    valid_video_csv: Optional[List[str]] = config_field(
        None, "Validation CSV file(s) with 'prompt' and optional 'seed'", nargs="+")
    validation_timestep_shift: Optional[float] = config_field(
        None, "Flow shift of the validation (ODE) sampler; default: the version's scheduler config, else the "
        "reference's for the version (480p_t2v 5.0, 720p_t2v 9.0)")
    validation_fixed_size: str = config_field("480x864", "Validation HxW ('HxW' or 'H*W'; 'none': rollout size)")
    validate_video_length: int = config_field(
        81, "Validation frame count", aliases=("validation_video_length", "video_length"))
    # (our own additions, docs/toy_study.md "Drift proxy": how far the samples left the base model's manifold)
    drift_proxy: bool = config_field(
        False, "At every validation (and at step 0), the frozen base model's denoising error of the validation "
        "videos: Validation/drift_proxy and drift_proxy_ratio (over step 0). The base model is free with LoRA "
        "(adapters off) and a fixed KL anchor, a frozen copy of the transformer otherwise")
    drift_proxy_sigmas: List[float] = config_field(
        [0.5, 0.75, 0.9], "Noise levels sigma in (0, 1) of the drift proxy's denoising error (one unguided base "
        "forward each per validation video)", nargs="+")
    drift_guard: str = config_field(
        "off", "Drift sentinel at every validation (turns --drift_proxy on): warn (log, console, trackers), stop "
        "(checkpoint, then exit naming the bound crossed), rollback (to the newest checkpoint of a validation point "
        "that crossed no bound; stop when it is rolled back to twice); off", choices=DRIFT_GUARD_ACTIONS)
    drift_guard_proxy_ratio: float = config_field(
        4.0, "Drift guard bound: the drift proxy over its step-0 value (the base model's own samples)")
    drift_guard_window: int = config_field(
        3, "Drift guard: the validation points over which the training reward and the held-out metrics are compared")
    drift_guard_heldout: Optional[List[str]] = config_field(
        None, "Drift guard: the held-out validation metrics (keys --validation_metrics logs, higher is better: "
        "clipscore, pickscore, Overall, ...) whose fall while the training reward rises is an alarm; unset: none",
        nargs="+")
    drift_guard_reward_rise: float = config_field(
        0.0, "Drift guard bound: a training-reward rise over the window above this, while a held-out metric falls, "
        "is an alarm")
    drift_guard_heldout_fall: float = config_field(
        0.05, "Drift guard bound: a --drift_guard_heldout metric falling over the window by more than this fraction "
        "of its first value, while the training reward rises, is an alarm")
    # ---------------------------------------------------------------- parallelism / memory
    use_lora: bool = config_field(False, "Train LoRA adapters instead of all weights")
    lora_r: int = config_field(8, "LoRA rank")
    lora_alpha: int = config_field(16, "LoRA alpha")
    lora_dropout: float = config_field(0.0, "LoRA dropout")
    lora_target_modules: Optional[List[str]] = config_field(
        None, "LoRA target modules (default all-linear)", nargs="+")
    pretrained_lora_path: Optional[str] = config_field(None, "Load this adapter instead of creating one")
    enable_fsdp: bool = config_field(True, "FSDP2 sharding when world size > 1")
    enable_gradient_checkpointing: bool = config_field(True, "Activation checkpointing of transformer blocks")
    sp_size: int = config_field(8, "Ulysses sequence-parallel degree")
    dp_replicate: int = config_field(1, "HSDP replicate degree of the FSDP mesh")
    reference_mode_offload: bool = config_field(False, "Keep the reference model on CPU between its passes")
    # ---------------------------------------------------------------- memory placement (sage_grpo.plan decides "auto")
    gradient_reduction: str = config_field(
        "auto", "FSDP gradient reduction during accumulation: per_update (one reduce-scatter per optimizer update, "
        "unsharded fp32 gradients held between backwards), per_backward (a reduce-scatter after every backward, "
        "sharded gradients only, as the reference); auto: per_update when the memory plan fits with held gradients, "
        "else per_backward", choices=("auto", "per_update", "per_backward"))
    reference_placement: str = config_field(
        "auto", "Where the frozen KL reference's FSDP shards live: device (GPU memory, no transfers), cpu (offloaded, "
        "copied to the GPU for every pass); auto: cpu only with --reference_mode_offload when the memory plan says "
        "the device shards do not fit", choices=("auto", "device", "cpu"))
    reference_batch_size: int = config_field(
        0, "Transitions per no-grad forward of the KL reference means (an addition); 0: auto, "
        "--mini_batch_size_per_update on a CPU device (the reference's arithmetic: another batch size changes the "
        "means in the last bits), on CUDA the largest the memory plan fits, up to all of a rollout batch's")
    replay_group_size: int = config_field(
        0, "Trained steps of a sample per policy forward and backward (grouped replay, an addition): the same mean "
        "over (sample, step) pairs and the same per-iteration beta, within float order; 1: one per forward (the "
        "reference); 0: auto, 1 on a CPU device (its runs are pinned bit for bit) or with --lora_dropout > 0 (the "
        "dropout draws would differ), on CUDA the largest the memory plan fits")
    async_reward: str = config_field(
        "auto", "Score the rewards in a background worker while the reference means run, collected before the "
        "advantages (the same rewards and failures): true, false, or auto (a remote reward: true; a local one: on "
        "CUDA when the memory plan fits its forward beside the reference pass, false on a CPU device, whose cores "
        "the trainer's threads use)", choices=("auto", "true", "false"))
    offload_text_encoders: bool = config_field(
        True, "Keep the text encoders on the CPU and move them to the GPU only to encode prompts not cached yet")
    image_cache_gb: float = config_field(
        4.0, "Host memory for the image-to-video conditions encoded so far (VAE latent and SigLIP states of each "
        "distinct reference image and size, about 1.8 MB each in bf16); the least recently used are dropped and "
        "re-encoded when needed again; 0: no cache")
    vae_tiling: str = config_field(
        "auto", "Tiled VAE decoding: true, false, or auto (tiled when a decoded video exceeds 33x480x854 pixels)",
        choices=("auto", "true", "false"))
    gpu_memory_gb: Optional[float] = config_field(
        None, "GPU memory per device for the memory plan (default: the device's own; 80 when no GPU is visible)")
    fsdp_param_dtype: str = config_field(
        "auto", "Dtype FSDP2 all-gathers the trained weights in for compute (master weights and gradient reduction "
        "stay --master_weight_type/fp32); auto: --dtype (bf16 at the reference launch: no autocast copies of fp32 "
        "weights); fp32: the reference's fp32 gathers under autocast", choices=("auto", "fp32", "bf16"))
    attention_backend: str = config_field(
        "native", "diffusers attention backend of the transformer (native = torch SDPA; flash, flash_varlen, sage, "
        "... where installed); the text padding is trimmed and no dense mask is built", choices=ATTENTION_BACKENDS)
    mixed_length_attention: str = config_field(
        "auto", "Attention of rows whose valid text lengths differ (the CFG pair, prompts of a micro-batch): mask (one "
        "call with a key-padding mask), split (one mask-free call per run of rows of equal length, the same outputs "
        "within float order; SDPA can take its flash kernel); auto: split on CUDA, mask elsewhere (the CPU runs are "
        "pinned bit for bit)", choices=MIXED_LENGTH_ATTENTION)
    ignore_memory_plan: bool = config_field(
        False, "Start even when the memory plan (python -m sage_grpo.plan) says the launch does not fit")
    resume_from_checkpoint: Optional[str] = config_field(
        None, "checkpoint-N directory to resume from; 'latest': the newest in --output_dir; 'auto': the newest if "
        "there is one, else a fresh start (for torchrun --max-restarts N: a restarted group resumes by itself)")

    # ================================================================ beyond the reference's flags
    # (reference TrainingConfig fields without a flag, spec §1.2, plus our own additions)
    grpo_sampling_steps: int = config_field(20, "Rollout denoising steps; every one is an SDE step and a trained step")
    sample_n_frames: int = config_field(81, "Frames per rollout video")
    eta: float = config_field(0.5, "SDE noise level eta")
    cfg_scale: float = config_field(
        6.0, "Classifier-free guidance scale s in rollouts, training and validation; s <= 1: no guidance (conditional "
        "velocity). Unset: the version's guider config (cfg-distilled: 1.0) when the model root has one, else 6.0")
    neg_prompt: str = config_field("", "Negative prompt for CFG")
    infer_flow_shift_video: float = config_field(5.0, "Flow shift of the rollout sigma schedule")
    video_bucket_hw_base_size: int = config_field(
        480, "Rollout resolution bucket", choices=tuple(RESOLUTION_BUCKETS))
    rollout_height: Optional[int] = config_field(None, "Rollout height override (default: from the bucket)")
    rollout_width: Optional[int] = config_field(None, "Rollout width override (default: from the bucket)")
    mini_batch_size_per_update: int = config_field(1, "Samples per transformer call in rollout, reference and training")
    clip_range: float = config_field(1e-4, "PPO ratio clip epsilon")
    adv_clip_max: float = config_field(5.0, "Advantage clip |A| <= adv_clip_max")
    timestep_fraction: float = config_field(1.0, "Fraction of the denoising steps trained per sample")
    # (our own additions, docs/differences.md: learning per rollout)
    num_inner_epochs: int = config_field(
        1, "Optimizer passes over each rollout batch, each with fresh shuffles and its own update(s), so the PPO "
        "ratio, clip and step-wise KL act (1: the reference)")
    sde_window_size: int = config_field(
        0, "Train only a window of this many consecutive denoising steps (SDE steps; ODE steps elsewhere, not "
        "trained); 0: off, every step SDE and trained (the reference)")
    sde_window_stride: int = config_field(
        1, "Optimizer updates between two one-step moves of the --sde_window_size window (wrapping to step 0 after "
        "the last position); 0: the window stays on the first steps")
    sde_window_equalizer: str = config_field(
        "full", "Equalizer scales inside an --sde_window_size window: full (the whole schedule's, median(g) / g_k, as "
        "without a window) or window (renormalised over the window's steps: median over the window / g_k)",
        choices=("full", "window"))
    stepwise_kl_reference: str = config_field(
        "previous_step", "The policy the step-wise KL is measured against (it matters with --num_inner_epochs > 1): "
        "previous_step (the paper's pi_{theta_{k-1}}: the policy before this optimizer update, i.e. the current "
        "weights; 0 in value, its gradient -grad log pi) or rollout (the policy that drew the rollout: the drift of "
        "the inner epochs so far)", choices=("previous_step", "rollout"))
    max_grad_norm_units: str = config_field(
        "reference", "What --max_grad_norm is compared with: reference (the reference's gradient norm, which under "
        "--sp_size sp is 1/sp of the full gradient's, so the full gradient is clipped at max_grad_norm x sp: the "
        "reference's launch flags clip where the reference does at every SP degree) or full (the full gradient's "
        "norm: the same clip at every SP degree)", choices=("reference", "full"))
    use_same_noise: bool = config_field(False, "All members of a group start from the same initial noise")
    video_fps: int = config_field(24, "Frame rate of saved videos and of reward frame sampling")
    validation_num_inference_steps: int = config_field(40, "Validation denoising steps")
    ema_decay: float = config_field(
        0.0, "Exponential moving average of the trained weights, theta_ema <- d theta_ema + (1 - d) theta after every "
        "optimizer update (0: off); fp32, sharded like the weights, checkpointed in checkpoint-N/ema/ (generate.py, "
        "the export and the evaluation take --checkpoint_path checkpoint-N/ema)")
    validate_ema: bool = config_field(False, "Validate (sample and score) the EMA weights instead of the policy's")
    validation_metrics: Optional[List[str]] = config_field(
        None, "Held-out metrics scoring the validation videos besides the training reward (logged as Validation/...): "
        "videoalign, clipscore, pickscore or any reward name, comma- or space-separated; each loads on the main "
        "process only, and only when given", nargs="+")
    lr_scheduler: str = config_field(
        "constant", "Learning-rate schedule, diffusers' get_scheduler (constant as the reference; the others use "
        "--warmup_steps; linear, cosine, cosine_with_restarts and polynomial decay over the run's optimizer updates, "
        "max_steps / gradient_accumulation_steps)",
        choices=("constant", "constant_with_warmup", "linear", "cosine", "cosine_with_restarts", "polynomial"))
    lr_num_cycles: int = config_field(1, "Cycles of --lr_scheduler cosine_with_restarts")
    lr_power: float = config_field(1.0, "Power of --lr_scheduler polynomial")
    text_max_length: Optional[int] = config_field(
        None, "Override of the MLLM text token length (default: the pipeline's 1000; tiny models use short lengths)")
    byt5_max_length: int = config_field(256, "byT5 glyph-stream token length")
    vision_num_semantic_tokens: int = config_field(
        729, "Image-embedding tokens fed to the transformer (zeros for text-to-video)")
    reward_batch_size: int = config_field(4, "Videos per reward-model forward")
    reward_from_mp4: bool = config_field(False, "Score the saved mp4 files (strict reference parity) instead of tensors")
    save_rollout_videos: bool = config_field(True, "Write rollout mp4s and per-group reward JSON under rl_samples/")
    keep_rollout_steps: int = config_field(
        20, "Keep rollout media of only the newest N steps (<= 0 keeps all, as the reference)")
    keep_checkpoints: int = config_field(0, "Keep only the newest N checkpoints (<= 0 keeps all)")
    overwrite_output_dir: bool = config_field(
        False, "Start over in a directory that holds another run, deleting that run's logs, media and checkpoints "
        "(only once the new run's configuration, models and reward have loaded)")
    allow_config_change: bool = config_field(
        False, "Resume even when run-defining settings (sampler, KL, optimizer, LoRA, reward, ...) differ from the "
        "checkpoint's; the differences are logged and recorded in config_changes.yaml")
    collective_timeout_minutes: float = config_field(
        30.0, "Minutes any collective (all-reduce, broadcast, barrier) may wait for the other ranks before the run "
        "stops naming the rank that did not answer (the reference waits 120 minutes)")
    max_failed_reward_steps: int = config_field(
        3, "Stop after this many consecutive steps that trained on nothing: the reward failed on every sample, or "
        "the loss was not finite so the update was skipped (0: never stop)")
    report_to: List[str] = config_field(
        ["tensorboard"], "Experiment trackers: any of tensorboard, wandb, swanlab (several: space- or "
        "comma-separated), or none; metrics.jsonl is always written", nargs="+")
    tracker_project_name: str = config_field("sage-grpo", "Project of the wandb / SwanLab run")
    run_name: Optional[str] = config_field(
        None, "Name of the wandb / SwanLab run (default: the --output_dir folder name)")
    device: Optional[str] = config_field(None, "Device (default: cuda:LOCAL_RANK when available, else cpu)")
    cpu_threads: int = config_field(
        0, "torch threads of a CPU run (post_train.py sets them once at start-up and prints them); 0: "
        "$OMP_NUM_THREADS when set, else 1 (torch's one per core, spinning, ran a toy rollout step 40x slower on a "
        "busy 2-core machine: docs/toy_study.md)")
