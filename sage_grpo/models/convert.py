"""Convert the reference's checkpoint folders (Tencent's HunyuanVideo-1.5 release) into the layout this project loads.

The reference (and Tencent's own code) reads ``ckpts/`` as Tencent ships it::

    transformer/<version>/       config.json + diffusion_pytorch_model*.safetensors (Tencent's names and config)
    vae/                         config.json + diffusion_pytorch_model.safetensors (Tencent's names and config)
    text_encoder/llm/            Qwen/Qwen2.5-VL-7B-Instruct as downloaded (vision tower and LM head included)
    text_encoder/byt5-small/     google/byt5-small (config and tokenizer; its weights are not used)
    text_encoder/Glyph-SDXL-v2/  checkpoints/byt5_model.pt (the glyph byT5 weights), assets/*.json (added tokens)
    vision_encoder/siglip/       image-to-video only; not converted (this project is text-to-video)

This project loads the diffusers layout of :mod:`sage_grpo.models.layout` (what ``download_weights.sh`` fetches from
the ``hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-<version>`` repos). What differs, component by component:

- **transformer**: Tencent's module names (``double_blocks.N.img_attn_q``, ``txt_in.individual_token_refiner``, ...)
  become diffusers' (``transformer_blocks.N.attn.to_q``, ``context_embedder.token_refiner``, ...) by the prefix table
  ``TRANSFORMER_KEYS`` (:mod:`sage_grpo.models.convert_keys`); two tensors change value: the token refiner's fused
  ``self_attn_qkv`` is split into ``to_q/to_k/to_v`` (rows in that order), and the final layer's adaLN projection stores (shift, scale) where
  diffusers' ``norm_out`` expects (scale, shift), so its two halves are swapped. The config is rebuilt from Tencent's
  (:func:`transformer_config`).
- **vae**: block names (``encoder.down.N.block.M`` -> ``encoder.down_blocks.N.resnets.M``, ``mid.attn_1.q`` ->
  ``mid_block.attentions.0.to_q``, ...; ``VAE_KEYS``), values unchanged; ``ffactor_spatial/temporal`` become
  ``spatial/temporal_compression_ratio``.
- **text_encoder** + **tokenizer**: the language model of Qwen2.5-VL alone (``Qwen2_5_VLTextModel``); the vision tower
  and the LM head are dropped (the pipeline reads hidden states only). The tokenizer is saved with right padding:
  the pipeline pads the chat-templated prompt to a fixed length and cuts the template off the front.
- **text_encoder_2** + **tokenizer_2**: byT5-small's config with the Glyph-SDXL-v2 weights, its colour and font tokens
  added to the tokenizer (the embedding rows must match their number).
- **scheduler**: ``FlowMatchEulerDiscreteScheduler`` with the version's shift (480p 5.0, 720p 9.0).

Weights are read from safetensors; the one file Tencent ships only as a pickle, ``byt5_model.pt``, is read with
``torch.load(weights_only=True)`` (:func:`sage_grpo.safe_io.load_plain`, which refuses anything but tensors and plain
containers). Every tensor is accounted for: a reference key that no rule maps, a model key that nothing produced or a
shape that does not fit stops the conversion with one :class:`ConversionError` listing them. Values are copied in
their stored dtype. The key tables were written from the reference's module definitions and the facts diffusers'
conversion script records (the qkv split and the adaLN swap); the code is our own.
"""

import re
import shutil
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence

import torch

from sage_grpo.models import layout
from sage_grpo.models.convert_keys import (GLYPH_PREFIX, LLM_DROPPED, LLM_KEYS, TRANSFORMER_KEYS, VAE_KEYS, StateDict,
                                           to_diffusers_keys)
from sage_grpo.safe_io import CheckpointError, check_output_outside_inputs, load_plain, read_json_object

REFERENCE_TRANSFORMER_DIR = "transformer"
REFERENCE_VAE_DIR = "vae"
REFERENCE_LLM_DIR = "text_encoder/llm"
REFERENCE_BYT5_DIR = "text_encoder/byt5-small"
REFERENCE_GLYPH_DIR = "text_encoder/Glyph-SDXL-v2"
GLYPH_WEIGHTS = ("checkpoints/byt5_model.safetensors", "checkpoints/byt5_model.pt")
GLYPH_COLOR_FILE = "assets/color_idx.json"
GLYPH_FONT_FILE = "assets/multilingual_10-lang_idx.json"
COMPONENTS = ("transformer", "vae", "text_encoder", "text_encoder_2", "scheduler")


class ConversionError(ValueError):
    """A reference checkpoint that cannot be converted completely (names the folder and every problem)."""


# ---------------------------------------------------------------------------------------------- reading and checking
def read_safetensors_folder(folder: Path, stem: str) -> StateDict:
    """Every ``<stem>*.safetensors`` tensor of ``folder``; pickle formats (.pt/.bin/.pth) are refused by name."""
    from safetensors.torch import load_file

    files = sorted(folder.glob(f"{stem}*.safetensors"))
    if not files:
        others = sorted(p.name for p in folder.glob("*") if p.suffix in (".pt", ".bin", ".pth", ".ckpt"))
        hint = (f" It holds {others}: pickle files are not read; convert them to safetensors first "
                "(safetensors.torch.save_file of a torch.load(..., weights_only=True) state dict)." if others else "")
        raise ConversionError(f"{folder}: no {stem}*.safetensors weight file.{hint}")
    state: StateDict = {}
    for file in files:
        try:
            state.update(load_file(str(file)))
        except Exception as err:  # SafetensorError, OSError
            raise CheckpointError(f"cannot read {file}: {err} (truncated or not a safetensors file)") from None
    return state


def read_json(path: Path) -> Dict:
    if not path.is_file():
        raise ConversionError(f"missing {path}")
    return read_json_object(path, "the config", "use the authors' released folder", error=ConversionError)


def _listing(title: str, keys: Sequence[str], limit: int = 20) -> str:
    shown = "\n".join(f"    {k}" for k in keys[:limit])
    more = f"\n    ... ({len(keys)} in all)" if len(keys) > limit else ""
    return f"  {title} ({len(keys)}):\n{shown}{more}"


def check_complete(what: str, produced: StateDict, model: torch.nn.Module, unmapped: Sequence[str] = ()) -> None:
    """Every key of ``model`` produced with its shape, and no reference key left over; else one error listing all."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(produced))
    unexpected = sorted(set(produced) - set(expected))
    mis_shaped = sorted(f"{k}: converted {tuple(produced[k].shape)}, model {expected[k]}"
                        for k in set(produced) & set(expected) if tuple(produced[k].shape) != expected[k])
    problems = [_listing(title, keys) for title, keys in (
        ("reference keys no rule maps", sorted(unmapped)), ("model keys not produced", missing),
        ("converted keys the model does not have", unexpected), ("shape mismatches", mis_shaped)) if keys]
    if problems:
        raise ConversionError(f"{what}: the converted weights do not match the model:\n" + "\n".join(problems))


def _empty_model(build: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """The model's structure without allocating its weights (they are assigned from the converted state)."""
    from accelerate import init_empty_weights

    with init_empty_weights():
        return build()


def _save(model: torch.nn.Module, state: StateDict, folder: Path) -> None:
    from transformers.utils import logging as hf_logging

    model.load_state_dict(state, strict=True, assign=True)
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    progress_bar_was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one "[convert] <component>" line per component is the progress shown
    try:
        model.save_pretrained(folder, max_shard_size="5GB")
    finally:
        if progress_bar_was_enabled:
            hf_logging.enable_progress_bar()


# ---------------------------------------------------------------------------------------------- components
def _resolution(version: str) -> str:
    from sage_grpo.models.resolution import RESOLUTION_BUCKET_BASE

    resolution = version.split("_")[0]
    if resolution not in RESOLUTION_BUCKET_BASE:
        raise ConversionError(f"transformer version {version!r}: its name must start with one of "
                              f"{sorted(RESOLUTION_BUCKET_BASE)} (e.g. 480p_t2v)")
    return resolution


def transformer_config(reference: Dict, state: StateDict, version: str) -> Dict:
    """diffusers' ``HunyuanVideo15Transformer3DModel`` config from Tencent's config.json and the weights' shapes."""
    from sage_grpo.models.resolution import RESOLUTION_BUCKET_BASE

    needed = ("hidden_size", "heads_num", "mm_double_blocks_depth", "rope_dim_list", "patch_size", "text_states_dim",
              "vision_states_dim", "mlp_width_ratio")
    absent = [k for k in needed if k not in reference]
    if absent:
        raise ConversionError(f"transformer/{version}/config.json lacks {absent} (is it Tencent's "
                              "HunyuanVideo_1_5_DiffusionTransformer config?)")
    if reference.get("mm_single_blocks_depth", 0):
        raise ConversionError(f"transformer/{version}: {reference['mm_single_blocks_depth']} single-stream blocks; "
                              "HunyuanVideo-1.5 (and diffusers' class) has double-stream blocks only")
    if reference.get("qk_norm_type", "rms") != "rms":
        raise ConversionError(f"transformer/{version}: qk_norm_type {reference['qk_norm_type']!r}; only 'rms' maps "
                              "to diffusers' rms_norm")
    refiner_blocks = {m.group(1) for m in (re.match(r"txt_in\.individual_token_refiner\.blocks\.(\d+)\.", k)
                                           for k in state) if m}
    for key in ("img_in.proj.weight", "byt5_in.fc1.weight"):
        if key not in state:
            raise ConversionError(f"transformer/{version}: no {key} among its weights (is it HunyuanVideo-1.5's?)")
    patch_t, patch_h, patch_w = reference["patch_size"]
    if patch_h != patch_w:
        raise ConversionError(f"transformer/{version}: patch_size {reference['patch_size']} is not square in space")
    resolution = _resolution(reference.get("ideal_resolution") or version)
    return dict(
        in_channels=int(state["img_in.proj.weight"].shape[1]),
        out_channels=int(reference.get("out_channels") or reference["in_channels"]),
        num_attention_heads=int(reference["heads_num"]),
        attention_head_dim=int(reference["hidden_size"]) // int(reference["heads_num"]),
        num_layers=int(reference["mm_double_blocks_depth"]),
        num_refiner_layers=len(refiner_blocks),
        mlp_ratio=float(reference["mlp_width_ratio"]),
        patch_size=int(patch_h), patch_size_t=int(patch_t),
        qk_norm="rms_norm",
        text_embed_dim=int(reference["text_states_dim"]),
        text_embed_2_dim=int(state["byt5_in.fc1.weight"].shape[1]),
        image_embed_dim=int(reference["vision_states_dim"]),
        rope_theta=float(reference.get("rope_theta", 256.0)),
        rope_axes_dim=tuple(int(d) for d in reference["rope_dim_list"]),
        target_size=RESOLUTION_BUCKET_BASE[resolution],
        task_type=reference.get("ideal_task") or ("i2v" if "i2v" in version else "t2v"),
        use_meanflow=bool(reference.get("use_meanflow", False)),
    )


def convert_transformer(reference_root: Path, version: str, output: Path) -> None:
    from diffusers import HunyuanVideo15Transformer3DModel

    folder = reference_root / REFERENCE_TRANSFORMER_DIR / version
    state = read_safetensors_folder(folder, "diffusion_pytorch_model")
    config = transformer_config(read_json(folder / "config.json"), state, version)
    converted, unmapped = to_diffusers_keys(state, TRANSFORMER_KEYS)
    model = _empty_model(lambda: HunyuanVideo15Transformer3DModel(**config))
    check_complete(f"transformer {folder}", converted, model, unmapped)
    _save(model, converted, output / layout.transformer_layout(version).subdir)


VAE_RENAMED = {"ffactor_spatial": "spatial_compression_ratio", "ffactor_temporal": "temporal_compression_ratio"}
VAE_KEPT = ("in_channels", "out_channels", "latent_channels", "block_out_channels", "layers_per_block",
            "downsample_match_channel", "upsample_match_channel", "scaling_factor", "spatial_compression_ratio",
            "temporal_compression_ratio")
VAE_UNUSED = ("sample_size", "sample_tsize", "shift_factor")  # tiling sizes; diffusers' VAE has no shift


def vae_config(reference: Dict) -> Dict:
    """diffusers' ``AutoencoderKLHunyuanVideo15`` config from Tencent's; a key it does not know is an error."""
    if reference.get("shift_factor"):
        raise ConversionError(f"vae/config.json: shift_factor {reference['shift_factor']}; diffusers' "
                              "AutoencoderKLHunyuanVideo15 (and the pipeline) apply no latent shift")
    unknown = sorted(k for k in reference if not k.startswith("_") and k not in VAE_KEPT + VAE_UNUSED
                     and k not in VAE_RENAMED)
    if unknown:
        raise ConversionError(f"vae/config.json: unknown keys {unknown} (known: {sorted(VAE_KEPT + VAE_UNUSED)}, "
                              f"{sorted(VAE_RENAMED)})")
    return {VAE_RENAMED.get(k, k): v for k, v in reference.items() if VAE_RENAMED.get(k, k) in VAE_KEPT}


def convert_vae(reference_root: Path, output: Path) -> None:
    from diffusers import AutoencoderKLHunyuanVideo15

    folder = reference_root / REFERENCE_VAE_DIR
    state = read_safetensors_folder(folder, "diffusion_pytorch_model")
    config = vae_config(read_json(folder / "config.json"))
    converted, unmapped = to_diffusers_keys(state, VAE_KEYS)
    model = _empty_model(lambda: AutoencoderKLHunyuanVideo15(**config))
    check_complete(f"vae {folder}", converted, model, unmapped)
    _save(model, converted, output / layout.VAE.subdir)


def convert_llm(reference_root: Path, output: Path) -> None:
    """``text_encoder/llm`` (Qwen2.5-VL) -> ``text_encoder/`` (its language model) and ``tokenizer/``."""
    from transformers import AutoConfig, Qwen2_5_VLTextModel, Qwen2Tokenizer

    folder = reference_root / REFERENCE_LLM_DIR
    read_json(folder / "config.json")  # a clear error when the folder is not there
    text_config = AutoConfig.from_pretrained(folder, local_files_only=True).get_text_config()
    state = read_safetensors_folder(folder, "model")
    kept = {k: v for k, v in state.items() if not k.startswith(LLM_DROPPED)}
    converted, unmapped = to_diffusers_keys(kept, LLM_KEYS)
    model = _empty_model(lambda: Qwen2_5_VLTextModel(text_config))
    check_complete(f"text encoder {folder}", converted, model, unmapped)
    _save(model, converted, output / layout.TEXT_ENCODER.subdir)
    tokenizer = Qwen2Tokenizer.from_pretrained(folder, local_files_only=True, padding_side="right")
    tokenizer.save_pretrained(output / layout.TOKENIZER.subdir)


def glyph_tokens(glyph_dir: Path) -> List[str]:
    """The colour and font tokens Glyph-SDXL-v2 adds to byT5's tokenizer, in its order (colours, then fonts)."""
    colors = read_json(glyph_dir / GLYPH_COLOR_FILE)
    fonts = read_json(glyph_dir / GLYPH_FONT_FILE)
    return [f"<color-{i}>" for i in range(len(colors))] + [f"<{code[:2]}-font-{fonts[code]}>" for code in fonts]


def read_glyph_weights(glyph_dir: Path) -> StateDict:
    """The glyph byT5 encoder weights keyed as ``T5EncoderModel``'s (``encoder.*``)."""
    found = [glyph_dir / name for name in GLYPH_WEIGHTS if (glyph_dir / name).is_file()]
    if not found:
        raise ConversionError(f"{glyph_dir}: none of {list(GLYPH_WEIGHTS)} (the Glyph-SDXL-v2 byT5 weights)")
    if found[0].suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(found[0]))
    else:
        state = load_plain(found[0], "Glyph-SDXL-v2 byT5 weights")
        state = state.get("state_dict", state) if isinstance(state, dict) else state
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConversionError(f"{found[0]}: expected a dict of tensors (optionally under 'state_dict')")
    return {"encoder." + (k[len(GLYPH_PREFIX):] if k.startswith(GLYPH_PREFIX) else k): v for k, v in state.items()}


def convert_byt5(reference_root: Path, output: Path, glyph_dir: Optional[Path] = None) -> None:
    """byT5-small's config and tokenizer + Glyph-SDXL-v2's weights and tokens -> ``text_encoder_2``, ``tokenizer_2``."""
    from transformers import ByT5Tokenizer, T5Config, T5EncoderModel

    byt5_dir = reference_root / REFERENCE_BYT5_DIR
    glyph_dir = glyph_dir or reference_root / REFERENCE_GLYPH_DIR
    read_json(byt5_dir / "config.json")
    tokenizer = ByT5Tokenizer.from_pretrained(byt5_dir, local_files_only=True)
    tokenizer.add_tokens(glyph_tokens(glyph_dir), special_tokens=True)
    state = read_glyph_weights(glyph_dir)
    rows = state.get("encoder.embed_tokens.weight")
    if rows is not None and rows.shape[0] != len(tokenizer):
        raise ConversionError(f"{glyph_dir}: the embedding has {rows.shape[0]} rows but byT5's tokenizer with the "
                              f"glyph tokens of {GLYPH_COLOR_FILE} and {GLYPH_FONT_FILE} has {len(tokenizer)}: the "
                              "assets do not belong to these weights")
    config = T5Config.from_pretrained(byt5_dir, local_files_only=True)
    config.vocab_size = len(tokenizer)
    if rows is not None:
        state["shared.weight"] = rows  # tied to encoder.embed_tokens in T5EncoderModel
    model = _empty_model(lambda: T5EncoderModel(config))
    check_complete(f"byT5 encoder {glyph_dir}", state, model)
    _save(model, state, output / layout.TEXT_ENCODER_2.subdir)
    tokenizer.save_pretrained(output / layout.TOKENIZER_2.subdir)


def write_scheduler(version: str, output: Path) -> None:
    from diffusers import FlowMatchEulerDiscreteScheduler

    from sage_grpo.config.validation import FLOW_SHIFT_BY_VERSION

    shift = FLOW_SHIFT_BY_VERSION[f"{_resolution(version)}_t2v"]
    FlowMatchEulerDiscreteScheduler(shift=shift).save_pretrained(output / layout.SCHEDULER.subdir)


# ---------------------------------------------------------------------------------------------- the whole root
def reference_versions(reference_root: Path) -> List[str]:
    folder = Path(reference_root) / REFERENCE_TRANSFORMER_DIR
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def output_folders(versions: Sequence[str], components: Iterable[str]) -> List[str]:
    """The folders (relative to the output root) a conversion writes."""
    subdirs = {"transformer": [layout.transformer_layout(v).subdir for v in versions],
               "vae": [layout.VAE.subdir], "text_encoder": [layout.TEXT_ENCODER.subdir, layout.TOKENIZER.subdir],
               "text_encoder_2": [layout.TEXT_ENCODER_2.subdir, layout.TOKENIZER_2.subdir],
               "scheduler": [layout.SCHEDULER.subdir]}
    return [folder for component in components for folder in subdirs[component]]


def convert_reference_checkpoint(reference_root, output, *, versions: Optional[Sequence[str]] = None,
                                 components: Sequence[str] = COMPONENTS, overwrite: bool = False,
                                 glyph_dir=None, log: Callable[[str], None] = print) -> Path:
    """Convert ``reference_root`` (Tencent's layout) into ``output`` (this project's); returns ``output``.

    The converted folders are written under ``<output>/.convert.partial`` and moved into place only when every
    component converted, so a failure leaves ``output`` as it was. A folder of ``output`` the conversion would
    write must not exist unless ``overwrite`` (then it is replaced); other contents of ``output`` (``VideoReward/``,
    a README) are left alone.
    """
    reference_root, output = Path(reference_root), Path(output)
    versions = _checked_request(reference_root, output, versions, components, overwrite, glyph_dir)
    staging = output / ".convert.partial"
    shutil.rmtree(staging, ignore_errors=True)
    steps = [(f"transformer {v}", lambda v=v: convert_transformer(reference_root, v, staging)) for v in versions
             if "transformer" in components]
    steps += [(name, step) for name, step in (
        ("vae", lambda: convert_vae(reference_root, staging)),
        ("text_encoder", lambda: convert_llm(reference_root, staging)),
        ("text_encoder_2", lambda: convert_byt5(reference_root, staging, glyph_dir and Path(glyph_dir))),
        ("scheduler", lambda: write_scheduler(versions[0], staging))) if name in components]
    try:
        for name, step in steps:
            log(f"[convert] {name}")
            step()
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _move_into_place(staging, output, output_folders(versions, components))
    return output


def _checked_request(reference_root: Path, output: Path, versions: Optional[Sequence[str]],
                     components: Sequence[str], overwrite: bool, glyph_dir) -> List[str]:
    """The transformer versions to convert (default: every one under the reference root), once the request is
    checked: the root exists, the components are known, the versions are there, ``output`` is neither the root nor
    inside an input, and it holds none of the folders the conversion writes unless ``overwrite``."""
    if not reference_root.is_dir():
        raise ConversionError(f"reference root {reference_root} is not a directory")
    unknown = sorted(set(components) - set(COMPONENTS))
    if unknown:
        raise ConversionError(f"unknown components {unknown}; choose from {list(COMPONENTS)}")
    available = reference_versions(reference_root)
    versions = list(versions or available)
    absent = [v for v in versions if v not in available]
    if ("transformer" in components or "scheduler" in components) and (absent or not versions):
        raise ConversionError(f"transformer version(s) {absent or versions} not under "
                              f"{reference_root / REFERENCE_TRANSFORMER_DIR}; present: {available}")
    if output.resolve() == reference_root.resolve():
        raise ConversionError(f"--output {output} is the reference root: its text_encoder/ would be replaced; "
                              "write the converted layout to another folder")
    try:
        check_output_outside_inputs(output, "--output", {"--reference_root": reference_root, "--glyph_dir": glyph_dir})
    except ValueError as err:
        raise ConversionError(str(err)) from None
    existing = [f for f in output_folders(versions, components) if (output / f).exists() or (output / f).is_symlink()]
    if existing and not overwrite:
        raise ConversionError(f"{output} already holds {existing}; pass --overwrite to replace them, or choose "
                              "another --output")
    return versions


def _move_into_place(staging: Path, output: Path, folders: Sequence[str]) -> None:
    """Replace each of ``folders`` of ``output`` with the converted one in ``staging``, then remove ``staging``."""
    for folder in folders:
        target = output / folder
        if target.is_symlink():  # download_weights.sh links the folders into .hf/ snapshots: replace the link only
            target.unlink()
        elif target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        (staging / folder).rename(target)
    shutil.rmtree(staging)
