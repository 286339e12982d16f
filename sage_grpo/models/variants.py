"""The sampling settings a model variant ships with, and how they meet the flags.

HunyuanVideo-1.5 comes in variants (``480p_t2v``, ``720p_t2v``, the cfg-distilled ``480p_t2v_distilled``, ...) that
share the architecture but not how they are sampled: each diffusers pipeline repo holds a ``guider/`` config (the
``ClassifierFreeGuidance`` scale: 6.0 for the base versions, 1.0 for the cfg-distilled ones, which were trained to
give the guided velocity from the conditional branch alone) and a ``scheduler/`` config (the flow shift). The model
root keeps them per version under ``variants/<version>/`` (:func:`sage_grpo.models.layout.variant_config_layouts`).

Rules (:func:`choose`): a value set on the command line or in the YAML file is used as given, with one warning when
it contradicts the variant's (naming both); otherwise the variant's value is used; without a variant config the
flag's default stays (for the shift: the table of the known versions, ``FLOW_SHIFT_BY_VERSION``). Two guidance scales
mean the same when both are <= 1 (no guidance either way).

Where each setting applies:

* ``post_train.py``: ``--cfg_scale`` (rollouts, the policy update's re-scoring and validation) follows the guider;
  ``--validation_timestep_shift`` follows the scheduler. The rollout schedule ``--infer_flow_shift_video`` is the
  GRPO recipe's (the reference rolls out every version at 5.0) and is not taken from the variant.
* ``generate.py``: ``--guidance_scale`` and ``--flow_shift``.

The guider config is read as diffusers' ``ClassifierFreeGuidance`` defines it: ``enabled: false`` means no guidance,
and ``use_original_formulation`` (x_c + s(x_c - x_u)) is the scale s + 1 of our formula x_u + s(x_c - x_u).
``guidance_rescale`` and a ``start``/``stop`` window are not implemented by the samplers here: set away from their
defaults they give a note. Another guider class is an error.
"""

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from sage_grpo.config.schema import is_explicit
from sage_grpo.config.validation import ConfigError, default_flow_shift
from sage_grpo.models import layout
from sage_grpo.safe_io import read_json_object

GUIDER_CLASS = "ClassifierFreeGuidance"
CFG_DEFAULT_SCALE = 7.5  # ClassifierFreeGuidance's guidance_scale when its config leaves it out
SCHEDULER_DEFAULT_SHIFT = 1.0  # FlowMatchEulerDiscreteScheduler's shift when its config leaves it out
# ClassifierFreeGuidance's settings that the samplers here do not implement, with their no-op values
_UNSUPPORTED_GUIDER_SETTINGS = {"guidance_rescale": 0.0, "start": 0.0, "stop": 1.0}


@dataclass(frozen=True)
class VariantSampling:
    """What a version's own configs say; None where the root has no config for it."""

    version: str
    guidance_scale: Optional[float]
    guidance_source: Optional[str]  # the config file it came from
    flow_shift: Optional[float]
    shift_source: Optional[str]
    notes: Tuple[str, ...] = ()


def _read_json(path: Path) -> Dict[str, Any]:
    return read_json_object(path, "the variant's config", "download the variant's configs again (bash "
                            "download_weights.sh) or delete the file to use the flags' defaults", error=ConfigError)


def _number(data: Dict[str, Any], key: str, path: Path, default: float, *, positive: bool) -> float:
    """``data[key]`` (``default`` when absent, as diffusers does), a finite number > 0 or >= 0."""
    value = data.get(key, default)
    bad = isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
    if bad or value < 0 or (positive and value == 0):
        raise ConfigError(f"{path}: {key} must be a finite number {'>' if positive else '>='} 0, got {value!r}")
    return float(value)


def _guidance(path: Path) -> Tuple[float, List[str]]:
    """The guider config's scale in our formula v = v_u + s (v_c - v_u), and notes on what is not applied."""
    data = _read_json(path)
    if data.get("_class_name", GUIDER_CLASS) != GUIDER_CLASS:
        raise ConfigError(f"{path}: guider {data['_class_name']!r} is not implemented here (only {GUIDER_CLASS}). "
                          "Fix: pass the guidance scale to use explicitly (--cfg_scale / --guidance_scale)")
    if data.get("enabled", True) is False:
        return 1.0, []
    scale = _number(data, "guidance_scale", path, CFG_DEFAULT_SCALE, positive=False)
    if data.get("use_original_formulation", False):
        scale += 1.0
    notes = [f"{path}: {key} {data[key]!r} is not applied (the samplers here use plain CFG)"
             for key, neutral in _UNSUPPORTED_GUIDER_SETTINGS.items() if data.get(key, neutral) != neutral]
    return scale, notes


def read_variant_sampling(root, version: str) -> VariantSampling:
    """The guidance scale and flow shift of ``<root>/variants/<version>/``, where its configs exist."""
    guider, scheduler = layout.variant_config_files(Path(root), version)
    guidance, notes = _guidance(guider) if guider.is_file() else (None, [])
    shift = (_number(_read_json(scheduler), "shift", scheduler, SCHEDULER_DEFAULT_SHIFT, positive=True)
             if scheduler.is_file() else None)
    return VariantSampling(version, guidance, str(guider) if guidance is not None else None,
                           shift, str(scheduler) if shift is not None else None, tuple(notes))


def same_guidance(a: float, b: float) -> bool:
    """Guidance scales with the same effect: equal, or both <= 1 (the conditional velocity alone)."""
    return (a <= 1.0 and b <= 1.0) or math.isclose(a, b, rel_tol=1e-6)


def choose(option: str, value: Optional[float], explicit: bool, variant: VariantSampling, setting: str,
           same=lambda a, b: math.isclose(a, b, rel_tol=1e-6)) -> Tuple[Optional[float], Optional[str]]:
    """(the value to use, a warning or None) for one ``setting`` ("guidance_scale" or "flow_shift") of ``variant``:
    the user's explicit ``value`` wins, with a warning when it contradicts the variant's; else the variant's; else
    ``value`` (the flag's default)."""
    variant_value = getattr(variant, setting)
    if variant_value is None:
        return value, None
    if not explicit:
        return variant_value, None
    if same(value, variant_value):
        return value, None
    source = variant.guidance_source if setting == "guidance_scale" else variant.shift_source
    return value, (f"{option} {float(value)} overrides the {variant_value} that variant {variant.version} ships with "
                   f"({source}); {option} {variant_value} (or leaving it unset) samples the variant as intended")


def check_distilled_guidance(variant: VariantSampling, explicit: bool, option: str) -> None:
    """A distilled version (cfg- or step-distilled, t2v or i2v) is sampled with its own guidance, not the flag's 6.0:
    without its guider config and without an explicit value, refuse rather than guess."""
    if variant.guidance_scale is None and not explicit and "distilled" in variant.version:
        raise ConfigError(f"transformer version {variant.version!r} is distilled, and its guidance (1.0 for the "
                          f"cfg-distilled versions) is not the default 6.0, but the model root has no "
                          f"variants/{variant.version}/guider/ config. Fix: fetch its configs with `bash "
                          f"download_weights.sh --variant {variant.version}`, or pass {option} explicitly")


@dataclass(frozen=True)
class TrainSampling:
    """The run's guidance (``--cfg_scale``) and validation shift with the variant's filled in where the user set
    none, and what the user is told about them."""

    cfg_scale: float
    validation_timestep_shift: Optional[float]  # None: the flag is unset and the variant ships no scheduler config
    warnings: Tuple[str, ...] = ()
    notes: Tuple[str, ...] = ()


def resolve_train_sampling(model: Any, rollout: Any, validation: Any) -> TrainSampling:
    """The variant's guidance and validation shift for the training configuration's ``model``, ``rollout`` and
    ``validation`` sections, where the user set none, plus warnings and notes. Checks the version name first; reads
    only config files, loads no model."""
    root, version = model.pretrained_model_root, model.pretrained_transformer_version
    layout.check_transformer_version(Path(root), version, "--pretrained_transformer_version")
    variant = read_variant_sampling(root, version)
    explicit = is_explicit(rollout, "cfg_scale")
    check_distilled_guidance(variant, explicit, "--cfg_scale")
    cfg_scale, guidance_warning = choose("--cfg_scale", rollout.cfg_scale, explicit, variant, "guidance_scale",
                                         same_guidance)
    shift, shift_warning = choose("--validation_timestep_shift", validation.validation_timestep_shift,
                                  validation.validation_timestep_shift is not None, variant, "flow_shift")
    return TrainSampling(cfg_scale, shift, tuple(w for w in (guidance_warning, shift_warning) if w), variant.notes)


def resolve_generation_sampling(model_path, version: str, guidance_scale: float, guidance_explicit: bool,
                                flow_shift: Optional[float]) -> Tuple[float, float, List[str], List[str]]:
    """generate.py's (guidance scale, flow shift, warnings, notes) for ``version``: the rules of training; an unset
    shift without a scheduler config is the known version's (``FLOW_SHIFT_BY_VERSION``)."""
    layout.check_transformer_version(Path(model_path), version, "--model_version")
    variant = read_variant_sampling(model_path, version)
    check_distilled_guidance(variant, guidance_explicit, "--guidance_scale")
    guidance, guidance_warning = choose("--guidance_scale", guidance_scale, guidance_explicit, variant,
                                        "guidance_scale", same_guidance)
    shift, shift_warning = choose("--flow_shift", flow_shift, flow_shift is not None, variant, "flow_shift")
    if shift is None:
        shift = default_flow_shift(version, "--flow_shift")
    return guidance, shift, [w for w in (guidance_warning, shift_warning) if w], list(variant.notes)
