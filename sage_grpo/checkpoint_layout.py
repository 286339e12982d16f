"""The names inside a training checkpoint ``checkpoint-{step}/``, spelled in this one place.

What each part holds and how it is written: :mod:`sage_grpo.checkpoint`. Plain strings and paths, importable without
torch, so the writer, the resume checks, the weights loader and the export all read the same names.
"""

import re
from pathlib import Path
from typing import Dict

TRANSFORMER_FILE = Path("transformer") / "model.safetensors"  # trainable weights (all, or the LoRA adapter)
ANCHOR_FILE = Path("anchor") / "model.safetensors"  # moving-anchor weights, once the anchor has moved
EMA_FILE = Path("ema") / "model.safetensors"  # --ema_decay: the EMA of the trainable weights, keyed like them
DCP_DIR = "transformer_dcp"  # several processes: the torch.distributed.checkpoint shards of these parts,
DCP_MODEL, DCP_OPTIMIZER, DCP_ANCHOR, DCP_EMA = "model", "optimizer", "anchor", "ema"  # tensor n of part p: "p.n"
OPTIMIZER_FILE = "optimizer.pt"
TRAINING_STATE_FILE = "training_state.pt"
CONFIG_FILE = "config.yaml"  # the run's resolved configuration, what a resume compares against
LORA_DIR = "lora"  # LoRA runs: the peft adapter folder

CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")  # a published checkpoint of a run directory


def list_checkpoints(run_dir: Path) -> Dict[int, Path]:
    """{step: path} of the published ``checkpoint-N`` folders directly in ``run_dir``, oldest first (a temporary
    ``.checkpoint-N.tmp`` and the folders under ``abandoned/`` are not among them)."""
    root = Path(run_dir)
    if not root.is_dir():
        return {}
    found = {int(m.group(1)): p for p in root.iterdir() if p.is_dir() and (m := CHECKPOINT_PATTERN.match(p.name))}
    return dict(sorted(found.items()))
