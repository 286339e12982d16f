"""The one table from the precision names the flags take (``--dtype``, ``--master_weight_type``, the export's
``--dtype``) to torch dtypes, and the dtype a model computes with."""

from typing import Optional, Protocol

import torch

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}

_COMPUTE_DTYPE_ATTR = "_sage_compute_dtype"


class _Precision(Protocol):
    dtype: str  # --dtype: "bf16" or "fp32"


class PrecisionOptions(Protocol):
    """What the compute dtype is read from: the configuration's ``model`` section, declared by shape (this module
    sits below the configuration and imports none of it)."""

    model: _Precision


def autocast_dtype_of(cfg: PrecisionOptions) -> Optional[torch.dtype]:
    """The transformer's compute dtype under autocast for a run configured by ``cfg`` (its ``--dtype``): bf16 with
    ``--dtype bf16`` (fp32 master weights), else none."""
    return torch.bfloat16 if cfg.model.dtype == "bf16" else None


def set_compute_dtype(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Record that ``model`` computes with ``dtype`` weights although it stores others (FSDP2 mixed precision: fp32
    master shards all-gathered in bf16)."""
    setattr(model, _COMPUTE_DTYPE_ATTR, dtype)


def compute_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype of the weights ``model``'s forward computes with: the recorded one, else its parameters'."""
    return getattr(model, _COMPUTE_DTYPE_ATTR, None) or model.dtype
