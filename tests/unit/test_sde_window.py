"""The sliding window of trained steps (sage_grpo/rl/sde_window.py): where it is, and that a windowed rollout's
stored transitions replay exactly while its ODE steps are deterministic, for every SDE type."""

import pytest
import torch
from model_fixtures import TINY_IMAGE_TOKENS, TINY_VIDEO

from sage_grpo import sde
from sage_grpo.pipeline import cfg_velocity, step_timesteps
from sage_grpo.pipeline.sampler import Sampler
from sage_grpo.rl.sde_window import SDEWindow

PROMPTS = ["A cat walks on the grass", "A dog runs on a beach"]
SEEDS = [11, 12]
NUM_STEPS = 4


def test_the_window_moves_every_stride_updates_and_wraps():
    window = SDEWindow(size=2, stride=3, num_steps=6)  # starts 0..4, then back to 0
    starts = [window.start(update) for update in range(18)]
    assert starts == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 0, 0, 0]
    assert window.steps(4).tolist() == [1, 2]
    assert window.deterministic(4) == [True, False, False, True, True, True]
    fixed = SDEWindow(size=3, stride=0, num_steps=6)
    assert {fixed.start(update) for update in range(50)} == {0}
    whole = SDEWindow(size=6, stride=1, num_steps=6)  # W = N: every step, every time
    assert whole.deterministic(7) == [False] * 6


def test_the_window_off_is_the_reference():
    off = SDEWindow(size=0, stride=1, num_steps=5)
    assert not off.enabled and off.deterministic(3) is False
    assert torch.equal(off.steps(3), torch.arange(5))


@pytest.mark.parametrize("size,stride", [(-1, 1), (5, 1), (2, -1)])
def test_bad_windows_are_refused(size, stride):
    with pytest.raises(ValueError, match="window"):
        SDEWindow(size=size, stride=stride, num_steps=4)


@pytest.fixture(scope="module")
def embeds(tiny_encoder):
    return tiny_encoder.encode(PROMPTS)


@pytest.mark.parametrize("sde_type", sde.SDE_TYPES)
def test_windowed_rollout_replays_exactly_and_its_ode_steps_are_deterministic(tiny_components, embeds, sde_type):
    sampler = Sampler.build(sde_type, 0.5, NUM_STEPS, 5.0, 6.0, num_image_tokens=TINY_IMAGE_TOKENS)
    window = SDEWindow(size=2, stride=1, num_steps=NUM_STEPS)
    flags = window.deterministic(1)  # steps 1 and 2 are SDE steps
    assert flags == [True, False, False, True]
    transformer, vae = tiny_components.transformer, tiny_components.vae

    def roll(noise_seed):
        generators = [torch.Generator().manual_seed(noise_seed + row) for row in range(len(SEEDS))]
        return sampler.rollout(transformer, vae, embeds, SEEDS, deterministic=flags, sde_generators=generators,
                               decode=False, **TINY_VIDEO)

    out, other_noise = roll(100), roll(200)
    # before the window nothing is random: the ODE step 0 is the same under other SDE noise; the window's steps differ
    assert torch.equal(out.latents[:, :2], other_noise.latents[:, :2])
    assert not torch.equal(out.latents[:, 2], other_noise.latents[:, 2])
    for row in range(len(SEEDS)):
        sample = slice(row, row + 1)
        for k in window.steps(1).tolist():  # every stored (trained) transition replays bit for bit
            replayed = sampler.replay(transformer, out.latents[sample, k], out.latents[sample, k + 1],
                                      torch.tensor([k]), embeds.select([row]))
            assert torch.equal(replayed.log_prob, out.log_probs[sample, k]), (sde_type, k, row)
        for k in (0, 3):  # the ODE steps are plain Euler steps x + dt * v of the rollout's own velocity
            x = out.latents[sample, k]
            velocity = cfg_velocity(transformer, x, step_timesteps(out.sigmas, k, 1), embeds.select([row]), 6.0,
                                    num_image_tokens=TINY_IMAGE_TOKENS)
            euler = sde.step(sampler.kernel, velocity, x, out.sigmas, k, 0.5, deterministic=True).prev_sample
            assert torch.equal(euler, out.latents[sample, k + 1]), (sde_type, k, row)
    means = sampler.transition_means(transformer, out.latents, embeds, torch.device("cpu"), steps=window.steps(1))
    every = sampler.transition_means(transformer, out.latents, embeds, torch.device("cpu"))
    assert torch.equal(means[:, 1:3], every[:, 1:3])
    assert torch.isnan(means[:, [0, 3]]).all()  # never computed, never trained
