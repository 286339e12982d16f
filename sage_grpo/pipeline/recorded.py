"""The sampling settings a training checkpoint records, applied to generate.py's options.

A ``checkpoint-N/`` holds the run's resolved ``config.yaml``. Weights trained with short prompt streams (e.g. text,
byT5 and image tokens 32/16/4) sample badly at the pipeline's 1000/256/729, a policy trained on one transformer
version belongs to that version, and its rollouts used the run's resolved guidance (``--cfg_scale``, the variant's
guider unless the run set it). So, for ``--checkpoint_path`` (a checkpoint dir, its ``transformer/`` or
``transformer_dcp/``, or a file inside), every setting below that the user left unset comes from the run's config,
and each one the user did set that differs from it is named in one note:

    generate.py option                 run config key
    --text_max_length                  text_max_length (unset there: the pipeline's 1000)
    --byt5_max_length                  byt5_max_length
    --vision_num_semantic_tokens       vision_num_semantic_tokens
    --model_version (and --resolution) pretrained_transformer_version
    --guidance_scale                   cfg_scale

Exported folders (``sage-grpo-export``) carry no run config and keep the flags' defaults. The flags' own choice of
version, :func:`transformer_version`, lives here too (generate.py's plan calls it). Any other sampler of a
checkpoint (the evaluation) calls :func:`apply_recorded_settings` the same way.
"""

from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from sage_grpo.checkpoint_layout import CONFIG_FILE
from sage_grpo.config.generate import GenerateConfig
from sage_grpo.config.schema import is_explicit, replace_chosen
from sage_grpo.models.layout import version_task

# (generate.py option, run config key)
RECORDED_SETTINGS = (("text_max_length", "text_max_length"), ("byt5_max_length", "byt5_max_length"),
                     ("vision_num_semantic_tokens", "vision_num_semantic_tokens"),
                     ("model_version", "pretrained_transformer_version"), ("guidance_scale", "cfg_scale"))
# options that choose the transformer version besides --model_version
_VERSION_OPTIONS = ("model_version", "resolution", "cfg_distilled")


def run_config_file(weights_path: Optional[str]) -> Optional[Path]:
    """The ``config.yaml`` of the checkpoint ``weights_path`` belongs to (None: no checkpoint or no config)."""
    if not weights_path:
        return None
    path = Path(weights_path)
    for candidate in (path, path.parent, path.parent.parent):
        if (candidate / CONFIG_FILE).is_file():
            return candidate / CONFIG_FILE
    return None


def read_recorded_settings(weights_path: Optional[str]) -> Tuple[Dict[str, Any], Optional[Path]]:
    """{generate.py option: recorded value} of the checkpoint at ``weights_path``, and the file they come from. The
    file is checked like the command line first (:func:`~sage_grpo.config.train.read_run_config`): a NaN
    ``cfg_scale`` there is refused naming the file, not sampled as guidance off."""
    from sage_grpo.config.recorded import recorded_values
    from sage_grpo.config.train import read_run_config

    source = run_config_file(weights_path)
    if source is None:
        return {}, None
    run = recorded_values(read_run_config(source))
    recorded = {option: run[key] for option, key in RECORDED_SETTINGS if run.get(key) is not None}
    if "text_max_length" not in recorded and "byt5_max_length" in recorded:  # the run used the pipeline's 1000
        from sage_grpo.models.text_encoding import TextEncoderSettings

        recorded["text_max_length"] = TextEncoderSettings.max_length
    return recorded, source


def _explicit(config: GenerateConfig, option: str) -> bool:
    if option == "model_version":
        return any(is_explicit(config, name) for name in _VERSION_OPTIONS)
    return is_explicit(config, option)


def _user_value(config: GenerateConfig, option: str, recorded: Any) -> Any:
    """What the flags choose for ``option`` (the transformer version for the task of the recorded one)."""
    if option != "model_version":
        return getattr(config, option)
    return transformer_version(config, version_task(str(recorded)))


def transformer_version(config: GenerateConfig, task: str = "t2v") -> str:
    """``--model_version``, else ``<resolution>_<task>`` with ``_distilled`` under ``--cfg_distilled``
    (docs/reference.md#the-sampling-script); ``task`` is "i2v" when the prompts have reference images."""
    if config.model_version is not None:
        if config.cfg_distilled:
            raise ValueError("--model_version and --cfg_distilled both choose the transformer version: pass one "
                             f"(e.g. --model_version {config.resolution}_{task}_distilled)")
        if task == "i2v" and version_task(config.model_version) != "i2v":
            raise ValueError(f"--model_version {config.model_version} is a text-to-video transformer but the prompts "
                             f"have reference images: use an image-to-video one (e.g. {config.resolution}_i2v)")
        return config.model_version
    return f"{config.resolution}_{task}{'_distilled' if config.cfg_distilled else ''}"


def apply_recorded_settings(config: GenerateConfig) -> Tuple[GenerateConfig, List[str]]:
    """``config`` with the unset recorded settings of its ``--checkpoint_path`` filled in, and one note naming what
    was taken and one naming what the flags override (none when nothing is recorded)."""
    recorded, source = read_recorded_settings(config.checkpoint_path)
    taken, overridden = {}, []
    for option, value in recorded.items():
        if not _explicit(config, option):
            taken[option] = value
        elif _user_value(config, option, value) != value:
            overridden.append(f"--{option} {_user_value(config, option, value)} (the checkpoint's {value})")
    if "model_version" in taken:
        resolution = str(taken["model_version"]).split("_", 1)[0]
        if resolution in ("480p", "720p"):  # the video size follows the version's resolution
            taken["resolution"] = resolution
    notes = []
    if taken:
        notes.append(f"sampling settings from {source}: " + ", ".join(f"--{k} {v}" for k, v in taken.items()))
    if overridden:
        notes.append(f"flags override what {source} records: " + "; ".join(overridden))
    return (replace_chosen(config, **taken) if taken else config), notes
