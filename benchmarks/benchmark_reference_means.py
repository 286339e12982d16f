"""Time the KL reference's means of one step's rollout, one transition per forward against
``--mini_batch_size_per_update`` transitions per forward.

    python benchmarks/benchmark_reference_means.py [--geometry toy|tiny] [--batch 2] [--steps 16] [--mini_batch 4]

Writes a random-weight checkpoint of the real classes (the toy world's geometry by default: 2 blocks of width 64,
latents of 4x5x16x16 for the default 17 frames of 64x64) into a temporary directory, and times ``Sampler.transition_means`` on B x N stored transitions
with CFG (two branches per forward), as the trainer calls it. Prints both times (best of ``--repeats``), the ratio,
and the largest difference between the two results.
"""

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--geometry", choices=("toy", "tiny"), default="toy")
    parser.add_argument("--batch", type=int, default=2, help="samples per rank (the reference launch: 2)")
    parser.add_argument("--steps", type=int, default=16, help="SDE steps per sample")
    parser.add_argument("--mini_batch", type=int, default=4, help="--mini_batch_size_per_update")
    parser.add_argument("--frames", type=int, default=17)
    parser.add_argument("--size", type=int, default=64, help="video height = width in pixels")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from sage_grpo.models import PromptEncoder, TextEncoderSettings, load_components, write_tiny_hunyuan
    from sage_grpo.pipeline import latent_shape
    from sage_grpo.pipeline.sampler import Sampler
    from sage_grpo.studies.pretrain import TOY_TRANSFORMER_CONFIG, TOY_VAE_CONFIG

    configs = (dict(transformer_config=TOY_TRANSFORMER_CONFIG, vae_config=TOY_VAE_CONFIG)
               if args.geometry == "toy" else {})
    with tempfile.TemporaryDirectory() as tmp:
        root = write_tiny_hunyuan(Path(tmp) / "ckpt", dtype=torch.float32, **configs)
        components = load_components(root, dtype=torch.float32)
    encoder = PromptEncoder.from_components(components, TextEncoderSettings(max_length=16, max_length_2=8))
    transformer = components.transformer.eval()
    embeds = encoder.encode([f"prompt {i}" for i in range(args.batch)])
    shape = latent_shape(components.vae.config, args.frames, args.size, args.size)
    latents = torch.randn(args.batch, args.steps + 1, *shape, generator=torch.Generator().manual_seed(0))
    sampler = Sampler.build("sage_grpo", 0.5, args.steps, 5.0, 6.0, num_image_tokens=4)
    cpu = torch.device("cpu")

    def best_time(micro: int):
        batched = replace(sampler, micro_batch_size=micro)
        batched.transition_means(transformer, latents, embeds, cpu)  # warm-up
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            means = batched.transition_means(transformer, latents, embeds, cpu)
            times.append(time.perf_counter() - start)
        return min(times), means

    unbatched, one = best_time(1)
    batched, many = best_time(args.mini_batch)
    params = sum(p.numel() for p in transformer.parameters())
    print(f"geometry {args.geometry} ({params / 1e6:.2f}M transformer parameters), latents {tuple(shape)}, "
          f"{args.batch} samples x {args.steps} steps, CFG, {torch.get_num_threads()} threads")
    print(f"reference means, 1 transition per forward:  {unbatched:.3f} s")
    print(f"reference means, {args.mini_batch} transitions per forward: {batched:.3f} s")
    print(f"ratio batched / unbatched: {batched / unbatched:.2f}")
    print(f"max |difference|: {(many - one).abs().max().item():.2e}")


if __name__ == "__main__":
    main()
