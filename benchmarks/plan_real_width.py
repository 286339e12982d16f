"""The memory planner's phases for command 6 of docs/benchmarks.md (one GRPO step of ``benchmark_step.py --geometry
real``) on the configs of an N-block real-width checkpoint, without writing its weights.

    python benchmarks/plan_real_width.py 4 8 12 16 54 [--gpu_memory_gb 79.2]

For each N the configs ``scripts/make_tiny_checkpoint.py --real_width_blocks N`` writes (the transformer at the real
width with N blocks, the released VAE, the text encoders of the real output widths; modules built on ``meta``, only
their configs saved) plus the tiny VideoReward go to a temporary folder; ``plan_launch`` plans ``benchmark_step.py``'s
trainer flags there for one GPU of ``--gpu_memory_gb``. Printed: each phase's planned GB (runtime overhead included)
and, for the peak phase, its components.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import benchmarks.common as bench  # noqa: E402
from benchmarks.benchmark_step import trainer_flags  # noqa: E402
from sage_grpo.config import parse_cli  # noqa: E402
from sage_grpo.config.train import TrainConfig  # noqa: E402
from sage_grpo.models import layout  # noqa: E402
from sage_grpo.models.real_width import (REAL_TRANSFORMER_CONFIG, REAL_VAE_CONFIG, _byt5_encoder,  # noqa: E402
                                         _text_encoder)
from sage_grpo.models.tiny import _TOKENIZER_CORPUS, published_sampling, write_variant_configs  # noqa: E402
from sage_grpo.models.tiny_tokenizer import build_tiny_qwen_tokenizer  # noqa: E402
from sage_grpo.plan.memory import plan_launch  # noqa: E402
from sage_grpo.rewards.tiny import write_tiny_video_reward  # noqa: E402

GIB = 1024 ** 3


def write_configs(root: Path, num_layers: int) -> Path:
    """The configs of the N-block real-width checkpoint (no weights) and the tiny VideoReward under ``root``."""
    from diffusers import AutoencoderKLHunyuanVideo15, HunyuanVideo15Transformer3DModel

    version = layout.DEFAULT_TRANSFORMER_VERSION
    with torch.device("meta"):
        transformer = HunyuanVideo15Transformer3DModel(**dict(REAL_TRANSFORMER_CONFIG, num_layers=num_layers))
        vae = AutoencoderKLHunyuanVideo15(**REAL_VAE_CONFIG)
        text_encoder = _text_encoder(build_tiny_qwen_tokenizer([_TOKENIZER_CORPUS] * 20, vocab_size=400),
                                     REAL_TRANSFORMER_CONFIG["text_embed_dim"])
        byt5 = _byt5_encoder(REAL_TRANSFORMER_CONFIG["text_embed_2_dim"])
    transformer.save_config(root / layout.transformer_layout(version).subdir)
    write_variant_configs(root, version, *published_sampling(version))
    vae.save_config(root / layout.VAE.subdir)
    text_encoder.config.save_pretrained(root / layout.TEXT_ENCODER.subdir)
    byt5.config.save_pretrained(root / layout.TEXT_ENCODER_2.subdir)
    write_tiny_video_reward(root)
    return root


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("blocks", type=int, nargs="+", help="transformer depths to plan (the real model has 54)")
    parser.add_argument("--gpu_memory_gb", type=float, default=79.2)
    args = parser.parse_args(argv)
    model_args = argparse.ArgumentParser()
    bench.add_model_args(model_args, geometry="real")
    # command 6's geometry and flags; --blocks only satisfies the CPU check, the written configs set the depth
    setup = bench.setup_from_args(model_args.parse_args(["--geometry", "real", "--device", "cpu", "--blocks", "1",
                                                         "--repeats", "2", "--warmup", "1"]))
    setup = dataclasses.replace(setup, device=torch.device("cuda"), dtype=torch.bfloat16)
    for num_layers in args.blocks:
        with tempfile.TemporaryDirectory(prefix="plan_real_width_") as tmp:
            root = write_configs(Path(tmp), num_layers)
            cfg = parse_cli(TrainConfig, trainer_flags(setup, root, Path(tmp) / "run", 8))
            plan = plan_launch(cfg, 1, args.gpu_memory_gb)
        phases = ", ".join(f"{phase.name} {phase.bytes / GIB:.2f}" for phase in plan.phases)
        print(f"{num_layers} blocks: peak {plan.peak_gib:.2f} GB ({plan.peak.name}); phases (GB) {phases}; reference "
              f"batch {plan.placement.reference_batch_size}")
        print("  peak components (GB): " + ", ".join(f"{c.name} {c.bytes / GIB:.2f}" for c in plan.peak.components))
    return 0


if __name__ == "__main__":
    sys.exit(main())
