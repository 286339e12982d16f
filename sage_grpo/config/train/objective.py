"""Sections of ``TrainConfig`` that say what the policy update optimises: the GRPO update (advantages, the clipped
ratio, the equalizer, the trained steps), the trust region (the moving anchor, the step-wise KL, the adaptive KL
coefficient) and the optimizer."""

from dataclasses import dataclass

from sage_grpo.config.bounds import AT_LEAST_1, KL_COEFFICIENT, NON_NEGATIVE, POSITIVE, Bound
from sage_grpo.config.schema import config_field
from sage_grpo.config.sections import section
from sage_grpo.rl.kl_controllers import KL_CONTROLLER_NAMES  # the KL-controller table's names (torch-free)


@section("GRPO update", "advantages, the clipped ratio, the gradient-norm equalizer and the trained steps")
@dataclass
class UpdateConfig:
    clip_range: float = config_field(1e-4, "PPO ratio clip epsilon", defines_run=True, bound=POSITIVE)
    adv_clip_max: float = config_field(5.0, "Advantage clip |A| <= adv_clip_max", defines_run=True, bound=POSITIVE)
    timestep_fraction: float = config_field(
        1.0, "Fraction of the denoising steps trained per sample", defines_run=True,
        bound=Bound(0, 1, low_open=True, rule="timestep-fraction", fix="use 1.0"))
    use_grad_balancing: bool = config_field(
        True, "Gradient-norm equalizer across timesteps", defines_run=True, on_card=True)
    enable_timestep_permutation: bool = config_field(
        True, "Per-sample random order of the trained steps", defines_run=True)
    num_inner_epochs: int = config_field(
        1, "Optimizer passes over each rollout batch, each with fresh shuffles and its own update(s), so the PPO "
        "ratio, clip and step-wise KL act (1: the reference)", defines_run=True,
        bound=Bound(1, rule="inner-epochs", fix="use 1 (the reference)"))
    sde_window_equalizer: str = config_field(
        "full", "Equalizer scales inside an --sde_window_size window: full (the whole schedule's, median(g) / g_k, as "
        "without a window) or window (renormalised over the window's steps: median over the window / g_k)",
        choices=("full", "window"), defines_run=True)


@section("KL and trust region", "the moving reference anchor, the step-wise KL and the adaptive KL coefficient")
@dataclass
class TrustRegionConfig:
    kl_weight: float = config_field(
        1e-5, "KL switch (>0 loads a reference model) and the controller's target/max beta",
        defines_run=True, on_card=True,
        bound=KL_COEFFICIENT)
    kl_coef: float = config_field(
        1e-7, "Adaptive KL coefficient beta of the first inner iteration (the warm-up then starts from --kl_min_coef); "
        "0 with --kl_min_coef 0: beta stays 0, no KL term and no reference model (the reference's KL runs only while "
        "beta > 0)", defines_run=True,
        bound=KL_COEFFICIENT)
    kl_min_coef: float = config_field(
        1e-7, "Lower bound of the adaptive KL coefficient and start of its warm-up; 0 means --kl_coef (the "
        "reference's 'kl_min_coef or kl_coef')", defines_run=True,
        bound=KL_COEFFICIENT)
    kl_controller: str = config_field(
        "adaptive", "How the KL coefficient beta moves: adaptive (the reference's: a warm-up from --kl_min_coef to "
        "--kl_weight over 100 updates, then x0.9 / x1.1 keeping the KL near --kl_weight) or constant (beta = "
        "--kl_weight at every update; --kl_coef and --kl_min_coef unused)", choices=KL_CONTROLLER_NAMES,
        defines_run=True)
    use_moving_KL: bool = config_field(
        True, "Moving anchor: copy the policy into the reference periodically", defines_run=True, on_card=True)
    update_ref_model_step: int = config_field(
        10, "Anchor refresh interval, in optimizer updates", defines_run=True, on_card=True,
        bound="the anchor-interval rule: >= 1 with --use_moving_KL (unused without it)")
    use_dual_kl: bool = config_field(
        True, "Add the step-wise (velocity) KL term, log pi_prev - log pi_theta (--stepwise_kl_reference)",
        defines_run=True, on_card=True)
    dual_kl_moving_weight: float = config_field(
        1.0, "Weight of the mean-matching (position) KL term", defines_run=True, bound=NON_NEGATIVE)
    dual_kl_step_weight: float = config_field(
        0.1, "Weight of the step-wise (velocity) KL term", defines_run=True, bound=NON_NEGATIVE)
    stepwise_kl_reference: str = config_field(
        "previous_step", "The policy the step-wise KL is measured against (it matters with --num_inner_epochs > 1): "
        "previous_step (the paper's pi_{theta_{k-1}}: the policy before this optimizer update, i.e. the current "
        "weights; 0 in value, its gradient -grad log pi) or rollout (the policy that drew the rollout: the drift of "
        "the inner epochs so far)", choices=("previous_step", "rollout"), defines_run=True)


@section("optimisation", "optimizer, learning-rate schedule and run length")
@dataclass
class OptimConfig:
    learning_rate: float = config_field(1e-5, "Optimizer learning rate", defines_run=True, on_card=True, bound=POSITIVE)
    lr_scheduler: str = config_field(
        "constant", "Learning-rate schedule, diffusers' get_scheduler (constant as the reference; the others use "
        "--warmup_steps; linear, cosine, cosine_with_restarts and polynomial decay over the run's optimizer updates, "
        "max_steps / gradient_accumulation_steps)",
        choices=("constant", "constant_with_warmup", "linear", "cosine", "cosine_with_restarts", "polynomial"),
        defines_run=True, on_card=True)
    warmup_steps: int = config_field(
        500, "Linear warm-up updates of every --lr_scheduler but constant (the reference's constant schedule ignores "
        "it)", defines_run=True, bound=NON_NEGATIVE)
    lr_num_cycles: int = config_field(
        1, "Cycles of --lr_scheduler cosine_with_restarts", defines_run=True,
        bound=Bound(1, rule="lr-schedule-shape", fix="use --lr_num_cycles 1"))
    lr_power: float = config_field(
        1.0, "Power of --lr_scheduler polynomial", defines_run=True,
        bound=Bound(0, low_open=True, rule="lr-schedule-shape", fix="use --lr_power 1.0"))
    weight_decay: float = config_field(
        0.01, "Decoupled weight decay (Muon and AdamW)", defines_run=True, bound=NON_NEGATIVE)
    use_muon: bool = config_field(
        True, "Muon for matrix parameters (AdamW for the rest); false: AdamW everywhere",
        defines_run=True, on_card=True)
    max_grad_norm: float = config_field(1.0, "Gradient-norm clip at each update", defines_run=True, bound=POSITIVE)
    max_grad_norm_units: str = config_field(
        "reference", "What --max_grad_norm is compared with: reference (the reference's gradient norm, which under "
        "--sp_size sp is 1/sp of the full gradient's, so the full gradient is clipped at max_grad_norm x sp: the "
        "reference's launch flags clip where the reference does at every SP degree) or full (the full gradient's "
        "norm: the same clip at every SP degree)", choices=("reference", "full"), defines_run=True)
    gradient_accumulation_steps: int = config_field(
        1, "Rollout batches per optimizer update (the reference multiplies by steps x batch size internally)",
        defines_run=True, bound=AT_LEAST_1)
    max_steps: int = config_field(
        10000, "Outer steps (rollout batches); one optimizer update each by default", bound=AT_LEAST_1)
    ema_decay: float = config_field(
        0.0, "Exponential moving average of the trained weights, theta_ema <- d theta_ema + (1 - d) theta after every "
        "optimizer update (0: off); fp32, sharded like the weights, checkpointed in checkpoint-N/ema/ (generate.py, "
        "the export and the evaluation take --checkpoint_path checkpoint-N/ema)", defines_run=True,
        bound=Bound(0, 1, high_open=True, rule="ema-decay", fix="use 0.999, or 0 for no EMA"))
