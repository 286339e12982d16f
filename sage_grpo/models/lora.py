"""LoRA on the HunyuanVideo-1.5 transformer with peft: training adapters and KL references.

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

The adapter folder a LoRA run saves and reads back (peft's format) is :mod:`sage_grpo.models.lora_folder`.
"""

import contextlib
import copy
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch

from sage_grpo.models.lora_folder import (ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, check_adapter_folder,
                                          is_adapter_folder, read_adapter_folder, write_adapter_folder)
from sage_grpo.safe_io import CheckpointError

POLICY_ADAPTER = "default"
ANCHOR_ADAPTER = "anchor"
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
