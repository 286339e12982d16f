"""What a resume may continue, decided before any model loads.

:func:`check_resume` finds the checkpoint (``--resume_from_checkpoint DIR`` or ``latest``), checks that every part
the run needs is there and readable (weights, optimizer state, training state, the moving anchor once it has moved),
loads the training state (plain data only, :mod:`sage_grpo.safe_io`), and compares the settings that define the run
with the checkpoint's ``config.yaml``, and the model root with the fingerprint the checkpoint recorded of it
(:func:`model_fingerprint`: the components' configs and weight sizes; another root, or weights replaced in place,
change the KL reference, the VAE and the encoders). A change of any of them is refused with the list of differences, unless
``--allow_config_change true``: then the differences are returned for the trainer to log and record in
``config_changes.yaml``.
"""

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Protocol, Sequence, Tuple

import yaml

from sage_grpo.checkpoint import check_rng_state, is_sharded_checkpoint, resolve_resume_path
from sage_grpo.checkpoint_layout import (ANCHOR_FILE, CONFIG_FILE, DCP_ANCHOR, DCP_DIR, DCP_MODEL, OPTIMIZER_FILE,
                                         TRAINING_STATE_FILE, TRANSFORMER_FILE)
from sage_grpo.config import to_dict
from sage_grpo.config.recorded import recorded_values
from sage_grpo.config.schema import shorten
from sage_grpo.config.train import RUN_DEFINING, read_run_config
from sage_grpo.config.train.model import LoRAConfig, ModelConfig
from sage_grpo.config.train.objective import OptimConfig
from sage_grpo.config.train.rollout import DataConfig
from sage_grpo.config.train.run import OutputConfig
from sage_grpo.config.validation import ConfigError
from sage_grpo.data import PromptItem, prompts_record
from sage_grpo.export.identity import check_resume_shapes
from sage_grpo.rl import KLMode
from sage_grpo.rl.kl_controllers import STATE_KEY, saved_controller, state_checks
from sage_grpo.safe_io import CheckpointError, atomic_write, load_plain, read_dcp_metadata

# RUN_DEFINING: the settings whose change makes the continued run a different experiment (the optimizer state, the
# anchor schedule, the KL controller, the advantages or the sampled trajectories would no longer mean what they
# meant), each declared with defines_run=True. Everything else (max_steps, intervals, logging, validation,
# offloading, the parallel layout within the rules) may change freely.
CONFIG_CHANGES_FILE = "config_changes.yaml"


class ResumeOptions(Protocol):
    """The sections of the training configuration a resume is decided from (declared by shape); the run-defining
    settings are compared as flat ``{option: value}`` dicts (``to_dict`` of the configuration)."""

    model: ModelConfig
    data: DataConfig
    optim: OptimConfig
    lora: LoRAConfig
    output: OutputConfig


@dataclass
class ResumeCheck:
    """The outcome of :func:`check_resume`."""

    path: Path
    sharded: bool
    training_state: dict
    differences: Dict[str, Tuple[Any, Any]] = field(default_factory=dict)  # setting -> (checkpoint, now)
    notes: List[str] = field(default_factory=list)


def check_safetensors(path: Path, what: str) -> None:
    """Open ``path``'s header (cheap: no tensor is read), naming the file when it is missing or truncated."""
    from safetensors import safe_open

    if not path.is_file():
        raise CheckpointError(f"{what} {path} is missing")
    try:
        with safe_open(str(path), framework="pt") as handle:
            handle.keys()
    except Exception as err:  # SafetensorError and OSError
        raise CheckpointError(f"cannot read {what} {path}: {err} (truncated or not a safetensors file; an "
                              "interrupted copy leaves such files)") from None


def config_differences(saved: Dict[str, Any], now: Dict[str, Any]) -> Dict[str, Tuple[Any, Any]]:
    """The run-defining settings whose values differ between a checkpoint's recorded ``{option: value}`` and this
    run's (``to_dict`` of its configuration; ``max_steps`` too under a learning-rate schedule that decays over the
    run's length)."""
    from sage_grpo.optim.optimizers import DECAYING_SCHEDULES

    keys = RUN_DEFINING + (("max_steps",) if now["lr_scheduler"] in DECAYING_SCHEDULES else ())
    return {key: (saved.get(key), now[key]) for key in keys if key in saved and saved[key] != now[key]}


def _read_saved_config(path: Path) -> Optional[Dict[str, Any]]:
    """The settings the checkpoint recorded, checked like the command line (one line naming the file and the key)."""
    file = path / CONFIG_FILE
    if not file.is_file():
        return None
    return recorded_values(read_run_config(file))


_COUNTERS = ("global_step", "update_steps", "micro_steps", "failed_reward_steps")


def check_training_state(training: Any, file: Path) -> None:
    """The plain data of ``training_state.pt`` has the shape this version reads (counters non-negative integers,
    the layout record and the small objects' states mappings): one line naming the file and the key otherwise."""
    if not isinstance(training, dict) or "global_step" not in training:
        raise CheckpointError(f"{file} is not a sage-grpo training state")
    for key in _COUNTERS:
        value = training.get(key, 0)
        if type(value) is not int or value < 0:
            raise CheckpointError(f"{file}: {key} must be a non-negative integer, got {shorten(value)}")
    for key in ("layout", "anchor_schedule", "kl_controller"):
        if not isinstance(training.get(key) or {}, dict):
            raise CheckpointError(f"{file}: {key} must be a mapping, got {shorten(training[key])}")
    layout = training.get("layout") or {}
    if layout and (type(layout.get("videos_per_step")) is not int or layout["videos_per_step"] < 1):
        raise CheckpointError(f"{file}: layout.videos_per_step must be a positive integer, got "
                              f"{shorten(layout.get('videos_per_step'))}")
    if not isinstance(layout.get("model_root") or {}, dict):
        raise CheckpointError(f"{file}: layout.model_root must be a mapping, got {shorten(layout['model_root'])}")
    prompts = layout.get("prompts", {"count": 0, "sha256": ""})
    if not isinstance(prompts, dict) or type(prompts.get("count")) is not int or type(prompts.get("sha256")) is not str:
        raise CheckpointError(f"{file}: layout.prompts must be a mapping of count and sha256, got {shorten(prompts)}")
    _check_small_states(training, file)


def _check_small_states(training: Dict[str, Any], file: Path) -> None:
    """The KL controller's and the anchor schedule's states and the RNG states, as this version restores them: a
    NaN or inf beta would make every loss NaN, a garbled RNG state failed only after the models had loaded."""
    controller = training.get("kl_controller") or {}
    if controller:
        try:
            checks = state_checks(saved_controller(controller))
        except ValueError as err:
            raise CheckpointError(f"{file}: kl_controller.{STATE_KEY} {err}, got "
                                  f"{shorten(controller.get(STATE_KEY))}") from None
        for key, (valid, what) in checks.items():  # the controller's own checks of what it restores
            if not valid(controller.get(key)):
                raise CheckpointError(f"{file}: kl_controller.{key} must be {what}, got {shorten(controller.get(key))}")
    schedule = training.get("anchor_schedule")
    if not isinstance(schedule, dict) or "last_refreshed_at" not in schedule:
        raise CheckpointError(f"{file}: anchor_schedule must be a mapping with last_refreshed_at, got "
                              f"{shorten(schedule)}")
    refreshed = schedule["last_refreshed_at"]
    if refreshed is not None and (type(refreshed) is not int or refreshed < 0):
        raise CheckpointError(f"{file}: anchor_schedule.last_refreshed_at must be empty or a non-negative integer, "
                              f"got {shorten(refreshed)}")
    ranks = [training["rng"]] if "rng" in training else training.get("rng_per_rank", [])
    if not isinstance(ranks, list):
        raise CheckpointError(f"{file}: rng_per_rank must be a list of RNG states, got {shorten(ranks)}")
    for index, state in enumerate(ranks):
        check_rng_state(state, f"{file}: {'rng' if 'rng' in training else f'rng_per_rank[{index}]'}")


def _check_parts(path: Path, sharded: bool) -> List[str]:
    """The names of the parts a checkpoint's tensors live in; raises naming the first missing or unreadable one."""
    if sharded:
        stored = set(read_dcp_metadata(path / DCP_DIR).state_dict_metadata)
        if not any(key.startswith(f"{DCP_MODEL}.") for key in stored):
            raise CheckpointError(f"{path / DCP_DIR} holds no model weights")
        return sorted(stored)
    check_safetensors(path / TRANSFORMER_FILE, "trainable weights")
    if not (path / OPTIMIZER_FILE).is_file():
        raise CheckpointError(f"optimizer state {path / OPTIMIZER_FILE} is missing; the optimizer cannot continue "
                              "where it stopped. Resume from another checkpoint, or start a new run from "
                              f"{path / TRANSFORMER_FILE}")
    anchor = path / ANCHOR_FILE
    if anchor.exists():
        check_safetensors(anchor, "moving-anchor weights")
    return []


# What a user is told wherever weights are identified by the cheap fingerprint (model_fingerprint), not every byte.
SAMPLED_IDENTITY = ("{what} is {compared} by its configs, file sizes and 64 KiB sampled from each weight file: "
                    "weights changed in place elsewhere in a file of the same size are not detected")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_HASHED_FILE_LIMIT = 64 << 20  # config, index and tokenizer files are hashed whole; larger files are sampled
_SAMPLES, _SAMPLE_BYTES = 16, 4096  # a weight file: 16 blocks of 4 KiB, evenly spaced (header and tensor data)


def _sample_file(file: Path, size: int, digest) -> None:
    """Blocks spread over the file: other weights of the same shapes (a fine-tune, another seed) differ in them,
    and reading 64 KiB costs nothing next to hashing gigabytes."""
    with open(file, "rb") as handle:
        for index in range(_SAMPLES):
            handle.seek(max(size - _SAMPLE_BYTES, 0) * index // (_SAMPLES - 1))
            digest.update(handle.read(_SAMPLE_BYTES))


def model_fingerprint(root: Path, transformer_version: str) -> Dict[str, str]:
    """A short digest per component folder of the model root (the transformer version, its variant configs, the
    VAE, the text and image encoders, tokenizers, scheduler): the content of its config, weight-index and tokenizer
    files, the names and sizes of its weight files and 64 KiB sampled from each. Cheap at any model size (no weight
    file is read whole); weights of the same shapes that differ only outside the samples would pass."""
    from sage_grpo.models import layout

    folders = [layout.transformer_layout(transformer_version), *layout.variant_config_layouts(transformer_version),
               layout.VAE, *layout.TEXT_COMPONENTS, layout.SCHEDULER, *layout.IMAGE_COMPONENTS]
    return {component.subdir: folder_digest(Path(root) / component.subdir) for component in folders
            if (Path(root) / component.subdir).is_dir()}


def folder_digest(folder: Path) -> str:
    """The digest :func:`model_fingerprint` gives one folder (or one file): small files whole, weight files by name,
    size and 64 KiB sampled from them."""
    digest = hashlib.sha256()
    files = [folder] if folder.is_file() else sorted(p for p in folder.rglob("*") if p.is_file())
    for file in files:
        size = file.stat().st_size
        digest.update(f"{file.relative_to(folder) if file != folder else file.name}\0{size}\0".encode())
        if file.suffix not in WEIGHT_SUFFIXES and size <= _HASHED_FILE_LIMIT:
            digest.update(hashlib.sha256(file.read_bytes()).digest())
        else:
            _sample_file(file, size, digest)
    return digest.hexdigest()[:16]


def layout_record(model: ModelConfig, world_size: int, dp_size: int, sp_size: int, videos_per_step: int,
                  prompts: Optional[Sequence[PromptItem]] = None) -> dict:
    """What a checkpoint records of the run's make-up: the parallel layout, the model root's fingerprint
    (:func:`model_fingerprint`) and the training prompts (:func:`~sage_grpo.data.prompts_record`). Of the layout only
    the videos per step matter to the run (DCP reshards the weights to any layout, and every sample's randomness
    depends on its index in the step's global batch)."""
    return {"world_size": world_size, "dp_size": dp_size, "sp_size": sp_size, "videos_per_step": videos_per_step,
            "model_root": model_fingerprint(Path(model.pretrained_model_root), model.pretrained_transformer_version),
            **({"prompts": prompts_record(prompts)} if prompts is not None else {})}


def model_root_difference(saved_root: Any, layout: Optional[dict], model: ModelConfig) -> Dict[str, Tuple[Any, Any]]:
    """The model root as a difference to refuse (or record): the components whose configs, weight index or weight
    sizes differ from those the checkpoint was trained from. Checkpoints of earlier versions record none."""
    saved = (layout or {}).get("model_root")
    if not isinstance(saved, dict):
        return {}
    now = model_fingerprint(Path(model.pretrained_model_root), model.pretrained_transformer_version)
    changed = sorted(name for name in set(saved) | set(now) if saved.get(name) != now.get(name))
    if not changed:
        return {}
    key = f"model root --pretrained_model_root (differs in {', '.join(changed)})"
    return {key: (saved_root, model.pretrained_model_root)}


def prompts_difference(saved: Optional[Dict[str, Any]], layout: Optional[dict], train_video_csv: Any,
                       prompts: Optional[Sequence[PromptItem]]) -> Dict[str, Tuple[Any, Any]]:
    """The training prompts as a difference to refuse (or record): their content, when the checkpoint recorded it
    (the same rows in moved files are the same run), else the ``--train_video_csv`` paths. Other prompts make the
    sampler, stateless in the step, draw another order, so the data position would no longer mean the same."""
    record = (layout or {}).get("prompts")
    if record is not None and prompts is not None:
        now = prompts_record(prompts)
        if now == record:
            return {}
        return {f"prompt data --train_video_csv (other rows: {record['count']} -> {now['count']} prompts)":
                (saved.get("train_video_csv") if saved else None, train_video_csv)}
    if saved is not None and "train_video_csv" in saved and saved["train_video_csv"] != train_video_csv:
        return {"train_video_csv": (saved["train_video_csv"], train_video_csv)}
    return {}


def _check_controller(training: dict, name: str, kl_mode: KLMode, path: Path) -> None:
    """A KL controller continues only its own state: one line when the checkpoint holds another controller's (even
    under ``--allow_config_change``, which cannot make one controller's state another's)."""
    state = training.get("kl_controller")
    if not state or not kl_mode.uses_reference:  # no KL then or now: nothing is restored
        return
    saved = saved_controller(state)
    if saved != name:
        raise ConfigError(f"{path} holds the state of the {saved!r} KL controller, and this run asks for "
                          f"--kl_controller {name}: a controller cannot continue another's state. Resume with "
                          f"--kl_controller {saved}, or start a new run")


def describe_setting(key: str) -> str:
    return key if " " in key else f"--{key}"


def check_resume(cfg: ResumeOptions, kl_mode: KLMode, *, distributed: bool, dp_size: int = 1,
                 prompts: Optional[Sequence[PromptItem]] = None) -> ResumeCheck:
    """Everything about ``--resume_from_checkpoint`` that can be checked without a model (see module docstring);
    ``kl_mode`` says whether this run has a KL reference for a saved moving anchor; ``prompts``: the run's training
    prompts, compared with those the checkpoint recorded."""
    path = resolve_resume_path(cfg.output.resume_from_checkpoint, Path(cfg.output.output_dir))
    sharded = is_sharded_checkpoint(path)
    if distributed and not sharded:
        raise ConfigError(f"{path} was written by a single process (no {DCP_DIR}/); resume it with one process, or "
                          "start a new run from its weights")
    stored = _check_parts(path, sharded)
    training = load_plain(path / TRAINING_STATE_FILE, "training state")
    check_training_state(training, path / TRAINING_STATE_FILE)
    _check_controller(training, cfg.trust_region.kl_controller, kl_mode, path)
    check = ResumeCheck(path, sharded, training)

    anchor_moved = (training.get("anchor_schedule") or {}).get("last_refreshed_at") is not None
    has_anchor = (any(key.startswith(f"{DCP_ANCHOR}.") for key in stored) if sharded
                  else (path / ANCHOR_FILE).is_file())
    wants_reference = kl_mode.uses_reference
    if anchor_moved and wants_reference and not has_anchor:
        where = f"{DCP_ANCHOR}.* in {path / DCP_DIR}" if sharded else str(path / ANCHOR_FILE)
        raise CheckpointError(f"{path} lacks the moving anchor ({where}) although the anchor moved at update "
                              f"{training['anchor_schedule']['last_refreshed_at']}: resuming would take the base "
                              "model as the KL reference. Resume from an intact checkpoint")
    if has_anchor and not wants_reference:
        check.notes.append(f"{path} holds a moving anchor, but this run has no KL term (--kl_weight 0, or --kl_coef "
                           "0 with --kl_min_coef 0): the anchor is not used")

    saved = _read_saved_config(path)
    if saved is None:
        check.notes.append(f"{path} has no {CONFIG_FILE} (written by an earlier version): the run's settings cannot "
                           "be compared with the checkpoint's")
    else:
        check.differences = config_differences(saved, to_dict(cfg))
    layout = training.get("layout")
    if layout is not None and layout["videos_per_step"] != cfg.data.batch_size * dp_size:
        check.differences["videos per step (batch_size x dp)"] = (layout["videos_per_step"], cfg.data.batch_size * dp_size)
    # the KL reference, the VAE and the encoders come from the model root: other weights make another run
    check.differences.update(model_root_difference((saved or {}).get("pretrained_model_root"), layout, cfg.model))
    check.differences.update(prompts_difference(saved, layout, cfg.data.train_video_csv, prompts))
    # what no allowed change can load
    check_resume_shapes(path, sharded, saved or {}, cfg, check.differences)
    if any(key.startswith("prompt data") or key == "train_video_csv" for key in check.differences):
        step = training["global_step"]
        check.notes.append(f"--train_video_csv: other prompts from step {step} on. The sampler keeps no state but "
                           f"the step: step {step + 1} takes its prompts where that step number falls in the new "
                           "prompts' shuffled order (epoch and position), not where the old order had got to")
    if (layout or {}).get("model_root"):
        check.notes.append(SAMPLED_IDENTITY.format(what=f"the model root {cfg.model.pretrained_model_root}",
                                                   compared=f"compared with {path}'s record"))
    if check.differences and not cfg.output.allow_config_change:
        lines = "; ".join(f"{describe_setting(key)} {shorten(old)} -> {shorten(new)}"
                          for key, (old, new) in check.differences.items())
        raise ConfigError(f"resuming {path} with settings that define a different run: {lines}. Use the "
                          f"checkpoint's values (its config.yaml), or pass --allow_config_change true to continue "
                          f"anyway (the changes are logged and recorded in {CONFIG_CHANGES_FILE})")
    return check


def restarts(cfg: ResumeOptions) -> bool:
    """Whether this start continues the run in ``--output_dir`` from step 0: ``--resume_from_checkpoint auto`` in a
    directory that holds a run but no checkpoint yet (a crash, or a Slurm requeue, before the first save). Its
    recorded ``run_config.yaml`` is read back and checked like the command line, and a run it defines differently is
    refused as a resume onto other settings is (unless ``--allow_config_change``)."""
    from sage_grpo.checkpoint import list_checkpoints
    from sage_grpo.tracking.run_dir import RUN_MARKER

    run_dir = Path(cfg.output.output_dir)
    if cfg.output.resume_from_checkpoint != "auto" or list_checkpoints(run_dir) or not (run_dir / RUN_MARKER).is_file():
        return False
    differences = config_differences(recorded_values(read_run_config(run_dir / RUN_MARKER)), to_dict(cfg))
    if differences and not cfg.output.allow_config_change:
        lines = "; ".join(f"--{key} {shorten(old)} -> {shorten(new)}" for key, (old, new) in differences.items())
        raise ConfigError(f"--resume_from_checkpoint auto: {run_dir} holds a run without a checkpoint yet, started "
                          f"with settings that define a different run: {lines}. Use its settings ({RUN_MARKER}), a "
                          "new --output_dir, or --allow_config_change true to start it again with these")
    return True


def run_inputs(cfg: ResumeOptions, check: Optional[ResumeCheck]) -> Dict[str, Any]:
    """{flag: path} of what a run reads, which its ``--output_dir`` must lie outside of."""
    inputs = {"--pretrained_model_root": cfg.model.pretrained_model_root, "--pretrained_lora_path": cfg.lora.pretrained_lora_path,
              "--resume_from_checkpoint": check.path if check is not None else None}
    inputs.update({f"--train_video_csv {path}": path for path in cfg.data.train_video_csv or ()})
    return inputs


def record_config_changes(run_dir: Path, check: ResumeCheck) -> None:
    """Append this resume's setting changes to ``config_changes.yaml`` in the run directory: one more item of its
    YAML list, added as text (the earlier entries are kept byte for byte, never parsed and written again)."""
    file = Path(run_dir) / CONFIG_CHANGES_FILE
    entry = {"resumed_from": str(check.path), "at_step": int(check.training_state["global_step"]),
             "changes": {key: {"checkpoint": old, "now": new} for key, (old, new) in check.differences.items()}}
    earlier = file.read_bytes() if file.is_file() else b""
    if earlier and not earlier.endswith(b"\n"):
        earlier += b"\n"
    atomic_write(file, earlier + yaml.safe_dump([entry], sort_keys=False).encode())
