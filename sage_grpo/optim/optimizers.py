"""Optimizers and the learning-rate schedule (docs/reference.md#optimizer-schedule-and-precision).

Default (``--use_muon true``): Muon (:class:`sage_grpo.optim.muon.Muon`, ``torch.optim.Muon``'s math) on the 2-D weight
matrices, with the reference's per-matrix learning rate ``lr * 0.2 * sqrt(max(rows, cols))`` (torch's
``adjust_lr_fn="match_rms_adamw"``), momentum 0.95 with Nesterov, 5 Newton-Schulz steps with coefficients (3.4445,
-4.7750, 2.0315) and decoupled weight decay; AdamW with the reference's Muon-side betas (0.95, 0.95) and eps 1e-8 for
every other trainable tensor (biases, norms, embeddings of other ranks). ``--use_muon false``: AdamW(betas=(0.9, 0.999),
eps=1e-8) on everything.

Differences from the reference's Muon (HunyuanVideo-1.5 ``hyvideo/optim/muon.py``): torch keeps the momentum buffer as
an exponential average, which scales the pre-orthogonalisation update by (1 - momentum); Newton-Schulz normalises by
the Frobenius norm first, so the orthogonalised update is the same. Tensors with more than two dimensions (the 3-D
patch-embedding convolution) go to AdamW instead of being flattened into Muon, because torch's Muon accepts only
matrices.

Sharded parameters (FSDP2 ``DTensor`` shards, ``sage_grpo.distributed``): :class:`sage_grpo.optim.muon.Muon`
orthogonalizes each whole matrix and keeps this rank's rows (``torch.optim.Muon`` would run Newton-Schulz on the shards
through DTensor propagation, which is wrong for tall matrices); on plain tensors it is ``torch.optim.Muon``'s math. Its
Newton-Schulz runs in bf16 on GPUs, as the reference's, and in fp32 on the CPU, where bf16 matmuls can be 100x slower
(``sage_grpo/optim/muon.py``). Build the optimizer *after* the model is sharded.

Schedule: ``constant`` (the reference's; it ignores ``--warmup_steps``) or ``constant_with_warmup`` (linear warm-up
from 0 over ``--warmup_steps`` optimizer updates, then constant).
"""

from typing import Dict, Iterable, List, Optional, Tuple

import torch
from torch.distributed.tensor import DTensor

from sage_grpo.optim.muon import Muon

MUON_MOMENTUM = 0.95
AUX_ADAMW_BETAS = (0.95, 0.95)
ADAMW_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


def check_uniform_sharding(matrices: List[torch.nn.Parameter]) -> None:
    """All Muon matrices are FSDP shards or none are: FSDP wraps the whole model."""
    sharded = [isinstance(p, DTensor) for p in matrices]
    if any(sharded) and not all(sharded):
        raise ValueError("some Muon matrices are FSDP-sharded and some are not; shard the whole model (apply_fsdp)")


def optimizer_parts(optimizer) -> Dict[str, torch.optim.Optimizer]:
    """The torch optimizers behind ``optimizer`` by name (``muon``/``adamw``), for per-part sharded checkpoints."""
    if isinstance(optimizer, MuonWithAdamW):
        return dict(optimizer.optimizers)
    return {"adamw": optimizer}


class MuonWithAdamW:
    """Muon for matrices plus AdamW for the rest, stepped together and checkpointed as one."""

    def __init__(self, named_params: Iterable[Tuple[str, torch.nn.Parameter]], lr: float, weight_decay: float):
        matrices, others = [], []
        for _, param in named_params:
            if param.requires_grad:
                (matrices if param.ndim == 2 else others).append(param)
        self.optimizers: Dict[str, torch.optim.Optimizer] = {}
        if matrices:
            check_uniform_sharding(matrices)
            self.optimizers["muon"] = Muon(
                matrices, lr=lr, weight_decay=weight_decay, momentum=MUON_MOMENTUM, nesterov=True,
                adjust_lr_fn="match_rms_adamw")
        if others:
            self.optimizers["adamw"] = torch.optim.AdamW(
                others, lr=lr, betas=AUX_ADAMW_BETAS, eps=ADAM_EPS, weight_decay=weight_decay)

    @property
    def param_groups(self) -> List[dict]:
        return [group for opt in self.optimizers.values() for group in opt.param_groups]

    def step(self) -> None:
        for opt in self.optimizers.values():
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {name: opt.state_dict() for name, opt in self.optimizers.items()}

    def load_state_dict(self, state: dict) -> None:
        if set(state) != set(self.optimizers):
            raise ValueError(f"optimizer state holds {sorted(state)} but this run builds {sorted(self.optimizers)}")
        for name, opt in self.optimizers.items():
            opt.load_state_dict(state[name])


def build_optimizer(named_params: Iterable[Tuple[str, torch.nn.Parameter]], *, use_muon: bool, lr: float,
                    weight_decay: float):
    named_params = [(n, p) for n, p in named_params if p.requires_grad]
    if not named_params:
        raise ValueError("no trainable parameters: check --use_lora / --lora_target_modules")
    if use_muon:
        return MuonWithAdamW(named_params, lr, weight_decay)
    return torch.optim.AdamW([p for _, p in named_params], lr=lr, betas=ADAMW_BETAS, eps=ADAM_EPS,
                             weight_decay=weight_decay)


LR_SCHEDULES = ("constant", "constant_with_warmup", "linear", "cosine", "cosine_with_restarts", "polynomial")
DECAYING_SCHEDULES = ("linear", "cosine", "cosine_with_restarts", "polynomial")  # depend on the run's length


class LRSchedule:
    """The learning rate of optimizer update ``n`` (0-based): ``base_lr`` times the multiplier that diffusers'
    ``get_scheduler(kind, ...)`` gives at ``n``, i.e. what a ``LambdaLR`` stepped once after every update sets (so
    ``constant_with_warmup`` trains its first update at lr 0, as in diffusers' and transformers' scripts).

    A pure function of the number of updates done, applied to every parameter group of every sub-optimizer (Muon
    and AdamW: one schedule each, the same shape): a resume restores it exactly from the update count alone.
    ``total_updates`` (the run's optimizer updates) is needed by the decaying schedules, ``num_cycles`` by
    ``cosine_with_restarts``, ``power`` by ``polynomial`` (which decays to diffusers' ``lr_end`` 1e-7).
    """

    def __init__(self, kind: str, base_lr: float, warmup_steps: int = 0, total_updates: Optional[int] = None,
                 num_cycles: int = 1, power: float = 1.0):
        from diffusers.optimization import get_scheduler

        if kind not in LR_SCHEDULES:
            raise ValueError(f"unknown lr schedule {kind!r}; use one of {', '.join(LR_SCHEDULES)}")
        if kind in DECAYING_SCHEDULES and not total_updates:
            raise ValueError(f"lr schedule {kind!r} needs the run's number of optimizer updates")
        probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base_lr)  # only for its lambda
        scheduler = get_scheduler(kind, probe, num_warmup_steps=warmup_steps, num_training_steps=total_updates,
                                  num_cycles=num_cycles, power=power)
        self.kind, self.base_lr, self.warmup_steps = kind, base_lr, warmup_steps
        self._multiplier = scheduler.lr_lambdas[0]

    def lr_at(self, update_steps: int) -> float:
        return self.base_lr * self._multiplier(update_steps)

    def apply(self, optimizer, update_steps: int) -> float:
        lr = self.lr_at(update_steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        return lr
