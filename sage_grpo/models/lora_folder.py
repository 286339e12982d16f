"""The LoRA adapter folder, peft's format: what ``checkpoint-N/lora/`` and ``scripts/export_checkpoint.py --format
lora`` write, and what ``--pretrained_lora_path``, ``--lora_path`` and the export read back (checked before peft builds
anything from it)::

    adapter_config.json          LoraConfig.save_pretrained
    adapter_model.safetensors    keys base_model.model.<module>.lora_{A,B}.weight

It loads with ``peft.PeftModel.from_pretrained(transformer, folder)``, and with diffusers as
``transformer.load_lora_adapter(folder, weight_name="adapter_model.safetensors", prefix="base_model.model",
adapter_name="default")``: the file header also carries the config under diffusers' ``lora_adapter_metadata`` key
(prefixed like the weights, as diffusers' pipeline-level files prefix theirs with ``transformer.``), so diffusers
restores r and alpha exactly instead of guessing alpha = r from the shapes.
"""

import copy
import json
import re
from pathlib import Path
from typing import Dict

import torch

from sage_grpo.safe_io import CheckpointError, check_finite, read_json_object

PEFT_PREFIX = "base_model.model."
DIFFUSERS_PIPELINE_PREFIX = "transformer."
ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
DIFFUSERS_METADATA_KEY = "lora_adapter_metadata"  # diffusers.loaders.lora_base.LORA_ADAPTER_METADATA_KEY

StateDict = Dict[str, torch.Tensor]


def strip_key_prefix(state: StateDict) -> StateDict:
    """Drop peft's ``base_model.model.`` or diffusers' ``transformer.`` prefix when every key carries it."""
    for prefix in (PEFT_PREFIX, DIFFUSERS_PIPELINE_PREFIX):
        if state and all(k.startswith(prefix) for k in state):
            return {k[len(prefix):]: v for k, v in state.items()}
    return state


def _metadata(config) -> Dict[str, str]:
    fields = {k: (sorted(v) if isinstance(v, set) else v) for k, v in config.to_dict().items()}
    return {"format": "pt", DIFFUSERS_METADATA_KEY: json.dumps({PEFT_PREFIX + k: v for k, v in fields.items()})}


def write_adapter_folder(folder: Path, config, state: StateDict) -> Path:
    """Write ``adapter_config.json`` + ``adapter_model.safetensors`` (peft format, see the module docstring)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(config)
    config.inference_mode = True  # what peft writes; PeftModel.from_pretrained(..., is_trainable=True) overrides it
    config.base_model_name_or_path = None
    config.save_pretrained(str(folder))
    tensors = {PEFT_PREFIX + k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    save_file(tensors, str(folder / ADAPTER_WEIGHTS_FILE), metadata=_metadata(config))
    return folder


def is_adapter_folder(path: Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG_FILE).is_file()


MAX_ADAPTER_CONFIG_BYTES = 1 << 20
# peft settings that build something other than plain LoRA on the layers (DoRA magnitudes, full copies of modules,
# extra tokens, replicated layers, per-layer ranks) or that rewrite the base weights while initialising (PiSSA, OLoRA,
# LoftQ, CorDA, EVA subtract the adapter from W): a file read back must leave them unset
_PLAIN_LORA_UNSET = ("use_dora", "modules_to_save", "layer_replication", "rank_pattern", "alpha_pattern",
                     "megatron_config", "trainable_token_indices", "target_parameters", "lora_bias", "use_qalora",
                     "alora_invocation_tokens", "arrow_config", "use_bdlora")
_PLAIN_INIT = (True, False, "gaussian")


def _is_finite_number(value) -> bool:
    return type(value) in (int, float) and -1e300 < value < 1e300


def check_adapter_folder(folder: Path) -> Dict:
    """The adapter folder's ``adapter_config.json``, checked like the LoRA flags before peft builds anything from it:
    plain LoRA (see ``_PLAIN_LORA_UNSET``), ``r`` a positive integer equal to the rank of the weight file's tensors
    (a crafted ``r`` allocates r x width per layer), ``lora_alpha`` a number in (0, 1e300) (NaN sampled black videos),
    ``lora_dropout`` in [0, 1), ``target_modules`` a regex or names. One CheckpointError naming the file and the key."""
    from safetensors import safe_open

    folder = Path(folder)
    path, weights = folder / ADAPTER_CONFIG_FILE, folder / ADAPTER_WEIGHTS_FILE
    if not path.is_file() or not weights.is_file():
        raise FileNotFoundError(f"{folder} is not a LoRA adapter folder: expected {ADAPTER_CONFIG_FILE} and "
                                f"{ADAPTER_WEIGHTS_FILE} (peft's save_pretrained format)")
    config = read_json_object(path, "the LoRA adapter config", "save the adapter again (peft's save_pretrained)",
                              max_bytes=MAX_ADAPTER_CONFIG_BYTES)

    def bad(key: str, wanted: str) -> CheckpointError:
        return CheckpointError(f"{path}: {key} must be {wanted}, got {str(config.get(key))[:100]!r}")

    if config.get("peft_type", "LORA") != "LORA":
        raise bad("peft_type", "'LORA'")
    for key in _PLAIN_LORA_UNSET:
        if config.get(key):
            raise bad(key, "unset (sage-grpo reads plain LoRA adapters)")
    if config.get("init_lora_weights", True) not in _PLAIN_INIT:
        raise bad("init_lora_weights", "true, false or 'gaussian' (other initialisations rewrite the base weights)")
    rank, alpha, dropout = config.get("r"), config.get("lora_alpha", 8), config.get("lora_dropout", 0.0)
    if type(rank) is not int or rank < 1:
        raise bad("r", "a positive integer")
    if not _is_finite_number(alpha) or alpha <= 0:
        raise bad("lora_alpha", "a number > 0 and < 1e300")
    if not _is_finite_number(dropout) or not 0.0 <= dropout < 1.0:
        raise bad("lora_dropout", "a number in [0, 1)")
    targets = config.get("target_modules")
    if not (isinstance(targets, str) and targets) and not (
            isinstance(targets, list) and targets and all(isinstance(t, str) and t for t in targets)):
        raise bad("target_modules", "a regex or a list of module names")
    if isinstance(targets, str):
        try:
            re.compile(targets)
        except re.error as err:
            raise CheckpointError(f"{path}: target_modules is not a valid regex: {err}") from None
    try:
        with safe_open(str(weights), "pt") as handle:
            ranks = {handle.get_slice(key).get_shape()[0] for key in handle.keys() if ".lora_A." in key}
    except Exception as err:  # noqa: BLE001 - a truncated or garbled file fails in several ways
        raise CheckpointError(f"cannot read {weights}: {str(err)[:200]} (truncated or not a safetensors "
                              "file)") from None
    if ranks != {rank}:
        raise CheckpointError(f"{path}: r is {rank} but the lora_A tensors of {weights.name} have rank "
                              f"{sorted(ranks)[:5] or 'none (no lora_A tensor)'}")
    return config


def read_adapter_folder(folder: Path):
    """(LoraConfig, peft-key state) of an adapter folder (peft's ``save_pretrained`` format, ours included), its
    config checked (:func:`check_adapter_folder`) and its tensors finite."""
    from peft import LoraConfig
    from safetensors.torch import load_file

    folder = Path(folder)
    check_adapter_folder(folder)
    config = LoraConfig.from_pretrained(str(folder))
    state = strip_key_prefix(load_file(str(folder / ADAPTER_WEIGHTS_FILE)))
    check_finite(state, str(folder / ADAPTER_WEIGHTS_FILE))
    return config, state
