"""Locate, check and load a VideoReward checkpoint in the released layout.

Layout (``<model_root>`` is the trainer's ``--pretrained_model_root``; the reference hard-codes ``./ckpts``)::

    <model_root>/VideoReward/model_config.json      data_config, model_config, peft_lora_config, inference_config
    <model_root>/VideoReward/checkpoint-N/model.pth  full state dict of the (PEFT-wrapped) model      -- or --
    <model_root>/VideoReward/checkpoint-N/adapter_model.safetensors + non_lora_state_dict.pth   (LoRA form)

The base model (config, tokenizer, and for the LoRA form its weights) is ``model_config.model_name_or_path``:
an absolute path, a path relative to the VideoReward folder or to ``<model_root>``, ``<model_root>/<repo name>``,
or an already-downloaded hub snapshot. Nothing is fetched from the hub.

Loading follows VideoAlign: build ``VideoRewardModel`` on the base, register the three reward tokens and resize
the embeddings, cast, wrap in PEFT LoRA (targets: every Linear/Embedding whose name contains none of
``lora_namespan_exclude``), then either load ``model.pth`` strictly or merge the adapter (adapter name
``default`` inserted) and the non-LoRA weights into the model's state dict and load that strictly.

Key remapping (``reward_checkpoint_mode``). transformers >= 4.52, including 5.23, nests the towers as
``model.visual.*`` and ``model.language_model.*``; older versions used ``visual.*`` and ``model.{embed_tokens,
layers,norm}.*``. Each mode names the layout the checkpoint was saved in, mapped onto the 5.23 model:

* ``v1``: pre-4.52 PEFT keys -> 5.23 (the reference's v1, unchanged: its target layout is still current);
* ``v2``: keys already in the >= 4.52 layout. The reference's v2 rewrote such keys back to the pre-4.52 layout
  for old transformers; 5.23 has no such layout, so v2 keys are used as they are;
* ``v3`` (default): every known variant (``visual``, ``vision_tower``, ``model.vision_tower``,
  ``language_model``, ``model.language_model``, ``model.{embed_tokens,layers,norm}``), with or without the
  ``base_model.model.`` PEFT prefix, is normalised to the model's own keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from sage_grpo.models.config_fields import check_config, read_model_config
from sage_grpo.safe_io import CheckpointError, load_plain, read_json_object

CHECKPOINT_MODES = ("v1", "v2", "v3")
PEFT_PREFIX = "base_model.model."
DOWNLOAD_HINT = (
    "Run download_weights.sh (see the reference's checkpoints-download.md) so that <model_root>/VideoReward holds "
    "model_config.json and checkpoint-N/, and the base model named by model_config.model_name_or_path "
    "(Qwen/Qwen2-VL-2B-Instruct for the released checkpoint) sits at that path, under <model_root>, or in the "
    "local hub cache; nothing is downloaded at run time. For tests and demos, "
    "scripts/make_tiny_reward_checkpoint.py writes a tiny random VideoReward in this layout."
)


@dataclass(frozen=True)
class LoraSettings:
    """``peft_lora_config`` fields VideoAlign uses to rebuild the adapter (targets come from the exclude list)."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    namespan_exclude: tuple[str, ...] = ()
    modules_to_save: tuple[str, ...] | None = None
    task_type: str = "CAUSAL_LM"
    use_rslora: bool = False
    num_lora_modules: int = -1


@dataclass(frozen=True)
class VideoRewardConfig:
    """The parts of ``model_config.json`` inference needs; defaults are VideoAlign's dataclass defaults."""

    model_name_or_path: str
    max_frame_pixels: int = 240 * 320
    fps: float | None = 2.0
    num_frames: int | None = None
    prompt_template_type: str = "none"
    sample_type: str = "uniform"
    output_dim: int = 1
    use_special_tokens: bool = False
    reward_token: str = "last"
    lora: LoraSettings | None = None
    norm_stats: dict[str, float] | None = None  # inference_config: {K}_mean / {K}_std

    @classmethod
    def from_file(cls, path: Path) -> VideoRewardConfig:
        raw = read_json_object(path, "the VideoAlign config", "download the reward checkpoint again", error=ValueError)
        missing = [k for k in ("data_config", "model_config", "peft_lora_config") if k not in raw]
        if missing:
            raise ValueError(f"{path} lacks the section(s) {missing}; expected a VideoAlign model_config.json")
        check_config(raw, "videoalign", path, error=ValueError)  # its numbers: frame budget, LoRA, norm statistics
        data, model, peft = raw["data_config"], raw["model_config"], raw["peft_lora_config"]
        if not model.get("model_name_or_path"):
            raise ValueError(f"{path}: model_config.model_name_or_path is empty; it must name the base model")
        stats = raw.get("inference_config")
        absent = [f"{h}_{s}" for h in ("VQ", "MQ", "TA") for s in ("mean", "std") if f"{h}_{s}" not in (stats or {})]
        if stats is not None and absent:
            raise ValueError(f"{path}: inference_config lacks {absent}; give all six or drop the section")
        return cls(
            model_name_or_path=model["model_name_or_path"],
            max_frame_pixels=int(data.get("max_frame_pixels", 240 * 320)),
            fps=data.get("fps", 2.0),
            num_frames=data.get("num_frames"),
            prompt_template_type=data.get("prompt_template_type", "none"),
            sample_type=data.get("sample_type", "uniform"),
            output_dim=int(model.get("output_dim", 1)),
            use_special_tokens=bool(model.get("use_special_tokens", False)),
            reward_token=model.get("reward_token", "last"),
            lora=_lora_settings(peft) if peft.get("lora_enable", False) else None,
            norm_stats=stats,
        )


def _as_names(value) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):  # VideoAlign collapses one-element lists to a string
        return (value,)
    return tuple(value)


def _lora_settings(peft: dict) -> LoraSettings:
    to_save = peft.get("lora_modules_to_save")
    return LoraSettings(
        r=int(peft.get("lora_r", 16)),
        alpha=int(peft.get("lora_alpha", 32)),
        dropout=float(peft.get("lora_dropout", 0.05)),
        namespan_exclude=_as_names(peft.get("lora_namespan_exclude")),
        modules_to_save=_as_names(to_save) if to_save is not None else None,
        task_type=peft.get("lora_task_type", "CAUSAL_LM"),
        use_rslora=bool(peft.get("use_rslora", False)),
        num_lora_modules=int(peft.get("num_lora_modules", -1)),
    )


@dataclass(frozen=True)
class ResolvedCheckpoint:
    """Every file location a load needs, checked to exist."""

    reward_dir: Path
    checkpoint_dir: Path
    step: int
    form: Literal["full", "lora"]
    base_dir: Path
    config: VideoRewardConfig


def _checkpoint_dirs(reward_dir: Path) -> dict[int, Path]:
    found = {}
    for path in reward_dir.glob("checkpoint-*"):
        suffix = path.name.split("-", 1)[1]
        if path.is_dir() and suffix.isdigit():
            found[int(suffix)] = path
    return found


def _base_dir_candidates(name: str, reward_dir: Path, model_root: Path) -> list[Path]:
    path = Path(name).expanduser()
    if path.is_absolute():
        return [path]
    return [reward_dir / path, model_root / path, model_root / path.name]


def _hub_snapshot(name: str) -> Path | None:
    """An already-downloaded snapshot of hub repo ``name`` (``local_files_only``: never a download)."""
    if name.count("/") != 1:
        return None
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(name, local_files_only=True))
    except Exception:  # noqa: BLE001 - any failure just means "not in the local cache"
        return None


def _missing_base_files(base_dir: Path, need_weights: bool) -> list[str]:
    missing = [f"{base_dir / n}" for n in ("config.json", "tokenizer_config.json") if not (base_dir / n).is_file()]
    if not (base_dir / "tokenizer.json").is_file() and not (
        (base_dir / "vocab.json").is_file() and (base_dir / "merges.txt").is_file()
    ):
        missing.append(f"{base_dir}/tokenizer.json (or vocab.json + merges.txt)")
    weights = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
    if need_weights and not any((base_dir / n).is_file() for n in weights):
        missing.append(f"{base_dir}/model.safetensors (base weights, needed by the LoRA checkpoint form)")
    return missing


def resolve_checkpoint(model_root: str | Path, step: int | None = None) -> ResolvedCheckpoint:
    """Find ``<model_root>/VideoReward`` files; ``step`` None or -1 picks the highest ``checkpoint-N``.

    Raises one ``FileNotFoundError`` listing everything that is missing.
    """
    model_root = Path(model_root)
    reward_dir = model_root / "VideoReward"
    missing: list[str] = []
    config_path = reward_dir / "model_config.json"
    config = VideoRewardConfig.from_file(config_path) if config_path.is_file() else None
    if config is None:
        missing.append(str(config_path))

    checkpoints = _checkpoint_dirs(reward_dir)
    checkpoint_dir, form, chosen = None, None, None
    if not checkpoints:
        missing.append(f"{reward_dir}/checkpoint-N/ (no checkpoint directory)")
    else:
        chosen = max(checkpoints) if step is None or step == -1 else step
        if chosen not in checkpoints:
            raise FileNotFoundError(
                f"checkpoint step {step} not found in {reward_dir}; available steps: {sorted(checkpoints)} "
                "(pass None or -1 for the latest)"
            )
        checkpoint_dir = checkpoints[chosen]
        if (checkpoint_dir / "model.pth").is_file():
            form = "full"
        else:
            form = "lora"
            for name in ("adapter_model.safetensors", "non_lora_state_dict.pth"):
                if not (checkpoint_dir / name).is_file():
                    missing.append(f"{checkpoint_dir / name} (or a full {checkpoint_dir / 'model.pth'})")

    base_dir = None
    if config is not None:
        candidates = _base_dir_candidates(config.model_name_or_path, reward_dir, model_root)
        base_dir = next((c for c in candidates if c.is_dir()), None) or _hub_snapshot(config.model_name_or_path)
        if base_dir is None:
            tried = ", ".join(str(c) for c in candidates)
            missing.append(f"base model {config.model_name_or_path!r} (looked in {tried} and the local hub cache)")
        else:
            missing += _missing_base_files(base_dir, need_weights=form == "lora")

    if missing:
        listing = "\n".join(f"  - {m}" for m in missing)
        raise FileNotFoundError(f"VideoReward files are missing:\n{listing}\n{DOWNLOAD_HINT}")
    read_model_config(base_dir / "config.json", "reward_base")  # the base model's shapes, before it is built
    return ResolvedCheckpoint(reward_dir, checkpoint_dir, chosen, form, base_dir, config)


# ---- key remapping ---------------------------------------------------------------------------------------


def _remap_v1(key: str) -> str:
    if key.startswith("base_model.model.visual."):
        return "base_model.model.model.visual." + key[len("base_model.model.visual."):]
    if key.startswith(("base_model.model.model.embed_tokens", "base_model.model.model.layers",
                       "base_model.model.model.norm")):
        return "base_model.model.model.language_model." + key[len("base_model.model.model."):]
    return key


# Body prefixes (after any PEFT prefix) -> transformers >= 4.52 body prefixes. First match wins.
_V3_BODY_PREFIXES = (
    ("model.visual.", "model.visual."),
    ("model.language_model.", "model.language_model."),
    ("model.vision_tower.", "model.visual."),
    ("vision_tower.", "model.visual."),
    ("visual.", "model.visual."),
    ("language_model.", "model.language_model."),
    ("model.embed_tokens.", "model.language_model.embed_tokens."),
    ("model.layers.", "model.language_model.layers."),
    ("model.norm.", "model.language_model.norm."),
)


def _remap_v3(key: str, peft_wrapped: bool) -> str:
    body = key[len(PEFT_PREFIX):] if key.startswith(PEFT_PREFIX) else key
    for old, new in _V3_BODY_PREFIXES:
        if body.startswith(old):
            body = new + body[len(old):]
            break
    return PEFT_PREFIX + body if peft_wrapped else body


def remap_state_dict_keys(
    state_dict: dict[str, torch.Tensor], mode: str, *, peft_wrapped: bool = True
) -> dict[str, torch.Tensor]:
    """Rename checkpoint keys saved in the layout ``mode`` names to the transformers 5.23 model's keys."""
    if mode == "v1":
        rename = _remap_v1
    elif mode == "v2":
        return dict(state_dict)
    elif mode == "v3":
        def rename(key: str) -> str:
            return _remap_v3(key, peft_wrapped)
    else:
        raise ValueError(f"unknown reward_checkpoint_mode {mode!r}; expected one of {CHECKPOINT_MODES}")
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        new_key = rename(key)
        if new_key in out:
            raise ValueError(f"checkpoint keys collide after {mode} remapping at {new_key!r}")
        out[new_key] = value
    return out


def insert_adapter_name(state_dict: dict[str, torch.Tensor], adapter_name: str = "default") -> dict:
    """``...q_proj.lora_A.weight`` -> ``...q_proj.lora_A.default.weight`` (PEFT saves adapters without names)."""
    out = {}
    for key, value in state_dict.items():
        parts = key.split(".")
        idx = next((i for i, part in enumerate(parts) if part.startswith("lora_")), None)
        if idx is not None:
            parts.insert(idx + 1, adapter_name)
        out[".".join(parts)] = value
    return out


class RewardCheckpointMismatch(CheckpointError, RuntimeError):
    """VideoReward weights whose keys are not the model's (a RuntimeError as before; a CheckpointError, so that a
    command ends in one line)."""


_REWARD_FIX = ("Use the VideoReward checkpoint as released (model.pth, or adapter_model.safetensors with "
               "non_lora_state_dict.pth)")


def _load_reward_file(path: Path, what: str) -> dict:
    """One weights file of a VideoReward checkpoint: plain tensors only (never code), naming the file."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        if not path.is_file():
            raise CheckpointError(f"{what} {path} is missing. {_REWARD_FIX}")
        try:
            return load_file(path)
        except Exception as err:  # SafetensorError, OSError
            raise CheckpointError(f"cannot read {what} {path}: {str(err)[:200]} (truncated or not a safetensors "
                                  f"file). {_REWARD_FIX}") from None
    state = load_plain(path, what, _REWARD_FIX)
    if not isinstance(state, dict):
        raise CheckpointError(f"{what} {path} holds a {type(state).__name__}, not a state dict. {_REWARD_FIX}")
    return state


def _check_keys(loaded: set[str], expected: set[str], *, mode: str, source: Path, require_all: bool) -> None:
    unexpected = sorted(loaded - expected)
    absent = sorted(expected - loaded) if require_all else []
    if unexpected or absent:
        raise RewardCheckpointMismatch(
            f"{source} does not match the VideoReward model after '{mode}' key remapping: "
            f"{len(unexpected)} unexpected keys {unexpected[:5]}, {len(absent)} missing keys {absent[:5]}. "
            f"reward_checkpoint_mode names the checkpoint's layout: v1 = pre-4.52 transformers, "
            f"v2 = transformers >= 4.52, v3 = any (default)."
        )


def load_checkpoint_weights(model: torch.nn.Module, resolved: ResolvedCheckpoint, mode: str) -> None:
    """Load ``model.pth`` strictly, or merge the LoRA adapter and non-LoRA weights and load strictly."""
    from peft import PeftModel

    peft_wrapped = isinstance(model, PeftModel)
    expected = model.state_dict()
    full_path = resolved.checkpoint_dir / "model.pth"
    if resolved.form == "full":
        state = remap_state_dict_keys(_load_reward_file(full_path, "VideoReward weights"), mode,
                                      peft_wrapped=peft_wrapped)
        _check_keys(set(state), set(expected), mode=mode, source=full_path, require_all=True)
        model.load_state_dict(state, strict=True)
        return
    if not peft_wrapped:
        raise ValueError(
            f"{resolved.checkpoint_dir} holds a LoRA adapter but peft_lora_config.lora_enable is false in "
            f"{resolved.reward_dir / 'model_config.json'}"
        )
    adapter_path = resolved.checkpoint_dir / "adapter_model.safetensors"
    non_lora_path = resolved.checkpoint_dir / "non_lora_state_dict.pth"
    lora = insert_adapter_name(remap_state_dict_keys(_load_reward_file(adapter_path, "VideoReward adapter"), mode))
    non_lora = remap_state_dict_keys(_load_reward_file(non_lora_path, "VideoReward non-LoRA weights"), mode)
    _check_keys(set(lora), set(expected), mode=mode, source=adapter_path, require_all=False)
    _check_keys(set(non_lora), set(expected), mode=mode, source=non_lora_path, require_all=False)
    expected.update(non_lora)
    expected.update(lora)
    model.load_state_dict(expected, strict=True)
