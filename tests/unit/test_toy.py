"""The toy video world (sage_grpo/toy): rendering, the manifold error, toy rewards, the analytic Gaussian-mixture
velocity, the toy checkpoint writer at a reduced size, and GRPO raising a toy reward in a few steps."""
import json

import pytest
import torch

from sage_grpo import sde
from sage_grpo.toy import world
from sage_grpo.toy.analytic import GaussianMixture, noise_std_per_step, terminal_errors
from sage_grpo.toy.manifold import fit_manifold, prompt_adherence
from sage_grpo.rewards.toys import ToyLargeReward, ToyRednessReward

from toy_support import ON_MANIFOLD_MAX


@pytest.fixture(scope="module")
def toy_videos():
    generator = torch.Generator().manual_seed(0)
    prompts = [world.training_prompts()[i] for i in torch.randint(270, (12,), generator=generator).tolist()]
    videos, factors = world.sample_videos(prompts, generator)
    return prompts, videos, factors


def test_prompts_name_factors_and_videos_follow_them():
    spec = world.parse_prompt("a large red disk moving left quickly")
    assert spec == world.PromptSpec("large", "red", "left", "quickly")
    assert spec.text == "a large red disk moving left quickly"
    assert world.parse_prompt("a disk").text == "a disk"
    assert len(world.training_prompts()) == 3 * 6 * 5 * 3  # each factor named (any value) or free
    factors = world.sample_factors(["a large red disk moving left quickly"] * 4, torch.Generator().manual_seed(1))
    assert torch.all(factors.colour == torch.tensor(world.PALETTE["red"]))
    assert torch.all((factors.radius >= 2.75) & (factors.radius <= 3.5))
    assert torch.all(factors.velocity[:, 0] < 0) and torch.all(factors.velocity[:, 1] == 0)
    assert len(set(factors.start[:, 0].tolist())) == 4  # the free start position differs between samples
    videos = world.render(factors)
    assert videos.shape == (4, 3, world.NUM_FRAMES, world.HEIGHT, world.WIDTH)
    assert 0.0 <= float(videos.min()) and float(videos.max()) <= 1.0


def test_on_manifold_videos_fit_to_zero_and_recover_their_factors(toy_videos):
    prompts, videos, factors = toy_videos
    fit = fit_manifold(videos)
    assert float(fit.error.max()) < ON_MANIFOLD_MAX
    assert torch.allclose(fit.radius, factors.radius, atol=0.05)
    assert torch.allclose(fit.factors.velocity, factors.velocity, atol=0.02)
    assert torch.allclose(fit.factors.start, factors.start, atol=0.1)
    assert fit.colour_names == world.nearest_palette(factors.colour)[0]
    assert fit.direction_names == world.direction_name(factors.velocity)
    assert torch.all(prompt_adherence(prompts, fit).nan_to_num(1.0) == 1.0)


def _perturbations(videos):
    generator = torch.Generator().manual_seed(5)
    tint = videos.clone()
    tint[:, 0] += 0.1
    broken = videos.clone()
    broken[:, :, 4:] = videos[:, :, 4:].flip(2)  # the second half of the motion runs backwards
    return {
        "noise": videos + 0.05 * torch.randn(videos.shape, generator=generator),
        "blur": torch.nn.functional.avg_pool3d(videos, (1, 3, 3), 1, (0, 1, 1), count_include_pad=False),
        "red tint": tint,
        "second blob": torch.maximum(videos, videos.flip(0)),
        "broken motion": broken,
    }


@pytest.mark.parametrize("name", ["noise", "blur", "red tint", "second blob", "broken motion"])
def test_off_manifold_videos_score_clearly_higher(toy_videos, name):
    _, videos, _ = toy_videos
    perturbed = _perturbations(videos)[name].clamp(0, 1)
    error = fit_manifold(perturbed).error
    # Measured minima over 32 videos: noise 0.049, tint 0.054, blur 0.021, second blob 0.042, broken motion 0.016;
    # the smallest happen for slow disks (reversing a slow motion moves the disk little).
    assert float(error.median()) > 0.015 and float(error.min()) > 3 * ON_MANIFOLD_MAX


def test_toy_rewards_score_and_report_the_manifold_error(toy_videos):
    prompts, videos, factors = toy_videos
    scores = ToyLargeReward()(videos, prompts)
    assert set(scores) == {"toy_large", "manifold_error", "prompt_adherence"}
    expected = ((factors.radius - ToyLargeReward.low) / (world.RADIUS_RANGE[1] - ToyLargeReward.low)).clamp(0, 1)
    assert torch.allclose(scores["toy_large"], expected, atol=0.03)
    assert float(scores["manifold_error"].max()) < ON_MANIFOLD_MAX
    # the hackable reward: a red tint of the background raises it far more than it costs on the manifold
    tinted = videos.clone()
    tinted[:, 0] = (tinted[:, 0] + 0.3).clamp(0, 1)
    hack = ToyRednessReward()
    before, after = hack(videos, prompts), hack(tinted, prompts)
    assert float(after["toy_redness"].mean()) > float(before["toy_redness"].mean()) + 0.2
    assert float(after["manifold_error"].min()) > 0.1


def test_toy_rewards_are_built_in_rewards():
    from sage_grpo.rewards import build_reward_fn

    fn = build_reward_fn("toy_large")
    assert fn.metric_names == ("toy_large", "toy_large_manifold_error", "toy_large_prompt_adherence", "avg")
    videos, _ = world.sample_videos(["a large disk", "a small disk"], torch.Generator().manual_seed(2))
    out = fn(videos, ["a large disk", "a small disk"])
    assert torch.equal(out["avg"], out["toy_large"])  # the diagnostics weigh 0 in the GRPO reward
    assert float(out["toy_large"][0]) > float(out["toy_large"][1])


def test_exact_velocity_matches_a_monte_carlo_estimate():
    """E[v(x_σ) f(x_σ)] = E[(ε − x0) f(x_σ)] for any f (tower property); checked for f = x and f = tanh(3 x_1)."""
    mixture = GaussianMixture.on_a_plane(dim=4)
    generator = torch.Generator().manual_seed(1)
    for sigma in (0.2, 0.5, 0.9):
        x0 = mixture.sample(200_000, generator)
        noise = torch.randn(x0.shape, generator=generator, dtype=torch.float64)
        x = (1 - sigma) * x0 + sigma * noise
        velocity = mixture.velocity(x, sigma)
        for test_fn in (lambda t: t, lambda t: torch.tanh(3 * t[:, :1])):
            exact = (velocity * test_fn(x)).mean(0)
            monte_carlo = ((noise - x0) * test_fn(x)).mean(0)
            assert float((exact - monte_carlo).abs().max()) < 5e-3  # measured <= 2.2e-3 (MC error ~1/sqrt(2e5))


def test_exact_ode_lands_on_the_data_and_noise_std_follows_the_kernels():
    mixture = GaussianMixture.on_a_plane(dim=6)
    sigmas = sde.shifted_sigmas(20, 5.0)
    ode = terminal_errors(mixture, None, 0.0, sigmas, 2000)
    assert ode["sliced_w2"] < 0.06 and ode["off_manifold_rms"] < 0.02
    sage = noise_std_per_step("sage_grpo", 0.5, sigmas)
    # the sage_grpo std at the first and last steps, as docs/reference.md#the-schedule-and-the-sde-steps gives it
    assert sage[0] == pytest.approx(0.556, abs=2e-3) and sage[-1] == pytest.approx(0.080, abs=2e-3)
    assert noise_std_per_step("cps", 0.5, sigmas)[-1] == 0.0  # CPS adds no noise on the last step


def test_demo_report_numbers_and_run_picture(tmp_path, capsys):
    """scripts/demo_report.py on a hand-made metrics.jsonl: gain, noise ratio, manifold window means, the PNG."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import demo_report

    rewards = [0.40, 0.42, 0.38, 0.41, 0.39] + [0.5] * 5 + [0.90, 0.92, 0.88, 0.91, 0.89]
    rows = [{"step": i + 1, "gathered_avg_reward_mean": r, "gathered_avg_reward_std": 0.1, "kl_loss": 0.01,
             "gathered_toy_large_manifold_error_reward_mean": 0.06 + 0.001 * i, "rollout_time": 1.0,
             "reward_time": 0.5, "ref_model_time": 0.25, "grpo_loop_time": 0.25} for i, r in enumerate(rewards)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    summary = demo_report.summarize(rows, window=5)
    assert summary["first_mean"] == pytest.approx(0.40) and summary["last_mean"] == pytest.approx(0.90)
    assert summary["gain"] == pytest.approx(0.50)
    assert summary["first_step_std"] == pytest.approx(0.014142, abs=1e-5)  # pstdev of 0.40, 0.42, 0.38, 0.41, 0.39
    assert summary["gain_over_noise"] == pytest.approx(0.5 / 0.014142, rel=1e-4)
    assert summary["manifold_first_mean"] == pytest.approx(0.062) and summary["manifold_max"] == pytest.approx(0.074)
    assert summary["seconds_per_step"] == pytest.approx(2.0)
    assert demo_report.main(["--run_dir", str(tmp_path)]) == 0
    assert "gain +0.5000" in capsys.readouterr().out
    from PIL import Image

    with Image.open(tmp_path / "run.png") as image:
        assert image.size[0] == 900 and image.size[1] > 900  # three panels: reward, manifold error, KL
    assert demo_report.main(["--run_dir", str(tmp_path / "missing")]) == 2
