"""On-disk layout of a HunyuanVideo-1.5 checkpoint root (``./ckpts``): the one table of expected files.

The loader (:mod:`sage_grpo.models.loading`) and the download script's verification step both read this table, so a
checkpoint that passes ``python -m sage_grpo.cli.verify --model_root ckpts`` is one the loader can open. Every
component is a diffusers/transformers ``save_pretrained`` folder; the transformer folders are per version, as in the
reference's ``ckpts/transformer/<version>``::

    <root>/transformer/480p_t2v/   HunyuanVideo15Transformer3DModel   config.json + diffusion_pytorch_model*.safetensors
    <root>/transformer/720p_t2v/   (same class; any other version folder, e.g. a distilled one, is accepted too)
    <root>/vae/                    AutoencoderKLHunyuanVideo15        config.json + diffusion_pytorch_model*.safetensors
    <root>/text_encoder/           Qwen2_5_VLTextModel                config.json + model*.safetensors
    <root>/tokenizer/              Qwen2Tokenizer + chat template     tokenizer_config.json + (tokenizer.json | vocab.json & merges.txt)
    <root>/text_encoder_2/         T5EncoderModel (byT5 glyph encoder) config.json + model*.safetensors
    <root>/tokenizer_2/            ByT5Tokenizer                      tokenizer_config.json
    <root>/scheduler/              FlowMatchEulerDiscreteScheduler    scheduler_config.json
    <root>/VideoReward/            VideoAlign reward model            model_config.json (its loader checks the rest)

Image-to-video versions (``480p_i2v``, ``720p_i2v``, ...: a ``_i2v`` in the name, :func:`version_task`) also need
the SigLIP image encoder and its processor, as diffusers' ``HunyuanVideo15ImageToVideoPipeline`` repos hold them::

    <root>/image_encoder/          SiglipVisionModel                  config.json + model*.safetensors
    <root>/feature_extractor/      SiglipImageProcessor               preprocessor_config.json

Optional, per version: the sampling settings its authors ship with it (each diffusers pipeline repo has its own
``guider/`` and ``scheduler/``; the shared ``scheduler/`` above comes from the first version downloaded)::

    <root>/variants/<version>/guider/      ClassifierFreeGuidance     guider_config.json     (guidance_scale)
    <root>/variants/<version>/scheduler/   FlowMatchEulerDiscreteScheduler  scheduler_config.json  (shift)

:mod:`sage_grpo.models.variants` reads them; a root without them samples with the flags' defaults.

Weights may be one file or sharded (``*.safetensors.index.json`` plus the shards it names); the shards of an index are
checked too, so an interrupted download is reported as missing files rather than failing later inside
``from_pretrained``.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from sage_grpo.config.validation import FLOW_SHIFT_BY_VERSION, UNPUBLISHED_VERSIONS

DEFAULT_TRANSFORMER_VERSION = "480p_t2v"
# the known names: HunyuanVideo-1.5's t2v and i2v versions published in diffusers format
TRANSFORMER_VERSIONS = tuple(FLOW_SHIFT_BY_VERSION)
TRANSFORMER_DIR = "transformer"
VARIANTS_DIR = "variants"
REWARD_DIR = "VideoReward"
DOWNLOAD_HINT = "Run `bash download_weights.sh --help` to see how to download the weights into this layout."


@dataclass(frozen=True)
class ComponentLayout:
    """One component folder and the files it must hold.

    ``required`` is a tuple of requirements; each requirement is a tuple of alternatives, and each alternative is a
    tuple of file names that must all be present (e.g. ``(("tokenizer.json",), ("vocab.json", "merges.txt"))``).
    """

    name: str
    subdir: str
    class_name: str
    required: Tuple[Tuple[Tuple[str, ...], ...], ...]


def _weights(stem: str) -> Tuple[Tuple[str, ...], ...]:
    return ((f"{stem}.safetensors",), (f"{stem}.safetensors.index.json",))


def transformer_layout(version: str = DEFAULT_TRANSFORMER_VERSION) -> ComponentLayout:
    return ComponentLayout(
        name=f"transformer ({version})",
        subdir=f"{TRANSFORMER_DIR}/{version}",
        class_name="HunyuanVideo15Transformer3DModel",
        required=((("config.json",),), _weights("diffusion_pytorch_model")),
    )


GUIDER_CONFIG = "guider_config.json"
SCHEDULER_CONFIG = "scheduler_config.json"


def variant_config_layouts(version: str) -> List[ComponentLayout]:
    """The optional sampling configs of one version: its guider and its scheduler (see the module docstring)."""
    folder = f"{VARIANTS_DIR}/{version}"
    return [ComponentLayout(f"guider ({version})", f"{folder}/guider", "ClassifierFreeGuidance",
                            (((GUIDER_CONFIG,),),)),
            ComponentLayout(f"scheduler ({version})", f"{folder}/scheduler", "FlowMatchEulerDiscreteScheduler",
                            (((SCHEDULER_CONFIG,),),))]


def variant_config_files(root: Path, version: str) -> Tuple[Path, Path]:
    """(guider config, scheduler config) paths of ``version`` under ``root`` (either may be absent)."""
    guider, scheduler = variant_config_layouts(version)
    return Path(root) / guider.subdir / GUIDER_CONFIG, Path(root) / scheduler.subdir / SCHEDULER_CONFIG


VAE = ComponentLayout("vae", "vae", "AutoencoderKLHunyuanVideo15",
                      ((("config.json",),), _weights("diffusion_pytorch_model")))
TEXT_ENCODER = ComponentLayout("text_encoder", "text_encoder", "Qwen2_5_VLTextModel",
                               ((("config.json",),), _weights("model")))
TOKENIZER = ComponentLayout("tokenizer", "tokenizer", "Qwen2Tokenizer",
                            ((("tokenizer_config.json",),), (("tokenizer.json",), ("vocab.json", "merges.txt"))))
TEXT_ENCODER_2 = ComponentLayout("text_encoder_2", "text_encoder_2", "T5EncoderModel",
                                 ((("config.json",),), _weights("model")))
TOKENIZER_2 = ComponentLayout("tokenizer_2", "tokenizer_2", "ByT5Tokenizer", ((("tokenizer_config.json",),),))
SCHEDULER = ComponentLayout("scheduler", "scheduler", "FlowMatchEulerDiscreteScheduler", (((SCHEDULER_CONFIG,),),))
VIDEO_REWARD = ComponentLayout("VideoReward", REWARD_DIR, "VideoAlign reward model", ((("model_config.json",),),))

IMAGE_ENCODER = ComponentLayout("image_encoder", "image_encoder", "SiglipVisionModel",
                                ((("config.json",),), _weights("model")))
FEATURE_EXTRACTOR = ComponentLayout("feature_extractor", "feature_extractor", "SiglipImageProcessor",
                                    ((("preprocessor_config.json",),),))

TEXT_COMPONENTS = (TEXT_ENCODER, TOKENIZER, TEXT_ENCODER_2, TOKENIZER_2)
IMAGE_COMPONENTS = (IMAGE_ENCODER, FEATURE_EXTRACTOR)


def version_task(version: str) -> str:
    """``"i2v"`` for an image-to-video transformer version (``_i2v`` in its name: ``480p_i2v``,
    ``720p_i2v_distilled``, ...), else ``"t2v"``."""
    return "i2v" if "_i2v" in f"_{version}" else "t2v"


class MissingCheckpointError(FileNotFoundError):
    """A checkpoint root lacks files; ``missing`` lists every one of them (paths relative to ``root``)."""

    def __init__(self, root: Path, missing: Sequence[str], note: str = ""):
        self.root = Path(root)
        self.missing = list(missing)
        lines = "\n".join(f"  - {item}" for item in self.missing)
        extra = f"\n{note}" if note else ""
        super().__init__(
            f"Checkpoint root {str(self.root)!r} is missing {len(self.missing)} required file(s):\n{lines}{extra}\n"
            f"{DOWNLOAD_HINT} (Tiny random weights for tests: `python scripts/make_tiny_checkpoint.py --output DIR`.)"
        )


def _missing_in_alternative(folder: Path, files: Tuple[str, ...]) -> List[str]:
    """Files of one alternative that are absent; for a shard index, also the shards it names."""
    from sage_grpo.safe_io import shard_names  # torch: not at import (the CLI's help reads this module)

    missing = [f for f in files if not (folder / f).is_file()]
    for f in files:
        if f.endswith(".index.json") and (folder / f).is_file():
            missing += [s for s in shard_names(folder / f) if not (folder / s).is_file()]
    return missing


def missing_files(root: Path, layout: ComponentLayout) -> List[str]:
    """Relative paths missing for one component (alternatives shown as ``a | b``); empty when complete."""
    folder = Path(root) / layout.subdir
    if not folder.is_dir():
        return [f"{layout.subdir}/  ({layout.class_name} folder)"]
    missing: List[str] = []
    for alternatives in layout.required:
        gaps = [_missing_in_alternative(folder, alt) for alt in alternatives]
        if not all(gaps):
            continue
        started = [gap for alt, gap in zip(alternatives, gaps) if any((folder / f).is_file() for f in alt)]
        if started:  # e.g. an index without all its shards: name the exact files
            missing += [f"{layout.subdir}/{f}" for f in started[0]]
        else:
            missing.append(" | ".join(" + ".join(f"{layout.subdir}/{f}" for f in alt) for alt in alternatives))
    return missing


def available_transformer_versions(root: Path) -> List[str]:
    """Version folders present under ``<root>/transformer/`` (any name, e.g. ``480p_t2v_distilled``)."""
    folder = Path(root) / TRANSFORMER_DIR
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def unpublished_note(version: str) -> str:
    """`` (it has no published weights: <why>)`` for a version named upstream but not published, else ``""``."""
    return f" (it has no published weights: {UNPUBLISHED_VERSIONS[version]})" if version in UNPUBLISHED_VERSIONS else ""


def check_published_versions(versions: Sequence[str], option: str = "--variant") -> None:
    """ValueError naming the first of ``versions`` that no diffusers-format repository publishes, and the ones that
    exist (what ``download_weights.sh`` can fetch)."""
    for version in versions:
        if version not in TRANSFORMER_VERSIONS:
            raise ValueError(f"{option} {version!r} is no published HunyuanVideo-1.5 variant{unpublished_note(version)}"
                             f"; published variants: {', '.join(TRANSFORMER_VERSIONS)}")


class UnknownTransformerVersion(MissingCheckpointError):
    """A transformer version that is neither a known name nor a folder of the root (a typo, most often)."""

    def __init__(self, root: Path, version: str, option: str):
        present = available_transformer_versions(root)
        self.root, self.missing = Path(root), [f"{TRANSFORMER_DIR}/{version}/"]
        FileNotFoundError.__init__(
            self, f"{option} {version!r} is no transformer version of {str(root)!r}{unpublished_note(version)}: "
                  f"present under {TRANSFORMER_DIR}/: {', '.join(present) or 'none'}; known names: "
                  f"{', '.join(TRANSFORMER_VERSIONS)}. Use one of those, or fetch a known one with "
                  "`bash download_weights.sh --variant NAME`.")


def check_transformer_version(root: Path, version: str, option: str = "transformer version") -> None:
    """Reject a version that is neither a known one nor an existing folder, listing what exists; ``option`` names
    the flag that chose it."""
    if version in TRANSFORMER_VERSIONS or version in available_transformer_versions(root):
        return
    raise UnknownTransformerVersion(root, version, option)


def check_layout(root: Path, layouts: Sequence[ComponentLayout]) -> None:
    """Raise one :class:`MissingCheckpointError` listing every missing file of ``layouts``."""
    missing = [m for layout in layouts for m in missing_files(root, layout)]
    if missing:
        raise MissingCheckpointError(root, missing)


def required_layouts(transformer_versions: Sequence[str] = (DEFAULT_TRANSFORMER_VERSION,), *,
                     text_encoders: bool = True, vae: bool = True, reward: bool = False,
                     image_encoder: Optional[bool] = None) -> List[ComponentLayout]:
    """The components to check; ``image_encoder`` None: the SigLIP encoder and processor when an image-to-video
    version is among ``transformer_versions``."""
    if image_encoder is None:
        image_encoder = any(version_task(v) == "i2v" for v in transformer_versions)
    layouts = [transformer_layout(v) for v in transformer_versions]
    layouts += [VAE] if vae else []
    layouts += list(TEXT_COMPONENTS) if text_encoders else []
    layouts += list(IMAGE_COMPONENTS) if image_encoder else []
    layouts += [SCHEDULER]
    layouts += [VIDEO_REWARD] if reward else []
    return layouts


def unreadable_weight_files(root: Path, layouts: Sequence[ComponentLayout]) -> List[str]:
    """``path: reason`` for every ``*.safetensors`` file of ``layouts`` whose header cannot be read (truncated or
    not safetensors). Reads only the headers."""
    from safetensors import safe_open

    bad = []
    for component in layouts:
        for file in sorted((Path(root) / component.subdir).glob("*.safetensors")):
            try:
                with safe_open(str(file), framework="pt") as handle:
                    handle.keys()
            except Exception as err:  # SafetensorError, OSError
                bad.append(f"{file}: {err}")
    return bad


def check_model_root(root: Path, transformer_version: str, *, text_encoders: bool = True) -> None:
    """Before any model loads: the transformer version exists, no file of the layout is missing (one
    :class:`MissingCheckpointError` lists them all), every config's structural fields are sound
    (:mod:`sage_grpo.models.config_fields`) and every weight file's header is readable."""
    from sage_grpo.safe_io import CheckpointError

    from sage_grpo.models.config_fields import check_component_configs

    check_transformer_version(root, transformer_version)
    layouts = required_layouts((transformer_version,), text_encoders=text_encoders)
    check_layout(root, layouts)
    check_component_configs(root, layouts)  # the structural fields of every config.json, before anything is built
    bad = unreadable_weight_files(root, layouts)
    if bad:
        raise CheckpointError("unreadable weight file(s), truncated or not safetensors (download or copy them "
                              "again):\n" + "\n".join(f"  - {line}" for line in bad))
    from sage_grpo.models.revisions import LOCK_FILE, read_lock

    try:
        read_lock(root / LOCK_FILE)  # a run records it (run_config.yaml, the model card): checked before any load
    except ValueError as err:
        raise CheckpointError(str(err)) from None
