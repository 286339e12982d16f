"""SDE samplers: schedule and worked values of docs/reference.md#the-schedule-and-the-sde-steps and
docs/reference.md#the-gradient-norm-equalizer, and one contract suite run over every SDE type."""
import math

import pytest
import torch

from sage_grpo.sde import (
    SDE_TYPES,
    check_schedule,
    get_kernel,
    shifted_sigmas,
    step,
    timesteps_from_sigmas,
)
from sage_grpo.rl.grad_balance import grad_balance_scales, grad_norm_proxies, window_scales

ETA = 0.5
SIGMAS = shifted_sigmas(20, 5.0)
SHAPE = (2, 3, 2, 4, 4)  # (B, C, F, H, W)


def _inputs(seed: int = 0, shape=SHAPE, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    v = torch.randn(shape, generator=gen).to(dtype)
    x = torch.randn(shape, generator=gen).to(dtype)
    return v, x


# ----------------------------------------------------------------------------------------------- schedule


def test_shifted_sigmas_reference_values():
    # σ = 5u/(1+4u), u = 1 − k/20: k=1 u=.95 → 4.75/4.8; k=2 u=.9 → 4.5/4.6; k=3 → 4.25/4.4;
    # k=10 u=.5 → 2.5/3; k=18 u=.1 → .5/1.4; k=19 u=.05 → .25/1.2
    assert SIGMAS.dtype == torch.float32 and SIGMAS.shape == (21,)
    assert SIGMAS[0].item() == 1.0 and SIGMAS[-1].item() == 0.0
    expected = {1: 0.989583, 2: 0.978261, 3: 0.965909, 10: 0.833333, 18: 0.357143, 19: 0.208333}
    for k, value in expected.items():
        assert SIGMAS[k].item() == pytest.approx(value, abs=1e-6)
    assert torch.all(SIGMAS[:-1] > SIGMAS[1:])
    timesteps = timesteps_from_sigmas(SIGMAS)
    assert timesteps.shape == (20,) and timesteps[0].item() == 1000.0
    assert timesteps[19].item() == pytest.approx(208.3333, abs=1e-3)


def test_shift_one_is_linear():
    assert torch.allclose(shifted_sigmas(4, 1.0), torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0]))


# ----------------------------------------------------------------------------------------- worked values


def test_sage_std_worked_values():
    v, x = _inputs()
    # step 0: σ = 1 → clamped to 0.997, σ' = 0.989583: std² = .25·(ln(0.010417/0.003) − 0.010417)
    #         = .25·(1.244795 − 0.010417) = 0.308595 → std = 0.55551
    # step 19: σ = 0.208333, σ' = 0: std² = .25·(ln(1/0.791667) − 0.208333) = .25·0.025282 = 0.0063204 → 0.079501
    assert step(get_kernel("sage_grpo"), v, x, SIGMAS, 0, ETA).std.item() == pytest.approx(0.55551, abs=1e-4)
    assert step(get_kernel("sage_grpo"), v, x, SIGMAS, 19, ETA).std.item() == pytest.approx(0.079501, abs=1e-5)


def test_flow_grpo_first_step_uses_sigma_1():
    v, x = _inputs()
    out = step(get_kernel("flow_grpo"), v, x, SIGMAS, 0, ETA)
    # σ = 1 → σ̃ = σ_1 = 0.989583: std_t = .5·√(1/0.010417) = .5·9.79796 = 4.89898, noise = std_t·√0.010417 = 0.5
    assert out.std.item() == pytest.approx(4.89898, rel=1e-5)
    assert out.noise_std.item() == pytest.approx(0.5, rel=1e-5)


SAGE_SCALES = [8.1506, 5.2983, 3.7258, 2.8960, 2.3499, 1.9506, 1.6398, 1.3881, 1.1783, 1.0000,
               0.8462, 0.7120, 0.5941, 0.4897, 0.3971, 0.3146, 0.2410, 0.1750, 0.1149, 0.0551]  # fmt: skip


def test_sage_equalizer_scales():
    # g_k = |J_k|/std_k with J_k = dt − ½·std²·(1−σ)/σ:
    #  k=0:  J = −0.010417 − 0 (σ = 1) → g0 = 0.010417/0.555513 = 0.018752
    #  k=9:  σ = .859375, σ' = .833333: std² = .25·(ln(.166667/.140625) − .026042) = .035964, std = .189642,
    #        J = −.026042 − .5·.035964·(.140625/.859375) = −.028985 → g9 = .152838 (the lower median of 20)
    #  k=19: J = −.208333 − .5·.0063204·3.8 = −.220342 → g19 = .220342/.079501 = 2.77156
    #  scale0 = .152838/.018752 = 8.1505, scale9 = 1, scale19 = .152838/2.77156 = 0.055145
    # k=15, 18 from the same g list: .1528/.486 = .314 and .1528/1.331 = .115
    g = grad_norm_proxies("sage_grpo", SIGMAS, ETA)
    assert g[0].item() == pytest.approx(0.018752, rel=1e-3)
    assert g[9].item() == pytest.approx(0.152838, rel=1e-4)
    assert g[19].item() == pytest.approx(2.77156, rel=1e-4)
    scales = grad_balance_scales("sage_grpo", SIGMAS, ETA)
    assert scales.dtype == torch.float32 and scales.shape == (20,)
    assert scales[9].item() == 1.0
    torch.testing.assert_close(scales, torch.tensor(SAGE_SCALES), rtol=0, atol=1e-4)


def test_window_scales_renormalise_over_the_window():
    # The whole schedule's scales make a 4-step window's mean scale fall 34x as it slides from the first steps
    # (8.15, 5.30, 3.73, 2.90: mean 5.02) to the last (0.241, 0.175, 0.115, 0.055: mean 0.146). Renormalised, the
    # window's lower median of g becomes the reference: g_k = g_9 / s_k, so over steps 16-19 it is g_17 and
    # scale'_k = s_k / s_17 = 1.377, 1, 0.657, 0.315 (mean 0.837); over steps 0-3, s_k / s_1 (mean 0.947).
    scales = torch.tensor(SAGE_SCALES)
    first, last = torch.arange(0, 4), torch.arange(16, 20)
    assert scales[first].mean().item() == pytest.approx(5.02, abs=0.01)
    assert scales[last].mean().item() == pytest.approx(0.146, abs=0.001)
    torch.testing.assert_close(window_scales(scales, last)[last], torch.tensor([1.3771, 1.0, 0.6566, 0.3149]),
                               rtol=0, atol=2e-4)
    assert window_scales(scales, first)[first].mean().item() == pytest.approx(0.947, abs=0.001)
    assert window_scales(scales, last)[17].item() == 1.0  # the window's median step


def test_equalizer_eta_none_means_one():
    default_eta = grad_balance_scales("dance_grpo", SIGMAS, None)
    torch.testing.assert_close(default_eta, grad_balance_scales("dance_grpo", SIGMAS, 1.0))


def test_equalizer_sage_guard_gives_unit_proxy():
    # 1000 steps: σ_1 = 5·.999/(1+4·.999) = .99980 > 1 − 3e-3, so the clamped log term makes std² < 0 at step 0
    g = grad_norm_proxies("sage_grpo", shifted_sigmas(1000, 5.0), ETA)
    assert g[0].item() == 1.0 and torch.all(torch.isfinite(g))


def _spec_jacobian(sde_type: str, sigma: float, sigma_next: float, eta: float) -> float:
    """The J_k column of docs/reference.md#the-gradient-norm-equalizer, written out independently of the kernels."""
    dt = sigma_next - sigma
    if sde_type == "dance_grpo":
        return dt * (1 + 0.5 * eta**2 * (1 - sigma) / sigma)
    if sde_type == "sage_grpo":
        std_sq = eta**2 * (math.log((1 - sigma_next) / (1 - min(sigma, 1 - 3e-3))) - (sigma - sigma_next))
        return dt - 0.5 * std_sq * (1 - sigma) / sigma
    if sde_type == "flow_grpo":
        std_t_sq = eta**2 * sigma / (1 - sigma)
        return dt * (1 + std_t_sq * (1 - sigma) / (2 * sigma))
    std_t = sigma_next * math.sin(eta * math.pi / 2)
    return -sigma * (1 - sigma_next) + (1 - sigma) * math.sqrt(sigma_next**2 - std_t**2)


@pytest.mark.parametrize("sde_type", SDE_TYPES)
def test_equalizer_jacobian_matches_autograd_and_spec(sde_type):
    k = 7
    v, x = _inputs()
    v.requires_grad_(True)
    out = step(get_kernel(sde_type), v, x, SIGMAS, k, ETA, prev_sample=x)
    (jacobian,) = torch.autograd.grad(out.mean.sum(), v)  # μ is elementwise affine in v: ∂μ/∂v is constant
    assert torch.allclose(jacobian, jacobian.flatten()[0])
    expected = _spec_jacobian(sde_type, SIGMAS[k].item(), SIGMAS[k + 1].item(), ETA)
    assert jacobian.flatten()[0].item() == pytest.approx(expected, rel=1e-4)
    g = grad_norm_proxies(sde_type, SIGMAS, ETA)
    assert g[k].item() == pytest.approx(abs(expected) / out.noise_std.item(), rel=1e-4)


# ------------------------------------------------------------------------------------------ contract suite


@pytest.mark.parametrize("sde_type", SDE_TYPES)
def test_shapes_and_float32_outputs(sde_type):
    v, x = _inputs(dtype=torch.bfloat16)
    out = step(get_kernel(sde_type), v, x, SIGMAS, 4, ETA)
    for name in ("prev_sample", "pred_x0", "mean"):
        assert getattr(out, name).shape == SHAPE and getattr(out, name).dtype == torch.float32
    assert out.log_prob.shape == (2,) and out.log_prob.dtype == torch.float32
    assert out.std.shape == () and out.noise_std.shape == () and out.std.dtype == torch.float32
    per_sample = step(get_kernel(sde_type), v, x, SIGMAS, torch.tensor([4, 9]), ETA)
    assert per_sample.std.shape == (2,) and per_sample.noise_std.shape == (2,)


@pytest.mark.parametrize("sde_type", SDE_TYPES)
def test_bf16_inputs_are_upcast_before_any_math(sde_type):
    v, x = _inputs(dtype=torch.bfloat16)
    stored = torch.randn(SHAPE, generator=torch.Generator().manual_seed(5))
    low = step(get_kernel(sde_type), v, x, SIGMAS, 6, ETA, prev_sample=stored.bfloat16())
    high = step(get_kernel(sde_type), v.float(), x.float(), SIGMAS, 6, ETA, prev_sample=stored.bfloat16().float())
    assert torch.equal(low.mean, high.mean) and torch.equal(low.log_prob, high.log_prob)


@pytest.mark.parametrize("sde_type", SDE_TYPES)
def test_int_and_per_sample_index_agree(sde_type):
    v, x = _inputs()
    stored = x + 0.1
    shared = step(get_kernel(sde_type), v, x, SIGMAS, 3, ETA, prev_sample=stored)
    same = step(get_kernel(sde_type), v, x, SIGMAS, torch.tensor([3, 3]), ETA, prev_sample=stored)
    torch.testing.assert_close(same.mean, shared.mean)
    torch.testing.assert_close(same.log_prob, shared.log_prob)
    torch.testing.assert_close(same.std, shared.std.expand(2))
    mixed = step(get_kernel(sde_type), v, x, SIGMAS, torch.tensor([3, 17]), ETA, prev_sample=stored)
    for i, k in enumerate((3, 17)):
        alone = step(get_kernel(sde_type), v[i : i + 1], x[i : i + 1], SIGMAS, k, ETA, prev_sample=stored[i : i + 1])
        torch.testing.assert_close(mixed.mean[i : i + 1], alone.mean)
        torch.testing.assert_close(mixed.log_prob[i : i + 1], alone.log_prob)
        torch.testing.assert_close(mixed.noise_std[i], alone.noise_std)


@pytest.mark.parametrize("sde_type", SDE_TYPES)
def test_rescoring_a_rollout_is_bit_identical(sde_type):
    v, x = _inputs()
    rollout = step(get_kernel(sde_type), v, x, SIGMAS, 5, ETA, generator=torch.Generator().manual_seed(1))
    rescored = step(get_kernel(sde_type), v.clone(), x.clone(), SIGMAS, torch.tensor([5, 5]), ETA,
                    prev_sample=rollout.prev_sample)
    rescored_int = step(get_kernel(sde_type), v.clone(), x.clone(), SIGMAS, 5, ETA, prev_sample=rollout.prev_sample)
    assert torch.equal(rescored_int.log_prob, rollout.log_prob)
    assert torch.equal(torch.exp(rescored_int.log_prob - rollout.log_prob), torch.ones(2))  # first PPO ratio = 1
    torch.testing.assert_close(rescored.log_prob, rollout.log_prob)


@pytest.mark.parametrize("sde_type", SDE_TYPES)
def test_generator_determinism_and_per_sample_generators(sde_type):
    v, x = _inputs(shape=(3, 2, 4))
    kernel = get_kernel(sde_type)
    draw = lambda gen, sl=slice(None): step(kernel, v[sl], x[sl], SIGMAS, 2, ETA, generator=gen).prev_sample
    assert torch.equal(draw(torch.Generator().manual_seed(7)), draw(torch.Generator().manual_seed(7)))
    assert not torch.equal(draw(torch.Generator().manual_seed(7)), draw(torch.Generator().manual_seed(8)))
    seeds = (11, 12, 13)
    batched = draw([torch.Generator().manual_seed(s) for s in seeds])
    for i, s in enumerate(seeds):
        assert torch.equal(batched[i : i + 1], draw(torch.Generator().manual_seed(s), slice(i, i + 1)))
    with pytest.raises(ValueError, match="3"):
        draw([torch.Generator()])


@pytest.mark.parametrize("sde_type", SDE_TYPES)
def test_deterministic_branch_is_euler_scored_under_the_sde(sde_type):
    v, x = _inputs()
    out = step(get_kernel(sde_type), v, x, SIGMAS, 8, ETA, deterministic=True)
    dt = SIGMAS[9] - SIGMAS[8]
    assert torch.equal(out.prev_sample, x + dt * v)
    rescored = step(get_kernel(sde_type), v, x, SIGMAS, 8, ETA, prev_sample=x + dt * v)
    assert torch.equal(out.log_prob, rescored.log_prob)
    with pytest.raises(ValueError, match="deterministic"):
        step(get_kernel(sde_type), v, x, SIGMAS, 8, ETA, deterministic=True, prev_sample=x)


@pytest.mark.parametrize("sde_type", SDE_TYPES)
def test_gradient_reaches_model_output_through_the_mean_only(sde_type):
    v, x = _inputs()
    v.requires_grad_(True)
    stored = (x + 0.05).requires_grad_(True)
    out = step(get_kernel(sde_type), v, x, SIGMAS, 10, ETA, prev_sample=stored)
    out.log_prob.sum().backward()
    assert v.grad is not None and torch.all(torch.isfinite(v.grad)) and v.grad.abs().sum() > 0
    assert stored.grad is None and not out.prev_sample.requires_grad


@pytest.mark.parametrize("sde_type", SDE_TYPES)
def test_sampled_noise_has_the_documented_std(sde_type):
    shape = (4, 50_000)  # 200k elements: the sample std is within ~0.3% (3σ) of the truth
    v, x = _inputs(shape=shape)
    for k in (1, 12):
        out = step(get_kernel(sde_type), v, x, SIGMAS, k, ETA, generator=torch.Generator().manual_seed(k))
        noise = out.prev_sample - out.mean
        assert noise.std().item() == pytest.approx(out.noise_std.item(), rel=0.01)
        assert abs(noise.mean().item()) < 0.01 * out.noise_std.item()


def test_dance_log_prob_hand_computed():
    # step 19: σ = 0.2083333, σ' = 0, dt = −0.2083333, η = .5: std = .5·√0.2083333 = 0.2282177, std² = 0.0520833
    # element 1: x = .5, v = 1:  s = −x/σ − (1−σ)v/σ = −2.4 − 3.8 = −6.2
    #            μ = x + dt·v − ½η²·s·dt = .5 − .2083333 − .125·(−6.2)(−.2083333) = 0.1302083
    #            x' = .3: log p = −(.1697917²)/(2·.0520833) − ln .2282177 − ln √(2π)
    #                           = −.27676 + 1.47744 − .91894 = .28174
    # element 2: x = −1, v = 2: s = 4.8 − 7.6 = −2.8, μ = −1 − .4166667 − .0729167 = −1.4895833
    #            x' = −1.5: log p = −(.0104167²)/.1041667 + 1.47744 − .91894 = .55746
    # log_prob = mean = (.28174 + .55746)/2 = .41960
    v = torch.tensor([[1.0, 2.0]])
    x = torch.tensor([[0.5, -1.0]])
    out = step(get_kernel("dance_grpo"), v, x, SIGMAS, 19, ETA, prev_sample=torch.tensor([[0.3, -1.5]]))
    torch.testing.assert_close(out.mean, torch.tensor([[0.1302083, -1.4895833]]))
    assert out.std.item() == pytest.approx(0.2282177, rel=1e-6)
    assert out.log_prob.item() == pytest.approx(0.41960, abs=2e-5)


def test_cps_log_prob_has_no_constants_or_variance():
    v, x = _inputs()
    mean = step(get_kernel("cps"), v, x, SIGMAS, 6, ETA, prev_sample=x).mean
    assert torch.equal(step(get_kernel("cps"), v, x, SIGMAS, 6, ETA, prev_sample=mean).log_prob, torch.zeros(2))
    # every element off by .5: log p = −.5² = −.25 whatever the std
    shifted = step(get_kernel("cps"), v, x, SIGMAS, 6, ETA, prev_sample=mean + 0.5)
    assert torch.allclose(shifted.log_prob, torch.full((2,), -0.25))
    last = step(get_kernel("cps"), v, x, SIGMAS, 19, ETA)  # σ' = 0: no noise, x' = μ = x̂0
    assert last.noise_std.item() == 0.0 and torch.equal(last.log_prob, torch.zeros(2))
    torch.testing.assert_close(last.prev_sample, last.pred_x0)


@pytest.mark.parametrize("sde_type", SDE_TYPES)
def test_sde_solver_flag(sde_type):
    v, x = _inputs()
    without = step(get_kernel(sde_type), v, x, SIGMAS, 4, ETA, prev_sample=x, sde_solver=False).mean
    with_solver = step(get_kernel(sde_type), v, x, SIGMAS, 4, ETA, prev_sample=x).mean
    if sde_type in ("sage_grpo", "dance_grpo"):  # the flag drops the score correction: μ = x + dt·v
        assert torch.equal(without, x + (SIGMAS[5] - SIGMAS[4]) * v)
        assert not torch.allclose(without, with_solver)
    else:  # flow_grpo and cps ignore it
        assert torch.equal(without, with_solver)


def test_invalid_arguments_raise():
    v, x = _inputs()
    with pytest.raises(ValueError, match="sage_grpo, dance_grpo, flow_grpo, cps"):
        get_kernel("ddim")
    with pytest.raises(ValueError, match="outside"):
        step(get_kernel("sage_grpo"), v, x, SIGMAS, 20, ETA)
    with pytest.raises(ValueError, match="integer"):
        step(get_kernel("sage_grpo"), v, x, SIGMAS, torch.tensor([0.0, 1.0]), ETA)
    with pytest.raises(ValueError, match="sde_type"):
        grad_balance_scales("ddim", SIGMAS, ETA)


def test_check_schedule():
    for sde_type in SDE_TYPES:
        check_schedule(get_kernel(sde_type), SIGMAS, ETA)
    check_schedule(get_kernel("cps"), SIGMAS, 0.0)  # cps' log-prob has no variance: η = 0 is a valid (DDIM) sampler
    for sde_type in ("sage_grpo", "dance_grpo", "flow_grpo"):
        with pytest.raises(ValueError, match="steps"):
            check_schedule(get_kernel(sde_type), SIGMAS, 0.0)
    with pytest.raises(ValueError, match=r"steps \[0, 1"):  # σ' > 1 − 3e-3 makes sage's std² negative
        check_schedule(get_kernel("sage_grpo"), shifted_sigmas(1000, 5.0), ETA)
    with pytest.raises(ValueError, match="decrease"):
        check_schedule(get_kernel("dance_grpo"), SIGMAS.flip(0), ETA)
