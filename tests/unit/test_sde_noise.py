"""The rollout's SDE noise drawn up front and moved to the device once: the same numbers from the same
generators in the same order as the per-step draws it replaced, so rollouts are bit-identical."""

import pytest
import torch
from model_fixtures import TINY_IMAGE_TOKENS

from sage_grpo import sde
from sage_grpo.pipeline import cfg_velocity, step_timesteps
from sage_grpo.pipeline.rollout import draw_initial_noise, draw_sde_noise, sample_generators
from sage_grpo.pipeline.sampler import Sampler

SHAPE = (4, 2, 2, 2)


def _per_step_draws(generators, flags, micro_batch_size):
    """What the rollout drew before: per micro-batch, per stochastic step, one draw per sample of the micro-batch."""
    draws = {}
    for start in range(0, len(generators), micro_batch_size):
        rows = range(start, min(start + micro_batch_size, len(generators)))
        for k, deterministic in enumerate(flags):
            if not deterministic:
                for row in rows:
                    draws[row, k] = torch.randn(SHAPE, generator=generators[row], dtype=torch.float32)
    return draws


@pytest.mark.parametrize("micro_batch_size", [1, 2])
def test_the_noise_sequence_is_unchanged(micro_batch_size):
    flags = [False, True, False, False]

    def generators():  # rows 0 and 1 share one generator: the order of the draws across rows shows in the numbers
        shared, third, fourth = sample_generators([5, 9, 7])
        return [shared, shared, third, fourth]

    old_generators, new_generators = generators(), generators()
    expected = _per_step_draws(old_generators, flags, micro_batch_size)
    noise = draw_sde_noise(new_generators, flags, SHAPE, micro_batch_size)
    assert noise.shape == (4, 3, *SHAPE) and noise.dtype == torch.float32
    for (row, k), draw in expected.items():
        assert torch.equal(noise[row, [0, None, 1, 2][k]], draw), (row, k)
    # every generator ends where the per-step draws left it
    assert all(torch.equal(a.get_state(), b.get_state()) for a, b in zip(old_generators, new_generators))


def test_rollout_equals_the_per_step_draws(tiny_components, tiny_encoder):
    """A rollout (micro-batches of 2 over 3 samples, one Euler step among SDE steps) equals the same loop written with
    the step drawing ε from the per-sample generators: every latent and log-prob bit for bit."""
    embeds = tiny_encoder.encode(["a red ball", 'a sign "hi" on a wall', "a cube"])
    sampler = Sampler.build("sage_grpo", 0.5, 4, 5.0, 6.0, num_image_tokens=TINY_IMAGE_TOKENS, micro_batch_size=2)
    flags, seeds = [False, False, True, False], [11, 12, 13]
    transformer, vae = tiny_components.transformer, tiny_components.vae
    out = sampler.rollout(transformer, vae, embeds, seeds, num_frames=5, height=16, width=16, deterministic=flags,
                          decode=False)

    generators = sample_generators(seeds)
    latents = draw_initial_noise(generators, SHAPE)
    expected, log_probs = [latents], []
    with torch.no_grad():
        for rows in (slice(0, 2), slice(2, 3)):
            x, trajectory, lps = latents[rows], [], []
            for k in range(4):
                velocity = cfg_velocity(transformer, x, step_timesteps(sampler.sigmas, k, x.shape[0]),
                                        embeds.select(rows), 6.0, num_image_tokens=TINY_IMAGE_TOKENS)
                step = sde.step(sampler.kernel, velocity, x, sampler.sigmas, k, 0.5, generator=generators[rows],
                                deterministic=flags[k])
                x = step.prev_sample
                trajectory.append(x)
                lps.append(step.log_prob)
            expected.append(torch.stack(trajectory, dim=1))
            log_probs.append(torch.stack(lps, dim=1))
    assert torch.equal(out.latents[:, 1:], torch.cat(expected[1:]))
    assert torch.equal(out.log_probs, torch.cat(log_probs))


def test_noise_or_generator_not_both():
    kernel = sde.get_kernel("sage_grpo")
    x = torch.zeros(1, *SHAPE)
    with pytest.raises(ValueError, match="not both"):
        sde.step(kernel, x, x, sde.shifted_sigmas(4, 5.0), 0, 0.5, noise=x, generator=torch.Generator())
