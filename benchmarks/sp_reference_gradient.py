"""The reference's gradient under Ulysses sequence parallelism, emulated in one process, against the exact gradient.

    python benchmarks/sp_reference_gradient.py [--sp 2] [--heads 2] [--layers 2] [--show 12]

The reference's all-gathers (the text attention output over the heads in every dual-stream block, the image tokens
after the last layer) have a backward that hands each SP rank only its own slice of the gathered tensor's gradient;
its all-to-alls have their exact adjoint; FSDP then averages the ranks' gradients over the whole mesh, SP ranks
included (docs/differences.md). sage-grpo's collectives all have their exact adjoint (all-gather <-> reduce-scatter
sum), so its averaged gradient is the full gradient of the loss (``sage_grpo/distributed/sequence_parallel.py``).

Emulation: the ``sp`` ranks are ``sp`` copies of the batch, stacked rank-major along the batch dimension, through the
tiny transformer (the test checkpoint's configuration; ``--heads`` of 8 dims). Rank ``r``'s copy computes every token
of both streams, but only its own image tokens (the ``r``-th contiguous chunk) are used: the all-to-all is a gather of
each rank's own chunk (a permutation, its own adjoint), attention runs per rank over all image tokens and that rank's
copy of the text at its ``H/sp`` heads, and an all-gather builds each rank's tensor from every rank's slice, the other
ranks' slices detached under the reference's backward (``own_slice``) or kept (the exact adjoint). Every rank computes
the same loss on its gathered velocity; the sum of the copies' losses back-propagates the sum of the ranks' raw
gradients, and dividing by ``sp`` gives FSDP's mean. With ``own_slice`` off that mean equals the full gradient (the
script checks it); with it on, it is the reference's gradient.

Printed: the norm of the reference's gradient over the full one's, their cosine, and per parameter tensor its cosine
and norm ratio, the ``--show`` least aligned first. Measured numbers are in docs/differences.md.
"""

import argparse
import math
import sys
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch

if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sage_grpo.models.attention import JointAttnProcessor, install_joint_attention, joint_attention, joint_projections
from sage_grpo.models.tiny import TINY_TRANSFORMER_CONFIG

HEAD_DIM = 8  # the tiny model's head dim (its rope axes (2, 2, 4) sum to it)


def build_transformer(heads: int = 2, layers: int = 2, seed: int = 0) -> torch.nn.Module:
    """The tiny transformer with ``heads`` heads of 8 dims and ``layers`` dual-stream blocks, seeded random weights,
    no all-zero tensor (the zero-initialised output layers and gates are drawn too, so that every tensor has a
    gradient to compare)."""
    from diffusers import HunyuanVideo15Transformer3DModel

    torch.manual_seed(seed)
    model = HunyuanVideo15Transformer3DModel(**dict(TINY_TRANSFORMER_CONFIG, num_attention_heads=heads,
                                                    attention_head_dim=HEAD_DIM, num_layers=layers))
    with torch.no_grad():
        for param in model.parameters():
            if param.abs().sum() == 0:
                param.normal_(0.0, 0.05)
    install_joint_attention(model, "native")
    return model


def make_inputs(seed: int = 0, batch: int = 2, frames: int = 2, size: int = 4) -> Dict[str, torch.Tensor]:
    """Transformer kwargs: ``frames x size x size`` image tokens; 6 MLLM and 5 byT5 text slots, the rows with
    different valid lengths (4 and 5 MLLM, 3 and 2 byT5), no image condition (text-to-video)."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, 6, dtype=torch.long)
    mask[0, 4:] = 0
    mask[1:, 5:] = 0
    mask_2 = torch.ones(batch, 5, dtype=torch.long)
    mask_2[0, 3:] = 0
    mask_2[1:, 2:] = 0
    config = TINY_TRANSFORMER_CONFIG
    return dict(hidden_states=torch.randn(batch, config["in_channels"], frames, size, size, generator=gen),
                timestep=torch.rand(batch, generator=gen) * 1000,
                encoder_hidden_states=torch.randn(batch, 6, config["text_embed_dim"], generator=gen),
                encoder_attention_mask=mask,
                encoder_hidden_states_2=torch.randn(batch, 5, config["text_embed_2_dim"], generator=gen),
                encoder_attention_mask_2=mask_2,
                image_embeds=torch.zeros(batch, 3, config["image_embed_dim"]))


def loss_of(velocity: torch.Tensor) -> torch.Tensor:
    """A fixed random linear functional of the velocity (the same on every rank)."""
    weight = torch.randn(velocity.shape, generator=torch.Generator().manual_seed(1234))
    return (velocity * weight).mean()


def gather(pieces, rank: int, dim: int, own_slice: bool) -> torch.Tensor:
    """Rank ``rank``'s all-gather of the ranks' ``pieces`` along ``dim``: under ``own_slice`` the other ranks'
    pieces are detached, so the backward hands this rank only its own slice's gradient (the reference's)."""
    return torch.cat([piece if (s == rank or not own_slice) else piece.detach() for s, piece in enumerate(pieces)],
                     dim=dim)


def own_chunks(x: torch.Tensor, sp: int) -> torch.Tensor:
    """(sp·B, N, ...) rank copies -> (B, N, ...): each rank's own contiguous chunk of the N image tokens."""
    ranks = x.unflatten(0, (sp, -1))
    chunk = x.shape[1] // sp
    return torch.cat([ranks[r, :, r * chunk:(r + 1) * chunk] for r in range(sp)], dim=1)


class EmulatedUlyssesProcessor(JointAttnProcessor):
    """Joint attention of ``sp`` emulated ranks (the batch holds their copies, rank-major): the image Q/K/V of every
    rank's own chunk at each rank's heads, with that rank's text at the same heads; the image output back to every
    copy (the reverse all-to-all: a copy keeps its own chunk of it), the text output all-gathered over the heads."""

    def __init__(self, sp: int, own_slice: bool):
        super().__init__("native")
        self.sp, self.own_slice = sp, own_slice

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        sp = self.sp
        (query, key, value), text = joint_projections(attn, hidden_states, encoder_hidden_states, image_rotary_emb)
        local = attn.heads // sp
        image = [own_chunks(t, sp) for t in (query, key, value)]  # (B, N, H, D): the all-to-all's input
        text = [t.unflatten(0, (sp, -1)) for t in text]  # (sp, B, L, H, D): each rank's copy of the text
        joint = [torch.cat([torch.cat([img[:, :, r * local:(r + 1) * local], txt[r, :, :, r * local:(r + 1) * local]],
                                      dim=1) for r in range(sp)]) for img, txt in zip(image, text)]
        num_image = query.shape[1]
        out = joint_attention(*joint, attention_mask, num_image, self._attention_backend)  # (sp·B, N + L, H/sp, D)
        out = out.unflatten(0, (sp, -1))
        image_out = torch.cat([out[r, :, :num_image] for r in range(sp)], dim=2).flatten(2, 3)  # (B, N, H·D)
        image_out = attn.to_out[1](attn.to_out[0](image_out.repeat(sp, 1, 1)))
        text_pieces = [out[r, :, num_image:] for r in range(sp)]
        text_out = torch.cat([gather(text_pieces, r, 2, self.own_slice) for r in range(sp)]).flatten(2, 3)
        return image_out, attn.to_add_out(text_out)


def gather_velocity(sp: int, own_slice: bool):
    """A ``proj_out`` forward hook: each rank's output from every rank's own image chunk (the last all-gather)."""

    def hook(module, args, out):
        ranks, chunk = out.unflatten(0, (sp, -1)), out.shape[1] // sp
        pieces = [ranks[r, :, r * chunk:(r + 1) * chunk] for r in range(sp)]
        return torch.cat([gather(pieces, r, 1, own_slice) for r in range(sp)])

    return hook


def full_gradient(model: torch.nn.Module, inputs: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """The gradient of the loss on one process (no SP): what sage-grpo's averaged gradient equals at every degree."""
    model.zero_grad(set_to_none=True)
    loss_of(model(**inputs).sample).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def emulated_gradient(model: torch.nn.Module, inputs: Dict[str, torch.Tensor], sp: int,
                      own_slice: bool) -> Dict[str, torch.Tensor]:
    """The SP group's gradient averaged over its ranks (FSDP's mean), ``own_slice``: the reference's all-gather
    backward, else the exact adjoint. Leaves ``model`` as it found it."""
    processors = [block.attn.processor for block in model.transformer_blocks]
    for block in model.transformer_blocks:
        block.attn.set_processor(EmulatedUlyssesProcessor(sp, own_slice))
    handle = model.proj_out.register_forward_hook(gather_velocity(sp, own_slice))
    try:
        model.zero_grad(set_to_none=True)
        copies = {name: t.repeat(sp, *[1] * (t.ndim - 1)) for name, t in inputs.items()}
        velocity = model(**copies).sample.unflatten(0, (sp, -1))
        sum(loss_of(velocity[r]) for r in range(sp)).backward()
    finally:
        handle.remove()
        for block, processor in zip(model.transformer_blocks, processors):
            block.attn.set_processor(processor)
    return {name: p.grad / sp for name, p in model.named_parameters() if p.grad is not None}


def cosine_and_ratio(a: torch.Tensor, b: torch.Tensor) -> Tuple[float, float]:
    """(cosine of ``a`` with ``b``, |a| / |b|), in fp64; (nan, nan) for a zero ``b``."""
    a, b = a.double().flatten(), b.double().flatten()
    norm_a, norm_b = a.norm().item(), b.norm().item()
    if norm_b == 0:
        return math.nan, math.nan
    return (a @ b).item() / max(norm_a * norm_b, 1e-300), norm_a / norm_b


def compare(grads: Dict[str, torch.Tensor], full: Dict[str, torch.Tensor]) -> Dict[str, object]:
    """Whole-gradient cosine and norm ratio of ``grads`` against ``full``, and each tensor's (cosine, ratio).
    Tensors whose full gradient is numerically zero (below 1e-6 of the whole gradient's norm: the image embedder of
    a text-to-video call, the last block's text query, the token refiner's key bias, whose gradient is 0 in exact
    arithmetic) are left out of the per-tensor table."""
    flat_full = torch.cat([g.flatten() for g in full.values()])
    cosine, ratio = cosine_and_ratio(torch.cat([grads[name].flatten() for name in full]), flat_full)
    floor = 1e-6 * flat_full.norm()
    return {"cosine": cosine, "norm_ratio": ratio,
            "tensors": {name: cosine_and_ratio(grads[name], g) for name, g in full.items() if g.norm() > floor}}


def measure(sp: int = 2, heads: int = 2, layers: int = 2, seed: int = 0) -> Dict[str, object]:
    """The reference's gradient against the full one on the tiny model at ``sp``, and the exact emulation's largest
    difference to the full gradient (the emulation's own check: float rounding)."""
    model = build_transformer(heads, layers, seed)
    inputs = make_inputs(seed)
    full = full_gradient(model, inputs)
    exact = emulated_gradient(model, inputs, sp, own_slice=False)
    reference = emulated_gradient(model, inputs, sp, own_slice=True)
    report = compare(reference, full)
    report["exact_max_diff"] = max((exact[name] - full[name]).abs().max().item() for name in full)
    report["full_max_abs"] = max(g.abs().max().item() for g in full.values())
    return report


def print_report(report: Dict[str, object], sp: int, show: int) -> None:
    """The whole gradient's norm ratio and cosine, then the ``show`` least aligned tensors."""
    print(f"exact adjoint vs full gradient: max diff {report['exact_max_diff']:.2e} "
          f"(largest gradient {report['full_max_abs']:.3g})")
    print(f"reference vs full: norm ratio {report['norm_ratio']:.6f} (1/sp = {1 / sp:.6f}), "
          f"cosine {report['cosine']:.8f}")
    tensors = sorted(report["tensors"].items(), key=lambda item: item[1][0])
    print(f"{'tensor':<55} {'cosine':>9} {'ratio':>8}")
    for name, (cosine, ratio) in tensors[:show]:
        print(f"{name:<55} {cosine:9.5f} {ratio:8.5f}")
    aligned = [ratio for cosine, ratio in report["tensors"].values() if cosine > 1 - 1e-6]
    print(f"{len(aligned)} of {len(tensors)} tensors at cosine > 1 - 1e-6, their ratios "
          f"{min(aligned):.6f}..{max(aligned):.6f}")


def main(argv: Optional[list] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sp", type=int, default=2, help="sequence-parallel degree (divides --heads)")
    parser.add_argument("--heads", type=int, default=2, help="attention heads of the tiny transformer (8 dims each)")
    parser.add_argument("--layers", type=int, default=2, help="dual-stream blocks of the tiny transformer")
    parser.add_argument("--show", type=int, default=12, help="tensors to print, least aligned first")
    args = parser.parse_args(argv)
    if args.sp < 2 or args.heads % args.sp:
        raise SystemExit(f"--sp {args.sp} with --heads {args.heads}: need sp >= 2 dividing the heads "
                         "(e.g. --sp 2 --heads 2, --sp 4 --heads 4)")
    if args.layers < 2:
        raise SystemExit(f"--layers {args.layers}: need 2 or more blocks (a text output that a later block reads)")
    torch.set_num_threads(1)
    print(f"sp {args.sp}, {args.heads} heads, {args.layers} blocks")
    print_report(measure(args.sp, args.heads, args.layers), args.sp, args.show)


if __name__ == "__main__":
    main()
