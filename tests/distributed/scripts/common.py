"""Shared pieces of the multi-process checks: a tiny HunyuanVideo-1.5 transformer, inputs, comparisons, reporting.

The scripts run under ``torchrun`` (gloo, CPU); every rank builds the same seeded model, runs the unsplit single-process
reference itself, and compares it with the parallel run. Rank 0 writes the worst value over ranks to a JSON report.
"""

import json
import sys
from pathlib import Path
from typing import Dict, Iterable, Tuple

import torch
import torch.distributed as dist

REPO_ROOT = Path(__file__).resolve().parents[3]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

# 4 heads so that sp = 2 and sp = 4 both divide them; otherwise the diffusers test config.
TINY_CONFIG = dict(in_channels=9, out_channels=4, num_attention_heads=4, attention_head_dim=8, num_layers=2,
                   num_refiner_layers=1, mlp_ratio=2.0, text_embed_dim=16, text_embed_2_dim=32, image_embed_dim=12,
                   rope_axes_dim=(2, 2, 4), target_size=16, task_type="t2v")


def build_transformer(seed: int = 0) -> torch.nn.Module:
    from diffusers import HunyuanVideo15Transformer3DModel

    torch.manual_seed(seed)
    model = HunyuanVideo15Transformer3DModel(**TINY_CONFIG)
    # Non-zero output layers and gates so every parameter gets a gradient worth comparing.
    with torch.no_grad():
        for param in model.parameters():
            if param.abs().sum() == 0:
                param.normal_(0.0, 0.05)
    return model


def make_inputs(seed: int, batch: int = 1, frames: int = 2, height: int = 4, width: int = 4) -> Dict[str, torch.Tensor]:
    """Transformer kwargs: (B, 9, F, H, W) latents -> F*H*W image tokens; 6 Qwen + 5 byT5 text tokens, some padded."""
    gen = torch.Generator().manual_seed(seed)
    text_mask = torch.ones(batch, 6, dtype=torch.long)
    text_mask[:, 4:] = 0
    text_mask_2 = torch.ones(batch, 5, dtype=torch.long)
    text_mask_2[:, 3:] = 0
    return dict(
        hidden_states=torch.randn(batch, 9, frames, height, width, generator=gen),
        timestep=torch.rand(batch, generator=gen) * 1000,
        encoder_hidden_states=torch.randn(batch, 6, 16, generator=gen),
        encoder_attention_mask=text_mask,
        encoder_hidden_states_2=torch.randn(batch, 5, 32, generator=gen),
        encoder_attention_mask_2=text_mask_2,
        image_embeds=torch.zeros(batch, 3, 12),
    )


def loss_of(output: torch.Tensor) -> torch.Tensor:
    """A fixed random linear functional of the velocity (same weights on every rank)."""
    weight = torch.randn(output.shape, generator=torch.Generator().manual_seed(1234))
    return (output * weight).mean()


def forward(model, inputs) -> torch.Tensor:
    return model(**inputs).sample


def full(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (full(a).detach().float() - full(b).detach().float()).abs().max().item()


def max_param_diff(pairs: Iterable[Tuple[torch.Tensor, torch.Tensor]]) -> float:
    return max(max_abs_diff(a, b) for a, b in pairs)


def grad_pairs(model, ref):
    ref_params = dict(ref.named_parameters())
    return [(p.grad, ref_params[n].grad) for n, p in model.named_parameters()
            if p.grad is not None and ref_params[n].grad is not None]


def param_pairs(model, ref):
    ref_params = dict(ref.named_parameters())
    return [(p, ref_params[n]) for n, p in model.named_parameters()]


class Report:
    """Collects metrics; numbers are reduced with MAX over ranks, other values are taken from rank 0."""

    def __init__(self, path: str):
        self.path, self.values = path, {}

    def worst(self, name: str, value: float) -> None:
        tensor = torch.tensor([float(value)], dtype=torch.float64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        self.values[name] = tensor.item()

    def put(self, name: str, value) -> None:
        self.values[name] = value

    def write(self) -> None:
        if dist.get_rank() == 0:
            Path(self.path).write_text(json.dumps(self.values, indent=1, sort_keys=True))


def check_sp_matches_unsplit(report: Report, env, sp: int):
    """Ulysses over ``sp`` ranks against the unsplit model on the same batch: the output, each rank's raw (partial)
    gradient, and the gradient once averaged over the SP group; reported as ``sp<N>_*``. Returns the SP model, the
    reference, the inputs, the reference output and the layout, for the checks that go on from there."""
    from sage_grpo.distributed import ParallelDims, apply_sequence_parallel, average_gradients

    dims = ParallelDims.from_env(env, sp_size=sp, num_attention_heads=4)
    dims.build_meshes()
    inputs = make_inputs(seed=0, batch=2)
    ref = build_transformer()
    ref_out = forward(ref, inputs)
    loss_of(ref_out).backward()

    model = build_transformer()
    apply_sequence_parallel(model, dims.sp_group)
    out = forward(model, inputs)
    loss_of(out).backward()
    report.worst(f"sp{sp}_output_err", max_abs_diff(out, ref_out))
    report.worst(f"sp{sp}_raw_grad_err", max_param_diff(grad_pairs(model, ref)))  # partial per rank: large
    average_gradients(model.parameters(), dims.sp_group)
    report.worst(f"sp{sp}_grad_err", max_param_diff(grad_pairs(model, ref)))
    report.put(f"sp{sp}_num_grads", [len(grad_pairs(model, ref)), sum(p.grad is not None for p in ref.parameters())])
    return model, ref, inputs, ref_out, dims
