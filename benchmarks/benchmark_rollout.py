"""Time our rollout (``Sampler.rollout``, every step deterministic: the ODE) against diffusers'
``HunyuanVideo15Pipeline`` on the same transformer, the same steps, schedule and guidance and the same seeded
initial latents.

    python benchmarks/benchmark_rollout.py [--geometry toy] [--batch 2] [--steps 8]
    python benchmarks/benchmark_rollout.py --geometry real --device cuda --dtype bf16 --batch 1 --steps 8    # GPU

Both sides start from the same x_0 (drawn from the seeds as the rollout draws it), get the same conditioning,
precomputed (synthetic embeddings of the geometry's shapes; text encoding is not timed), and stop at the final
latents (no decode):

* ours: one transformer call per step on the CFG pair [negative; positive] (2B rows; ``--micro_batch`` samples per
  call), our joint attention (text trimmed, ``--attention_backend``), latents kept in fp32 between steps;
* diffusers: the pipeline as shipped, with its own processor (dense S x S mask over the padded text), two calls per
  step (conditional, then unconditional, B rows each) through its guider, latents in the transformer's dtype;
  ``--diffusers_joint_attention`` also times the pipeline on our attention, separating the loop from the attention.

The ODE parity is tests/unit/test_pipeline.py's (``test_ode_rollout_matches_diffusers_pipeline``): the pipeline's
scheduler is ``FlowMatchEulerDiscreteScheduler(shift)``, whose sigmas equal ours. Prints both times, the ratio
diffusers / ours and the largest difference between the final latents (~1e-6 in fp32; bf16 rounds the pipeline's
latents every step).
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common as bench  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    bench.add_model_args(parser, geometry="toy")
    parser.add_argument("--batch", type=int, default=2, help="videos per rollout")
    parser.add_argument("--steps", type=int, default=8, help="ODE steps")
    parser.add_argument("--micro_batch", type=int, default=None,
                        help="our samples per forward (--mini_batch_size_per_update; default: --batch)")
    parser.add_argument("--shift", type=float, default=5.0, help="flow shift of the sigma schedule")
    parser.add_argument("--guidance_scale", type=float, default=6.0)
    parser.add_argument("--diffusers_joint_attention", action="store_true",
                        help="also time the pipeline with our joint attention installed")
    return parser.parse_args(argv)


def diffusers_pipeline(transformer, vae, shift: float, guidance_scale: float, geometry: bench.Geometry):
    """HunyuanVideo15Pipeline on our transformer and VAE; no text encoders (the embeddings are passed in)."""
    from diffusers import ClassifierFreeGuidance, FlowMatchEulerDiscreteScheduler, HunyuanVideo15Pipeline
    from diffusers.utils import logging as diffusers_logging

    level = diffusers_logging.get_verbosity()
    diffusers_logging.set_verbosity_error()  # the guider's "experimental feature" notice
    try:
        guider = ClassifierFreeGuidance(guidance_scale=guidance_scale)
    finally:
        diffusers_logging.set_verbosity(level)
    pipe = HunyuanVideo15Pipeline(None, None, transformer, vae, FlowMatchEulerDiscreteScheduler(shift=shift), None,
                                  None, guider)
    pipe.set_progress_bar_config(disable=True)
    pipe.vision_num_semantic_tokens = geometry.num_image_tokens
    return pipe


def main(argv=None) -> None:
    from sage_grpo.models.attention import install_joint_attention, remove_joint_attention
    from sage_grpo.pipeline import latent_shape
    from sage_grpo.pipeline.rollout import draw_initial_noise, sample_generators
    from sage_grpo.pipeline.sampler import Sampler

    args = parse_args(argv)
    setup = bench.setup_from_args(args)
    transformer, vae = bench.build_models(setup)
    transformer.eval().requires_grad_(False)
    geometry = setup.geometry
    frames, height, width = setup.video
    embeds = bench.synthetic_embeds(geometry, args.batch, setup.device, setup.dtype, setup.seed)
    seeds = list(range(setup.seed, setup.seed + args.batch))
    # x_0 exactly as the rollout draws it from the seeds: (B, C, T, h, w) fp32
    initial = draw_initial_noise(sample_generators(seeds), latent_shape(vae.config, *setup.video))
    sampler = Sampler.build("sage_grpo", 0.5, args.steps, args.shift, args.guidance_scale,
                            num_image_tokens=geometry.num_image_tokens,
                            micro_batch_size=args.micro_batch or args.batch)
    pipe = diffusers_pipeline(transformer, vae, args.shift, args.guidance_scale, geometry)
    conditioning = dict(prompt_embeds=embeds.embeds, prompt_embeds_mask=embeds.masks,
                        prompt_embeds_2=embeds.embeds_2, prompt_embeds_mask_2=embeds.masks_2,
                        negative_prompt_embeds=embeds.neg_embeds, negative_prompt_embeds_mask=embeds.neg_masks,
                        negative_prompt_embeds_2=embeds.neg_embeds_2, negative_prompt_embeds_mask_2=embeds.neg_masks_2)
    results = {}

    def ours():
        out = sampler.rollout(transformer, vae, embeds, seeds, num_frames=frames, height=height, width=width,
                              deterministic=True, decode=False)
        results["ours"] = out.latents[:, -1]

    def diffusers(name):
        def run():
            with torch.no_grad():
                out = pipe(num_frames=frames, height=height, width=width, num_inference_steps=args.steps,
                           latents=initial.to(setup.device), output_type="latent", **conditioning)
            results[name] = out.frames
        return run

    with torch.no_grad():
        ours_s = bench.best_time(ours, setup)
    remove_joint_attention(transformer)
    diffusers_s = bench.best_time(diffusers("diffusers"), setup)
    install_joint_attention(transformer, setup.attention_backend)
    joint_s = bench.best_time(diffusers("diffusers_joint"), setup) if args.diffusers_joint_attention else None

    print(setup.describe())
    print(f"{args.batch} videos x {args.steps} ODE steps, CFG {args.guidance_scale}, shift {args.shift}, "
          f"best of {setup.repeats}")
    print(f"ours (Sampler.rollout, joint attention {setup.attention_backend}, {sampler.micro_batch_size} "
          f"per forward): {ours_s:.4f} s")
    print(f"diffusers (HunyuanVideo15Pipeline, dense-mask processor): {diffusers_s:.4f} s")
    if joint_s is not None:
        print(f"diffusers (HunyuanVideo15Pipeline, our joint attention): {joint_s:.4f} s")
    print(f"ratio diffusers / ours: {diffusers_s / ours_s:.2f}")
    final = results["ours"].float()
    print(f"max |final latent difference|: {(results['diffusers'].float() - final).abs().max().item():.2e} "
          f"(latent std {final.std().item():.3f})")


if __name__ == "__main__":
    main()
