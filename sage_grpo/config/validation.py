"""Validity rules checked before any model loads (docs/reference.md#layout-rules plus our own sanity checks).

Every failure raises ``ConfigError`` (a ``ValueError``) whose message names the rule, the offending values and a valid
alternative, so that a mistyped launch line fails in a second instead of after minutes of model loading.
"""

import dataclasses
import functools
import math
import re
from typing import Dict, List, Optional, Protocol, Tuple

from sage_grpo.config.bounds import MAX_TOKENS, Bound
from sage_grpo.config.reward_weights import parse_reward_weights
from sage_grpo.config.sections import flat_items, option_fields
# the sections' own modules, not the package: the package's reader of recorded configurations checks with these rules
from sage_grpo.config.train.model import LoRAConfig, ModelConfig, ParallelConfig, ThroughputConfig
from sage_grpo.config.train.objective import OptimConfig, TrustRegionConfig, UpdateConfig
from sage_grpo.config.train.rollout import RESOLUTION_BUCKETS, DataConfig, RewardConfig, RolloutConfig
from sage_grpo.config.train.run import DriftGuardConfig, ValidationConfig


# HunyuanVideo-1.5's sampling flow shift per transformer version (its pipeline configs, and the scheduler/ of the
# diffusers pipeline repos): the reference's validation and generate.py sample 480p_t2v with shift 5.0 and 720p_t2v
# with 9.0; the cfg-distilled versions keep their resolution's shift, the step-distilled 480p_i2v uses 7.0. Its keys
# are the known version names: the versions published in diffusers format (hunyuanvideo-community/
# HunyuanVideo-1.5-Diffusers-<version>). A model root's own variants/<version>/scheduler/ config, when present, comes
# first (sage_grpo/models/variants.py).
FLOW_SHIFT_BY_VERSION: Dict[str, float] = {"480p_t2v": 5.0, "720p_t2v": 9.0, "480p_t2v_distilled": 5.0,
                                           # image-to-video (the reference's PIPELINE_CONFIGS)
                                           "480p_i2v": 5.0, "720p_i2v": 7.0, "480p_i2v_distilled": 5.0,
                                           "720p_i2v_distilled": 7.0, "480p_i2v_step_distilled": 7.0}
# Versions named upstream with no weights in diffusers format (the authors list them as coming soon), and why.
UNPUBLISHED_VERSIONS: Dict[str, str] = {
    "720p_t2v_distilled": "HunyuanVideo-1.5's authors list it as coming soon, and no diffusers-format repository "
                          "holds it",
}
# Versions whose transformer predicts mean flows (use_meanflow: a second timestep at every step).
MEANFLOW_VERSIONS = ("480p_i2v_step_distilled",)


class TrainSections(Protocol):
    """The sections of the training configuration (``sage_grpo.config.train.TrainConfig``) the whole-configuration
    rules read, declared by shape so the rules take whatever holds them."""

    model: ModelConfig
    data: DataConfig
    rollout: RolloutConfig
    reward: RewardConfig
    update: UpdateConfig
    trust_region: TrustRegionConfig
    optim: OptimConfig
    lora: LoRAConfig
    parallel: ParallelConfig
    throughput: ThroughputConfig
    validation: ValidationConfig
    drift: DriftGuardConfig


class ConfigError(ValueError):
    """An invalid combination of options."""


def _fail(rule: str, message: str, fix: str) -> None:
    raise ConfigError(f"[{rule}] {message}. Fix: {fix}.")


def parse_size(text: Optional[str], option: str = "size") -> Optional[Tuple[int, int]]:
    """A size flag: ``"480x864"`` or ``"480*864"`` -> (480, 864), height x width in positive integers; None, ``""``
    or ``"none"`` -> None (no size given: the caller's default). The one parser of sizes (trainer and generate.py)."""
    if text is None or str(text).strip().lower() in ("", "none"):
        return None
    match = re.fullmatch(r"\s*(\d+)\s*[xX*]\s*(\d+)\s*", text)
    if not match or int(match.group(1)) <= 0 or int(match.group(2)) <= 0:
        raise ConfigError(f"{option} must look like HEIGHTxWIDTH with positive integers (e.g. 480x864), or none; "
                          f"got {text!r}")
    return int(match.group(1)), int(match.group(2))


def default_flow_shift(transformer_version: str, option: str) -> float:
    """HunyuanVideo-1.5's sampling shift for ``transformer_version``; ``option`` names the flag that overrides it."""
    if transformer_version not in FLOW_SHIFT_BY_VERSION:
        known = ", ".join(f"{v}: {s}" for v, s in FLOW_SHIFT_BY_VERSION.items())
        _fail("flow-shift-default", f"{option} has no default for transformer version {transformer_version!r} "
              f"(known: {known})", f"pass {option} explicitly")
    return FLOW_SHIFT_BY_VERSION[transformer_version]


class FlowShiftOptions(Protocol):
    """What the validation shift is read from: the ``validation`` and ``model`` sections (declared by shape)."""

    validation: ValidationConfig
    model: ModelConfig


def validation_flow_shift(cfg: FlowShiftOptions) -> float:
    """``--validation_timestep_shift``, or when unset the shift of ``--pretrained_transformer_version``."""
    if cfg.validation.validation_timestep_shift is not None:
        return cfg.validation.validation_timestep_shift
    return default_flow_shift(cfg.model.pretrained_transformer_version, "--validation_timestep_shift")


def group_layout(batch_size: int, num_generations: int) -> Tuple[int, int]:
    """(ranks_per_group, groups_per_rank): B >= G gives (1, B/G), B < G gives (G/B, 1)
    (docs/reference.md#prompt-data-and-the-sampler)."""
    if batch_size >= num_generations:
        return 1, batch_size // num_generations
    return num_generations // batch_size, 1


def check_parallel_layout(world_size: int, sp_size: int, batch_size: int, num_generations: int,
                          num_attention_heads: Optional[int] = None) -> None:
    """Rules (1)-(4) of docs/reference.md#layout-rules."""
    if sp_size < 1 or sp_size > world_size or world_size % sp_size:
        _fail("sp-divides-world", f"--sp_size {sp_size} must divide the world size {world_size}",
              f"use --sp_size 1 on one process, or launch a multiple of {sp_size} processes "
              f"(torchrun --nproc_per_node {max(sp_size, 1)})")
    if num_attention_heads is not None and num_attention_heads % sp_size:
        _fail("heads-divisible-by-sp", f"the transformer has {num_attention_heads} attention heads, not divisible "
              f"by --sp_size {sp_size}", "pick --sp_size among the divisors of the head count")
    dp_size = world_size // sp_size
    if batch_size < 1 or num_generations < 1:
        _fail("positive-sizes", f"--batch_size {batch_size} and --num_generations {num_generations} must be >= 1",
              "use for example --batch_size 2 --num_generations 4")
    if (batch_size * dp_size) % num_generations:
        _fail("groups-fill-the-step", f"--batch_size {batch_size} x data-parallel size {dp_size} = "
              f"{batch_size * dp_size} videos per step is not a multiple of --num_generations {num_generations}",
              "choose num_generations dividing batch_size x dp")
    if batch_size >= num_generations and batch_size % num_generations:
        _fail("batch-holds-whole-groups", f"--batch_size {batch_size} >= --num_generations {num_generations} "
              "but is not a multiple of it", f"use --batch_size {num_generations * (batch_size // num_generations)}")
    if batch_size < num_generations:
        if num_generations % batch_size:
            _fail("group-spans-whole-ranks", f"--num_generations {num_generations} is not a multiple of "
                  f"--batch_size {batch_size}", "choose batch_size dividing num_generations")
        ranks_per_group = num_generations // batch_size
        if dp_size % ranks_per_group:
            _fail("ranks-per-group-divides-dp", f"each group spans {ranks_per_group} data-parallel ranks but the "
                  f"data-parallel size is {dp_size}", f"use a dp size that is a multiple of {ranks_per_group}")


@functools.lru_cache(maxsize=None)
def check_sequence_parallel_tokens(num_tokens: int, sp_size: int) -> None:
    """Rule (5) of docs/reference.md#layout-rules: every SP rank gets image tokens (we additionally need an even split).

    Decided once per (token count, sp) shape: the setup checks every size it knows (``ParallelDims.check_tokens``)
    and the SP hooks ask again on every forward, where a passed shape is then a cache lookup (a failure raises, so
    it is never cached)."""
    if sp_size > 1 and num_tokens % sp_size:
        _fail("tokens-divisible-by-sp", f"{num_tokens} latent tokens per video cannot be split evenly across "
              f"--sp_size {sp_size}", "change the rollout size/frames or the sp degree")


def check_finite_options(config) -> None:
    """Every float option of a config (post_train.py, generate.py) is a finite number: nan passes every range
    comparison (``nan <= 0`` is False), so it would reach the sampler; inf is no valid setting either."""
    current = dict(flat_items(config))
    for _, field in option_fields(type(config)):
        value = current[field.name]
        values = value if isinstance(value, list) else [value]  # a list of floats: each (--drift_proxy_sigmas)
        bad = [v for v in values if isinstance(v, float) and not math.isfinite(v)]
        if bad:
            default = field.default if field.default is not dataclasses.MISSING else None
            _fail(f"{field.name}-finite", f"--{field.name} {bad[0]} is not a finite number",
                  f"give a number; the default is {default!r}" if default is not None
                  else "give a number, or leave it unset for its default")


class TrainedStepsOptions(Protocol):
    """What the trained steps per sample are read from: the ``rollout`` and ``update`` sections (declared by shape)."""

    rollout: RolloutConfig
    update: UpdateConfig


def trained_steps_per_sample(cfg: TrainedStepsOptions) -> int:
    """(sample, step) pairs trained per sample and pass: ``--timestep_fraction`` of the SDE window's steps (all N
    steps without a window), at least 1."""
    return max(int((cfg.rollout.sde_window_size or cfg.rollout.grpo_sampling_steps) * cfg.update.timestep_fraction), 1)


SEED_LIMIT = 1 << 63  # torch generators take seeds below 2**64; a group's members add their index to a seed


def check_seeds(config) -> None:
    """Every seed option (``seed``, ``*_seed``, ``seeds``) is an integer in [0, 2**63): a larger one stopped a run
    or a generation after the models had loaded ("Overflow when unpacking long long")."""
    for name, value in flat_items(config):
        if name == "seeds" or name == "seed" or name.endswith("_seed"):
            for seed in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(seed, int) and not 0 <= seed < SEED_LIMIT:
                    _fail(f"{name}-range", f"--{name} {seed} must be in [0, 2**63)",
                          "see --help for the default")


def check_bounds(config) -> None:
    """Every option of ``config`` is inside the bound its field declares (:mod:`sage_grpo.config.bounds`); a list
    option item by item, an unset (None) one not at all."""
    values = dict(flat_items(config))
    for _, field in option_fields(type(config)):
        bound, value = field.metadata.get("bound"), values[field.name]
        if not isinstance(bound, Bound) or value is None:
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, (int, float)) and not isinstance(item, bool) and not bound.holds(item):
                default = field.default if field.default is not dataclasses.MISSING else None
                _fail(bound.rule_for(field.name), f"--{field.name} {item} must be {bound.text()}{bound.why}",
                      bound.fix or (f"use {default} (the default)" if default is not None
                                    else "leave it unset for its default"))


def check_optimizer_updates(optim: OptimConfig, update: UpdateConfig) -> None:
    """One optimizer update is made every ``--gradient_accumulation_steps`` rollout batches, and a run trains
    ``--max_steps`` x ``--num_inner_epochs`` of them (one per inner epoch of each step, whatever ``--batch_size``): a
    run with fewer makes no update and learns nothing."""
    batches = optim.max_steps * update.num_inner_epochs
    if batches < optim.gradient_accumulation_steps:
        epochs = f" x --num_inner_epochs {update.num_inner_epochs}" if update.num_inner_epochs > 1 else ""
        _fail("no-optimizer-update", f"--gradient_accumulation_steps {optim.gradient_accumulation_steps} with "
              f"--max_steps {optim.max_steps}{epochs} makes no optimizer update: one is made every "
              f"{optim.gradient_accumulation_steps} rollout batches and the run trains {batches}",
              f"use --gradient_accumulation_steps {batches} (or less), or --max_steps "
              f"{-(-optim.gradient_accumulation_steps // update.num_inner_epochs)} (or more)")


def validate_train_config(cfg: TrainSections, world_size: int = 1,
                          num_attention_heads: Optional[int] = None) -> List[str]:
    """Check every rule that needs no model; returns human-readable notes (empty when nothing to say)."""
    notes = check_option_values(cfg)
    check_parallel_layout(world_size, cfg.parallel.sp_size, cfg.data.batch_size, cfg.data.num_generations, num_attention_heads)
    if cfg.parallel.dp_replicate < 1 or (world_size % cfg.parallel.dp_replicate):
        _fail("dp-replicate-divides-world", f"--dp_replicate {cfg.parallel.dp_replicate} must divide the world size "
              f"{world_size}", "use --dp_replicate 1")
    return notes


def check_numbers(config) -> None:
    """Every number of ``config`` alone: finite, seeds in range, inside its declared bound."""
    check_finite_options(config)
    check_seeds(config)
    check_bounds(config)


def check_option_values(cfg: TrainSections) -> List[str]:
    """The rules of :func:`validate_train_config` that do not depend on the launch (world size, heads): what a
    checkpoint's recorded ``config.yaml`` is checked against too. Returns notes."""
    notes: List[str] = []
    check_numbers(cfg)
    if cfg.model.post_train_type != "grpo":
        _fail("post-train-type", f"--post_train_type {cfg.model.post_train_type} is not implemented (the reference's "
              "'standard' path crashes)", "use --post_train_type grpo")
    if cfg.data.batch_size % cfg.parallel.mini_batch_size_per_update:
        _fail("mini-batch-divides-batch", f"--mini_batch_size_per_update {cfg.parallel.mini_batch_size_per_update} does not "
              f"divide --batch_size {cfg.data.batch_size}", "use 1 (the reference's value)")
    if not cfg.rollout.sde_window_size <= cfg.rollout.grpo_sampling_steps or min(cfg.rollout.sde_window_size, cfg.rollout.sde_window_stride) < 0:
        _fail("sde-window", f"--sde_window_size {cfg.rollout.sde_window_size} must be in [0, --grpo_sampling_steps "
              f"{cfg.rollout.grpo_sampling_steps}] and --sde_window_stride {cfg.rollout.sde_window_stride} >= 0",
              "use --sde_window_size 0 (off)")
    if not 0 <= cfg.throughput.replay_group_size <= trained_steps_per_sample(cfg):
        _fail("replay-group", f"--replay_group_size {cfg.throughput.replay_group_size} must be in [0, the trained steps per "
              f"sample, {trained_steps_per_sample(cfg)}]", "use 0 (auto) or 1 (one step per forward, the reference)")
    check_optimizer_updates(cfg.optim, cfg.update)
    if cfg.validation.validate_ema and cfg.optim.ema_decay == 0.0:
        _fail("validate-ema-needs-ema", "--validate_ema true but --ema_decay is 0: there is no EMA to validate",
              "add --ema_decay 0.999, or drop --validate_ema")
    if cfg.trust_region.use_moving_KL and cfg.trust_region.update_ref_model_step < 1:
        _fail("anchor-interval", f"--update_ref_model_step {cfg.trust_region.update_ref_model_step} must be >= 1 with the moving "
              "anchor", "use 10 (the reference's value), or --use_moving_KL false")
    if (cfg.rollout.rollout_height is None) != (cfg.rollout.rollout_width is None):
        _fail("rollout-size-pair", "--rollout_height and --rollout_width must be given together",
              "pass both, or neither to use --video_bucket_hw_base_size")
    _check_reward_weights(cfg.reward.reward_weights)
    parse_size(cfg.validation.validation_fixed_size, "--validation_fixed_size")
    if cfg.validation.validation_interval > 0 or cfg.validation.validate_at_step0:
        if validation_flow_shift(cfg) <= 0:
            _fail("validation-shift-positive", f"--validation_timestep_shift {cfg.validation.validation_timestep_shift} must be "
                  "> 0", "leave it unset for the model version's shift (480p_t2v: 5.0, 720p_t2v: 9.0)")
    notes += _check_drift_options(cfg.drift, cfg.validation.validation_interval)
    if cfg.lora.pretrained_lora_path and not cfg.lora.use_lora:
        _fail("lora-path-needs-lora", "--pretrained_lora_path is set but --use_lora is false", "add --use_lora true")
    return notes + _kl_notes(cfg.trust_region)


def _kl_notes(trust_region: TrustRegionConfig) -> List[str]:
    """What the adaptive β makes of --kl_coef and --kl_min_coef, as the reference does (sage_grpo/rl/kl_controller.py):
    a clamped floor, a floor of 0 read as --kl_coef, and a β that stays 0 (no KL, no reference model)."""
    kl_weight, kl_coef, kl_min_coef = trust_region.kl_weight, trust_region.kl_coef, trust_region.kl_min_coef
    if kl_weight <= 0 or trust_region.kl_controller != "adaptive":
        return []
    if kl_coef == 0 and kl_min_coef == 0:
        return [f"--kl_coef 0 with --kl_min_coef 0: the KL weight beta stays 0 for the whole run (the reference "
                f"computes the KL only while beta > 0), so --kl_weight {kl_weight} adds no KL term and no "
                "reference model is loaded; for a KL term set --kl_coef > 0"]
    if kl_min_coef == 0:
        return [f"--kl_min_coef 0 means --kl_coef {kl_coef} (the reference's 'kl_min_coef or kl_coef'): beta's "
                "floor and the start of its warm-up"]
    if kl_min_coef > kl_weight:
        return [f"--kl_min_coef {kl_min_coef} > --kl_weight {kl_weight}: the controller clamps it to "
                f"{kl_weight} (as the reference does)"]
    return []


def _check_drift_options(drift: DriftGuardConfig, validation_interval: int) -> List[str]:
    """The drift proxy and guard (``sage_grpo.rl.drift_guard``) watch the validation points: without any they are off
    (a note says so: a config file may turn the guard on and a benchmark validation off)."""
    if not (drift.drift_proxy or drift.drift_guard != "off"):
        return []
    if validation_interval <= 0:
        flag = "--drift_proxy true" if drift.drift_guard == "off" else f"--drift_guard {drift.drift_guard}"
        return [f"{flag} is measured at the validation points and --validation_interval is "
                f"{validation_interval}: the drift proxy and guard are off"]
    if not drift.drift_proxy_sigmas or not all(0.0 < s < 1.0 for s in drift.drift_proxy_sigmas):
        _fail("drift-proxy-sigmas", f"--drift_proxy_sigmas {drift.drift_proxy_sigmas} must be one or more noise "
              "levels in (0, 1)", "use --drift_proxy_sigmas 0.5 0.75 0.9 (the default)")
    wrong = [f"--{name} {value:g} must be {rule}" for name, value, rule, ok in (
        ("drift_guard_window", drift.drift_guard_window, ">= 2", drift.drift_guard_window >= 2),
        ("drift_guard_proxy_ratio", drift.drift_guard_proxy_ratio, "> 1 (the step-0 point is 1 by definition)",
         drift.drift_guard_proxy_ratio > 1),
        ("drift_guard_notice_ratio", drift.drift_guard_notice_ratio, "> 1 (the step-0 point is 1 by definition)",
         drift.drift_guard_notice_ratio > 1),
        ("drift_guard_heldout_fall", drift.drift_guard_heldout_fall, ">= 0", drift.drift_guard_heldout_fall >= 0),
        ("drift_guard_dimension_fall", drift.drift_guard_dimension_fall, ">= 0", drift.drift_guard_dimension_fall >= 0),
    ) if not ok]
    if wrong:
        _fail("drift-guard-bounds", "; ".join(wrong), "use the defaults (--drift_guard_window 3, "
              "--drift_guard_proxy_ratio 8, --drift_guard_notice_ratio 2, --drift_guard_heldout_fall 0.05, "
              "--drift_guard_dimension_fall 1)")
    if drift.drift_guard_heldout and "none" in drift.drift_guard_heldout and len(drift.drift_guard_heldout) > 1:
        _fail("drift-guard-heldout", f"--drift_guard_heldout {' '.join(drift.drift_guard_heldout)}: 'none' (no "
              "dimension watched) goes alone", "use --drift_guard_heldout none, or name the keys without it")
    return []


def _check_reward_weights(text: str) -> None:
    """``--reward_weights`` through the one parser of the flag, the one the reward registry builds with."""
    try:
        parse_reward_weights(text)
    except ValueError as err:
        raise ConfigError(str(err)) from None  # its messages name reward_weights and give an example


class RolloutSizeOptions(Protocol):
    """What the rollout size is read from: the configuration's ``rollout`` section (declared by shape)."""

    rollout: RolloutConfig


class VideoSizeOptions(RolloutSizeOptions, Protocol):
    """What the rollout and validation sizes are read from: the ``rollout`` and ``validation`` sections."""

    validation: ValidationConfig


def rollout_size(cfg: RolloutSizeOptions) -> Tuple[int, int]:
    """(height, width) of rollout videos: the explicit override, else the reference bucket table."""
    if cfg.rollout.rollout_height is not None:
        return cfg.rollout.rollout_height, cfg.rollout.rollout_width
    return RESOLUTION_BUCKETS[cfg.rollout.video_bucket_hw_base_size]


def validation_size(cfg: VideoSizeOptions) -> Tuple[int, int]:
    """(height, width) of validation videos: ``--validation_fixed_size``, or the rollout size when it is none."""
    return parse_size(cfg.validation.validation_fixed_size, "--validation_fixed_size") or rollout_size(cfg)
