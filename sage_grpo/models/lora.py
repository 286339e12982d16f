"""LoRA on the HunyuanVideo-1.5 transformer with peft: training adapters, KL references and the adapter folder.

Training (``--use_lora``). The base weights are frozen and peft injects an adapter named ``default`` into the target
``nn.Linear`` layers (diffusers' ``PeftAdapterMixin`` path); W x + (alpha / r) * B A x with A kaiming-uniform and B = 0,
so the policy starts exactly at the base model. The initialisation draws from a torch RNG seeded with ``--seed`` and
forked, so two runs with the same seed start from the same adapter and the caller's RNG stream is untouched.

Target modules (``--lora_target_modules``), resolved by :func:`resolve_target_modules`:

* unset or ``all-linear``: every ``nn.Linear`` inside ``transformer_blocks.N`` (14 per dual-stream block: q/k/v/out of
  both streams, the two MLPs and the two AdaLN modulations), written as one full-match regex. Departure: peft's own
  ``all-linear`` would also adapt the embedders, the token refiner and ``proj_out``;
* one value with regex characters (``*+?[](){}|^$\\``): a peft full-match regex over module names;
* plain names (``to_q to_k``): peft's suffix match, which also reaches the refiner blocks' layers of that name.

KL references without a second transformer in memory (:class:`LoraTraining`):

* the fixed reference (and the moving anchor before its first refresh) is the base model: the policy runs with its
  adapters disabled, which peft implements as the bare base layer, so it reproduces the base model bit for bit;
* the moving anchor is a second adapter ``anchor`` in the same layers. A refresh copies the ``default`` tensors into
  it; reference passes activate it. Same layers, same arithmetic, copied tensors: the anchor pass equals what the
  policy computed at the refresh, exactly (no tensor swapping, so an exception mid-pass cannot corrupt the policy).

Reference passes run in eval mode (no LoRA dropout) and restore the active adapter, the training flag and every
``requires_grad`` flag afterwards (peft's ``set_adapter`` / ``disable_adapters`` toggle them).

Adapter folder (what ``checkpoint-N/lora/`` and ``scripts/export_checkpoint.py --format lora`` write), peft's
format::

    adapter_config.json          LoraConfig.save_pretrained
    adapter_model.safetensors    keys base_model.model.<module>.lora_{A,B}.weight

It loads with ``peft.PeftModel.from_pretrained(transformer, folder)``, and with diffusers as
``transformer.load_lora_adapter(folder, weight_name="adapter_model.safetensors", prefix="base_model.model",
adapter_name="default")``: the file header also carries the config under diffusers' ``lora_adapter_metadata`` key
(prefixed like the weights, as diffusers' pipeline-level files prefix theirs with ``transformer.``), so diffusers
restores r and alpha exactly instead of guessing alpha = r from the shapes.
"""

import contextlib
import copy
import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch

from sage_grpo.safe_io import CheckpointError, check_finite, read_json_object

POLICY_ADAPTER = "default"
ANCHOR_ADAPTER = "anchor"
PEFT_PREFIX = "base_model.model."
DIFFUSERS_PIPELINE_PREFIX = "transformer."
ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
DIFFUSERS_METADATA_KEY = "lora_adapter_metadata"  # diffusers.loaders.lora_base.LORA_ADAPTER_METADATA_KEY
ALL_LINEAR = "all-linear"
_REGEX_CHARACTERS = set("*+?[](){}|^$\\")
_ADAPTER_TENSOR = re.compile(r"\.(lora_A|lora_B)\.([^.]+)\.(weight|bias)$")
_PEFT_KEY = re.compile(r"\.(lora_A|lora_B)\.(weight|bias)$")

StateDict = Dict[str, torch.Tensor]


# ---------------------------------------------------------------------------------------------------- configuration
def block_linear_pattern(transformer: torch.nn.Module) -> str:
    """Full-match regex of every ``nn.Linear`` inside ``transformer_blocks.N`` (the default ``all-linear`` target)."""
    suffixes = sorted({name.split(".", 2)[2] for name, module in transformer.named_modules()
                       if isinstance(module, torch.nn.Linear) and re.match(r"transformer_blocks\.\d+\.", name)})
    if not suffixes:
        raise ValueError("the transformer has no nn.Linear inside transformer_blocks.N to put LoRA adapters on")
    return r"transformer_blocks\.\d+\.(" + "|".join(re.escape(s) for s in suffixes) + ")"


def _is_regex(target: str) -> bool:
    return bool(_REGEX_CHARACTERS & set(target))


def check_targets(targets: Optional[Sequence[str]]) -> List[str]:
    """The non-empty ``--lora_target_modules`` values, rejecting combinations and regexes that cannot work."""
    targets = [t for t in (targets or []) if t.strip()]
    if ALL_LINEAR in targets and len(targets) > 1:
        raise ValueError(f"--lora_target_modules: {ALL_LINEAR!r} cannot be combined with other names ({targets})")
    if len(targets) == 1 and _is_regex(targets[0]):
        try:
            re.compile(targets[0])
        except re.error as err:
            raise ValueError(f"--lora_target_modules {targets[0]!r} is not a valid regex: {err}") from None
    return targets


def resolve_target_modules(transformer: torch.nn.Module, targets: Optional[Sequence[str]]) -> Union[str, List[str]]:
    """``--lora_target_modules`` -> peft ``target_modules`` (a full-match regex string, or names to suffix-match)."""
    targets = check_targets(targets)
    if not targets or targets == [ALL_LINEAR]:
        return block_linear_pattern(transformer)
    if len(targets) == 1 and _is_regex(targets[0]):
        return targets[0]
    return list(targets)


def check_lora_settings(r: int, alpha: float, dropout: float, targets: Optional[Sequence[str]],
                        pretrained_path: Optional[str]) -> None:
    """Everything about a LoRA run that can be wrong without a model, so it fails before any weights load."""
    if pretrained_path:
        folder = Path(pretrained_path)
        if not is_adapter_folder(folder) or not (folder / ADAPTER_WEIGHTS_FILE).is_file():
            # (a folder of peft's older adapter_model.bin is refused too: only safetensors weights are read)
            raise FileNotFoundError(f"--pretrained_lora_path {pretrained_path}: expected a LoRA adapter folder with "
                                    f"{ADAPTER_CONFIG_FILE} and {ADAPTER_WEIGHTS_FILE} (e.g. checkpoint-N/lora, or "
                                    "scripts/export_checkpoint.py --format lora)")
        check_adapter_folder(folder)
        return
    _check_numbers(r, alpha, dropout)
    check_targets(targets)


def _check_numbers(r: int, alpha: float, dropout: float) -> None:
    if r < 1 or alpha <= 0 or not 0.0 <= dropout < 1.0:
        raise ValueError(f"LoRA needs --lora_r >= 1, --lora_alpha > 0 and 0 <= --lora_dropout < 1; got r={r}, "
                         f"alpha={alpha}, dropout={dropout}")


def make_lora_config(r: int, alpha: float, dropout: float, target_modules: Union[str, List[str]]):
    """peft LoraConfig: scale alpha / r, A kaiming-uniform and B = 0 at initialisation."""
    from peft import LoraConfig

    _check_numbers(r, alpha, dropout)
    return LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=target_modules,
                      init_lora_weights=True)


# ---------------------------------------------------------------------------------------------------- adapter tensors
def peft_key(parameter_name: str) -> Tuple[str, str]:
    """(adapter, peft key) of an injected parameter: ``x.lora_A.default.weight`` -> ("default", ``x.lora_A.weight``)."""
    match = _ADAPTER_TENSOR.search(parameter_name)
    if match is None:
        raise ValueError(f"{parameter_name!r} is not a LoRA adapter tensor")
    layer, adapter, kind = match.groups()
    return adapter, f"{parameter_name[:match.start()]}.{layer}.{kind}"


def is_adapter_key(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def adapter_parameters(transformer: torch.nn.Module, adapter: str) -> Dict[str, torch.nn.Parameter]:
    """{peft key: parameter} of one adapter, in module order."""
    found = {}
    for name, param in transformer.named_parameters():
        if is_adapter_key(name):
            owner, key = peft_key(name)
            if owner == adapter:
                found[key] = param
    return found


@torch.no_grad()
def load_adapter_state(transformer: torch.nn.Module, state: StateDict, adapter: str = POLICY_ADAPTER) -> None:
    """Copy ``state`` (peft keys) into ``adapter``; every key must match by name and shape."""
    params = adapter_parameters(transformer, adapter)
    missing, unexpected = sorted(set(params) - set(state)), sorted(set(state) - set(params))
    mis_shaped = sorted(k for k in set(params) & set(state) if params[k].shape != state[k].shape)
    if missing or unexpected or mis_shaped:
        raise KeyError(f"LoRA weights do not match adapter {adapter!r}: missing {missing[:5]}, unexpected "
                       f"{unexpected[:5]}, mis-shaped {mis_shaped[:5]} ({len(params)} adapter tensors expected)")
    for key, param in params.items():
        param.copy_(state[key])


def strip_key_prefix(state: StateDict) -> StateDict:
    """Drop peft's ``base_model.model.`` or diffusers' ``transformer.`` prefix when every key carries it."""
    for prefix in (PEFT_PREFIX, DIFFUSERS_PIPELINE_PREFIX):
        if state and all(k.startswith(prefix) for k in state):
            return {k[len(prefix):]: v for k, v in state.items()}
    return state


def policy_adapter_state(state: StateDict) -> StateDict:
    """The trained adapter's tensors under peft keys, from any saved form: peft keys already
    (``x.lora_A.weight``), or the parameter names of an adapter-injected model (``x.lora_A.default.weight``, e.g. a
    sharded checkpoint's gathered weights or a full DCP state dict, whose frozen ``base_layer`` tensors are dropped)."""
    adapter_tensors = {k: v for k, v in state.items() if is_adapter_key(k)}
    if all(_PEFT_KEY.search(k) for k in adapter_tensors):
        return adapter_tensors
    result = {}
    for name, tensor in adapter_tensors.items():
        owner, key = peft_key(name)
        if owner == POLICY_ADAPTER:
            result[key] = tensor
    return result


def add_adapter(transformer: torch.nn.Module, config, adapter: str = POLICY_ADAPTER, seed: int = 0) -> None:
    """Inject ``adapter`` (peft) with its initialisation drawn from a forked RNG seeded with ``seed``."""
    devices = [transformer.device] if getattr(transformer, "device", torch.device("cpu")).type == "cuda" else []
    with torch.random.fork_rng(devices=devices), warnings.catch_warnings():
        # peft warns that a second adapter makes a multi-adapter model: the anchor adapter is exactly that
        warnings.filterwarnings("ignore", message="Already found a `peft_config` attribute")
        torch.manual_seed(seed)
        transformer.add_adapter(copy.deepcopy(config), adapter_name=adapter)


# ---------------------------------------------------------------------------------------------------- adapter folder
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


@contextlib.contextmanager
def adapter_fits(source) -> Iterator[None]:
    """An adapter read from ``source`` (None: made here) that does not fit the transformer (its target_modules match
    no layer, its tensors other layers or shapes) as one CheckpointError naming ``source``."""
    try:
        yield
    except (ValueError, KeyError) as err:  # peft's NoMatchingPeftModuleError is a ValueError
        if source is None:
            raise
        reason = err.args[0] if err.args else type(err).__name__
        raise CheckpointError(f"{source}: the LoRA adapter does not fit this transformer ({str(reason)[:300]})") \
            from None


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


def merge_adapter(transformer: torch.nn.Module, adapter: str = POLICY_ADAPTER) -> torch.nn.Module:
    """Fold ``adapter`` into the base weights (W += alpha/r * B A) and remove every LoRA layer: a plain transformer."""
    transformer.fuse_lora(lora_scale=1.0, adapter_names=[adapter])
    transformer.unload_lora()
    return transformer


# ---------------------------------------------------------------------------------------------------- training state
@dataclass
class LoraTraining:
    """The adapters of a LoRA run on one transformer: the trained ``default`` and, for the moving anchor, ``anchor``.

    ``anchor_ready`` is False until the first refresh: until then the anchor, like the fixed reference, is the base
    model (adapters disabled), as the full fine-tune's reference is the base model until its first copy.
    """

    transformer: torch.nn.Module
    config: object  # peft LoraConfig of the trained adapter
    has_anchor: bool
    anchor_ready: bool = False

    @classmethod
    def create(cls, transformer: torch.nn.Module, *, r: int, alpha: float, dropout: float,
               target_modules: Optional[Sequence[str]], pretrained_path: Optional[str], with_anchor: bool,
               seed: int, dtype: torch.dtype) -> "LoraTraining":
        """Freeze ``transformer`` and add the adapters (new, or loaded from ``pretrained_path``) in ``dtype``.

        A pretrained adapter is copied in after the cast: peft creates the adapter layers in the base weights' dtype,
        so copying first would round fp32 adapter weights to a bf16 base's precision."""
        transformer.requires_grad_(False)
        if pretrained_path:
            config, state = read_adapter_folder(Path(pretrained_path))
        else:
            state = None
            config = make_lora_config(r, alpha, dropout, resolve_target_modules(transformer, target_modules))
        with adapter_fits(pretrained_path):
            add_adapter(transformer, config, POLICY_ADAPTER, seed)
        if with_anchor:
            add_adapter(transformer, config, ANCHOR_ADAPTER, seed)
        transformer.set_adapter(POLICY_ADAPTER)
        for adapter in (POLICY_ADAPTER, ANCHOR_ADAPTER) if with_anchor else (POLICY_ADAPTER,):
            for param in adapter_parameters(transformer, adapter).values():
                param.data = param.data.to(dtype)
                param.requires_grad_(adapter == POLICY_ADAPTER)
        if state is not None:
            with adapter_fits(pretrained_path):
                load_adapter_state(transformer, state, POLICY_ADAPTER)
        return cls(transformer, transformer.peft_config[POLICY_ADAPTER], with_anchor)

    # ------------------------------------------------------------------ policy adapter
    def policy_state(self) -> StateDict:
        return {k: p.detach() for k, p in adapter_parameters(self.transformer, POLICY_ADAPTER).items()}

    def load_policy_state(self, state: StateDict) -> None:
        load_adapter_state(self.transformer, state, POLICY_ADAPTER)

    def save_folder(self, folder: Path) -> Path:
        return write_adapter_folder(folder, self.config, self.policy_state())

    # ------------------------------------------------------------------ anchor
    @torch.no_grad()
    def refresh_anchor(self) -> None:
        if not self.has_anchor:
            raise RuntimeError("this LoRA run has no anchor adapter (--use_moving_KL false or --kl_weight 0)")
        load_adapter_state(self.transformer, self.policy_state(), ANCHOR_ADAPTER)
        self.anchor_ready = True

    def anchor_state(self) -> StateDict:
        return {k: p.detach() for k, p in adapter_parameters(self.transformer, ANCHOR_ADAPTER).items()}

    def load_anchor_state(self, state: StateDict) -> None:
        load_adapter_state(self.transformer, state, ANCHOR_ADAPTER)
        self.anchor_ready = True

    @contextlib.contextmanager
    def reference_mode(self) -> Iterator[torch.nn.Module]:
        """The transformer as the KL reference: the anchor adapter once refreshed, else the bare base model."""
        with reference_pass(self.transformer, ANCHOR_ADAPTER if self.anchor_ready else None) as model:
            yield model


@contextlib.contextmanager
def reference_pass(transformer: torch.nn.Module, adapter: Optional[str]) -> Iterator[torch.nn.Module]:
    """Run ``transformer`` in eval mode with only ``adapter`` active (None: adapters disabled), then restore it."""
    flags = [(p, p.requires_grad) for p in transformer.parameters()]
    was_training = transformer.training
    transformer.eval()
    if adapter is None:
        transformer.disable_adapters()
    else:
        transformer.set_adapter(adapter)
    try:
        yield transformer
    finally:
        if adapter is None:
            transformer.enable_adapters()
        else:
            transformer.set_adapter(POLICY_ADAPTER)
        for param, flag in flags:
            param.requires_grad_(flag)
        transformer.train(was_training)
