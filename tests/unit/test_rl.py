"""GRPO math on tiny hand-built tensors: advantages, PPO loss, KL terms, KL controller and anchor schedule."""
import math

import pytest
import torch

from sage_grpo.config import parse_cli
from sage_grpo.config.train import TrainConfig
from sage_grpo.rl import (
    AdaptiveKLController,
    AnchorMeans,
    MovingAnchorSchedule,
    clip_advantages,
    dual_kl,
    group_advantages,
    kl_mode,
    kl_mode_of,
    local_advantages,
    mean_matching_kl,
    ppo_clipped_loss,
    resolve_kl_mode,
    stepwise_kl,
    zero_spread_fraction,
)

# ------------------------------------------------------------------------------------------- advantages


def test_group_zscore_by_hand():
    # [1, 2, 3, 4]: mean 2.5, population var (2.25 + .25 + .25 + 2.25)/4 = 1.25, std 1.118034
    # → (r − 2.5)/1.118034 = ±1.341641, ±0.447214. Second group [5, 7]: mean 6, std 1 → ∓1
    adv = group_advantages(torch.tensor([1.0, 2.0, 3.0, 4.0]), 4)
    torch.testing.assert_close(adv, torch.tensor([-1.341641, -0.447214, 0.447214, 1.341641]))
    adv = group_advantages(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 7.0, 6.0, 6.0]), 4)
    torch.testing.assert_close(adv[4:], torch.tensor([-1.414214, 1.414214, 0.0, 0.0]))  # var (1+1)/4 = .5


def test_std_floor():
    assert torch.equal(group_advantages(torch.tensor([3.0, 3.0, 3.0]), 3), torch.zeros(3))
    # [0, 1e-7]: mean 5e-8, std 5e-8 < 1e-6 → ±5e-8/1e-6 = ±0.05
    adv = group_advantages(torch.tensor([0.0, 1e-7]), 2)
    torch.testing.assert_close(adv, torch.tensor([-0.05, 0.05]), rtol=1e-4, atol=0)


def test_non_finite_rewards_are_excluded_and_get_zero():
    # finite [1, 3, 5]: mean 3, var (4 + 0 + 4)/3 = 8/3, std 1.632993 → [−1.224745, 0, 1.224745]
    # (the reference would normalize [1, 0, 3, 5] instead)
    adv = group_advantages(torch.tensor([1.0, math.nan, 3.0, 5.0, math.inf, math.nan, -math.inf, math.nan]), 4)
    torch.testing.assert_close(adv, torch.tensor([-1.224745, 0.0, 0.0, 1.224745, 0.0, 0.0, 0.0, 0.0]))


def test_local_advantages_one_rank_per_group():
    # B = 4 holds two groups of 2: [1, 3] → [−1, 1]; [2, 2] → [0, 0]
    rewards = torch.tensor([1.0, 3.0, 2.0, 2.0])
    adv = local_advantages({"avg": rewards}, group_size=2, ranks_per_group=1, rank_in_group=0, batch_size=4)
    torch.testing.assert_close(adv, torch.tensor([-1.0, 1.0, 0.0, 0.0]))


def test_local_advantages_group_spread_over_ranks():
    # G = 4 over 2 ranks of B = 2: the whole group [1, 2, 3, 4] is normalized, each rank keeps its slice
    gathered = torch.tensor([1.0, 2.0, 3.0, 4.0])
    rank0 = local_advantages({"avg": gathered}, group_size=4, ranks_per_group=2, rank_in_group=0, batch_size=2)
    rank1 = local_advantages({"avg": gathered}, group_size=4, ranks_per_group=2, rank_in_group=1, batch_size=2)
    torch.testing.assert_close(rank0, torch.tensor([-1.341641, -0.447214]))
    torch.testing.assert_close(rank1, torch.tensor([0.447214, 1.341641]))
    with pytest.raises(ValueError):
        local_advantages({"avg": gathered}, group_size=4, ranks_per_group=2, rank_in_group=2, batch_size=2)
    with pytest.raises(ValueError):
        local_advantages({"avg": gathered[:2]}, group_size=4, ranks_per_group=2, rank_in_group=0, batch_size=2)
    with pytest.raises(ValueError):
        group_advantages(torch.ones(5), 2)


def test_clip_and_zero_spread_fraction():
    torch.testing.assert_close(clip_advantages(torch.tensor([-7.0, 3.0, 6.0]), 5.0), torch.tensor([-5.0, 3.0, 5.0]))
    # groups: [1, 1] flat; [2, 3] spread; [nan, 4] one finite → flat; [nan, nan] empty → flat: 3/4
    rewards = torch.tensor([1.0, 1.0, 2.0, 3.0, math.nan, 4.0, math.nan, math.nan])
    assert zero_spread_fraction(rewards, 2).item() == 0.75


# ------------------------------------------------------------------------------------------------- PPO


def test_ppo_loss_and_clip_metrics_by_hand():
    # r = [1, 1.5, 0.5], A = [1, 2, −3], c = 0.2
    #  i0: max(−1·1, −1·1) = −1
    #  i1: max(−2·1.5, −2·1.2) = max(−3, −2.4) = −2.4        (clipped)
    #  i2: max(3·0.5, 3·0.8) = max(1.5, 2.4) = 2.4           (clipped, pessimistic side)
    # loss = (−1 − 2.4 + 2.4)/3 = −1/3
    new = torch.log(torch.tensor([1.0, 1.5, 0.5]))
    old = torch.zeros(3)
    adv = torch.tensor([1.0, 2.0, -3.0])
    loss, metrics = ppo_clipped_loss(new, old, adv, clip_range=0.2)
    assert loss.item() == pytest.approx(-1 / 3, rel=1e-6)
    assert metrics["clipfrac"].item() == pytest.approx(2 / 3)
    assert metrics["clipfrac_gt_one"].item() == pytest.approx(1 / 3)
    assert metrics["clipfrac_lt_one"].item() == pytest.approx(1 / 3)
    # ½·mean(0, ln²1.5, ln²0.5) = ½·(0.164402 + 0.480453)/3 = 0.107476
    assert metrics["approx_kl"].item() == pytest.approx(0.107476, rel=1e-5)
    assert metrics["ratio_mean"].item() == pytest.approx(1.0)
    assert metrics["policy_loss"].item() == loss.item() and not metrics["policy_loss"].requires_grad
    # per-sample scale [1, .5, 2]: (−1 − 1.2 + 4.8)/3 = 0.866667
    scaled, _ = ppo_clipped_loss(new, old, adv, clip_range=0.2, scale=torch.tensor([1.0, 0.5, 2.0]))
    assert scaled.item() == pytest.approx(2.6 / 3, rel=1e-6)


def test_ppo_pessimistic_unclipped_side_and_advantage_clip():
    # r = 1.5, A = −1: max(1.5, 1.2) = 1.5 (the unclipped, worse term wins); A = 10 is clipped to 5 at r = 1
    new = torch.log(torch.tensor([1.5]))
    loss, metrics = ppo_clipped_loss(new, torch.zeros(1), torch.tensor([-1.0]), clip_range=0.2)
    assert loss.item() == pytest.approx(1.5, rel=1e-6) and metrics["clipfrac"].item() == 1.0
    loss, _ = ppo_clipped_loss(torch.zeros(1), torch.zeros(1), torch.tensor([10.0]))
    assert loss.item() == -5.0


def test_ppo_at_ratio_one_is_minus_scaled_advantage():
    lp = torch.tensor([-0.3, 0.2, 1.1, 0.0], requires_grad=True)
    adv = torch.tensor([1.0, -2.0, 0.5, 3.0])
    scale = torch.tensor([2.0, 1.0, 4.0, 0.5])
    loss, metrics = ppo_clipped_loss(lp, lp.detach(), adv, scale=scale)
    # −mean(A·w) = −(2 − 2 + 2 + 1.5)/4 = −0.875; ∂/∂lp = −A·w/B
    assert loss.item() == pytest.approx(-0.875)
    assert metrics["clipfrac"].item() == 0.0 and metrics["approx_kl"].item() == 0.0
    loss.backward()
    torch.testing.assert_close(lp.grad, -adv * scale / 4)


# -------------------------------------------------------------------------------------------------- KL


def test_kl_of_a_policy_with_itself_is_zero():
    mean = torch.randn(2, 3, 4)
    lp = torch.randn(2)
    assert mean_matching_kl(mean, mean.clone(), torch.tensor(0.3)).item() == 0.0
    assert stepwise_kl(lp, lp.clone()).item() == 0.0
    effective, parts = dual_kl(mean, mean.clone(), torch.tensor(0.3), lp, lp.clone(), use_dual_kl=True)
    assert effective.item() == 0.0 and parts["kl_moving"].item() == 0.0 and parts["kl_stepwise"].item() == 0.0


def test_mean_matching_kl_by_hand():
    # sample 0: δ = [1, 1] → mean δ² = 1;  sample 1: δ = [2, 0] → mean δ² = 2
    # std .5: 2·(.25 + 1e-6) = .500002 → [1.999992, 3.999984] → mean 2.999988
    # std [.5, 1]: [1/.500002, 2/2.000002] = [1.999992, 0.999999] → mean 1.4999955
    mean = torch.zeros(2, 2)
    ref = torch.tensor([[1.0, 1.0], [2.0, 0.0]])
    assert mean_matching_kl(mean, ref, 0.5).item() == pytest.approx(2.999988, rel=1e-6)
    assert mean_matching_kl(mean, ref, torch.tensor([0.5, 1.0])).item() == pytest.approx(1.4999955, rel=1e-6)
    with pytest.raises(ValueError):
        mean_matching_kl(mean, ref[:1], 0.5)


def test_dual_kl_combination():
    # step-wise: mean(old − new) = mean(.1, .3) = .2; dual = 1.0·2.999988 + 0.1·.2 = 3.019988
    mean, ref = torch.zeros(2, 2), torch.tensor([[1.0, 1.0], [2.0, 0.0]])
    old, new = torch.tensor([0.2, 0.4]), torch.tensor([0.1, 0.1])
    effective, parts = dual_kl(mean, ref, 0.5, old, new, use_dual_kl=True)
    assert effective.item() == pytest.approx(3.019988, rel=1e-6)
    assert parts["kl_stepwise"].item() == pytest.approx(0.2)
    effective, parts = dual_kl(mean, ref, 0.5, old, new, use_dual_kl=False)
    assert effective.item() == pytest.approx(2.999988, rel=1e-6) and set(parts) == {"kl_moving"}


def test_kl_mode_table():
    assert kl_mode(0.0, True, True) == "none"
    assert kl_mode(1e-5, False, False) == "fixed"
    assert kl_mode(1e-5, True, False) == "moving"
    assert kl_mode(1e-5, False, True) == "dual_fixed"
    assert kl_mode(1e-5, True, True) == "dual_moving"
    mode = resolve_kl_mode(1e-5, True, True)
    assert mode.uses_reference and mode.moving_anchor and mode.dual
    assert not resolve_kl_mode(0.0, True, True).uses_reference
    with pytest.raises(ValueError):
        kl_mode(-1.0, False, False)
    # the step-wise KL's reference: the policy before this update (the paper), or the rollout's on request
    assert not kl_mode_of(parse_cli(TrainConfig, []).trust_region).stepwise_to_rollout
    rollout = kl_mode_of(parse_cli(TrainConfig, ["--stepwise_kl_reference", "rollout"]).trust_region)
    assert rollout.stepwise_to_rollout and rollout.name == "dual_moving"
    assert not kl_mode_of(parse_cli(TrainConfig, ["--stepwise_kl_reference", "rollout", "--use_dual_kl", "false"]).trust_region)\
        .stepwise_to_rollout  # no step-wise term


# ------------------------------------------------------------------------------------------ controller


def test_controller_from_flags_clamps():
    c = AdaptiveKLController.from_flags(kl_weight=1e-5, kl_coef=1e-7, kl_min_coef=1e-7)  # reference defaults
    assert (c.target_kl, c.min_coef, c.init_coef, c.max_coef, c.kl_coef) == (1e-5, 1e-7, 1e-7, 1e-5, 1e-7)
    c = AdaptiveKLController.from_flags(kl_weight=1e-5, kl_coef=1e-3, kl_min_coef=-1.0)
    assert (c.min_coef, c.init_coef) == (0.0, 1e-5)
    with pytest.raises(ValueError):
        AdaptiveKLController.from_flags(kl_weight=0.0, kl_coef=0.0, kl_min_coef=0.0)


def test_controller_trajectory_by_hand():
    # target = max = 1, min = .2, init = .5, horizon 4, window 2
    c = AdaptiveKLController.from_flags(kl_weight=1.0, kl_coef=0.5, kl_min_coef=0.2, horizon=4, window=2)
    assert c.kl_coef == 0.5  # β before any update is the init value
    kls = [1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0]
    expected = [
        0.4,  # n=1: .2 + .8·1/4
        0.6,  # n=2: .2 + .8·2/4
        0.8,  # n=3: .2 + .8·3/4
        0.8,  # n=4: ramp over; mean(1, 1) − 1 = 0 → unchanged
        0.8,  # mean(1, 2) − 1 = .5, not > .5 → unchanged
        0.72,  # mean(2, 2) − 1 = 1 > .5 → ×0.9
        0.72,  # mean(2, 0) = 1 → unchanged
        0.792,  # mean(0, 0) − 1 = −1 < −.5 → ×1.1
        0.8712,
        0.95832,
        1.0,  # 1.054152 clamped to max = 1
        0.9,  # mean(0, 5) = 2.5 → ×0.9
    ]
    for kl, beta in zip(kls, expected):
        assert c.update(kl) == pytest.approx(beta, rel=1e-12)
        assert c.kl_coef == pytest.approx(beta, rel=1e-12)
    assert c.state_dict()["history"] == [0.0, 0.0, 0.0, 5.0]  # the last `horizon` values


def test_controller_on_tensors_matches_floats_bit_for_bit():
    """The trainer feeds device tensors (no host copy per iteration): same β trajectory, same checkpoint state, and
    a resume from that state (floats) continues identically."""
    kls = [1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0, 0.3, 1.7]

    def controller():
        return AdaptiveKLController.from_flags(kl_weight=1.0, kl_coef=0.5, kl_min_coef=0.2, horizon=4, window=2)

    on_floats, on_tensors = controller(), controller()
    expected = [on_floats.update(kl) for kl in kls]
    for i, kl in enumerate(kls):
        beta = on_tensors.update(torch.tensor(kl, dtype=torch.float64))
        assert isinstance(beta, torch.Tensor) == (i + 1 >= 4)  # a device tensor once the warm-up is over
        assert float(beta) == expected[i]
        if i == 7:
            state = on_tensors.state_dict()
    assert on_tensors.state_dict() == on_floats.state_dict()
    resumed = controller()
    resumed.load_state_dict(state)
    assert [float(resumed.update(torch.tensor(kl, dtype=torch.float64))) for kl in kls[8:]] == expected[8:]


def test_controller_default_ramp():
    # 1e-7 + (1e-5 − 1e-7)·n/100: n=1 → 1.99e-7, n=99 → 9.901e-6; n=100 at KL = target → unchanged;
    # n=101 at KL 1e-3: mean(9 × 1e-5, 1e-3) = 1.09e-4 > 1.5e-5 → ×0.9 = 8.9109e-6
    c = AdaptiveKLController.from_flags(kl_weight=1e-5, kl_coef=1e-7, kl_min_coef=1e-7)
    assert c.update(1e-5) == pytest.approx(1.99e-7)
    for _ in range(98):
        c.update(1e-5)
    assert c.kl_coef == pytest.approx(9.901e-6)
    assert c.update(1e-5) == pytest.approx(9.901e-6)
    assert c.update(1e-3) == pytest.approx(8.9109e-6)


def test_controller_state_dict_resumes_identically():
    kls = [0.3 * (i % 7) for i in range(30)]
    make = lambda: AdaptiveKLController.from_flags(kl_weight=1.0, kl_coef=0.5, kl_min_coef=0.2, horizon=8, window=3)
    original = make()
    for kl in kls[:13]:
        original.update(kl)
    resumed = make()
    resumed.load_state_dict(original.state_dict())
    assert resumed.kl_coef == original.kl_coef
    assert [original.update(kl) for kl in kls[13:]] == [resumed.update(kl) for kl in kls[13:]]
    assert resumed.state_dict() == original.state_dict()


# --------------------------------------------------------------------------------------------- anchor


def test_moving_anchor_schedule():
    schedule = MovingAnchorSchedule(enabled=True, every=10)
    assert [u for u in range(31) if schedule.should_refresh(u)] == [10, 20, 30]
    schedule.mark_refreshed(10)
    assert not schedule.should_refresh(10)  # the reference would copy again if update_steps did not move
    assert schedule.should_refresh(20)
    resumed = MovingAnchorSchedule(enabled=True, every=10)
    resumed.load_state_dict(schedule.state_dict())
    assert not resumed.should_refresh(10) and resumed.should_refresh(20)
    assert not MovingAnchorSchedule(enabled=False, every=10).should_refresh(10)
    assert not MovingAnchorSchedule(enabled=True, every=0).should_refresh(10)


def test_anchor_means_follow_a_refresh_between_inner_epochs():
    """K = 3 passes, an update after each, the anchor every 2 updates: refreshed after update 2 (inside the step), and
    the third pass gets means recomputed from the new anchor; the first two passes share the rollout's means."""
    schedule, computed, updates = MovingAnchorSchedule(enabled=True, every=2), [], 0
    means = AnchorMeans(lambda: computed.append(schedule.last_refreshed_at) or len(computed), schedule)
    seen = []
    for _ in range(3):  # one inner epoch: read the means, then one optimizer update and the refresh check
        seen.append(means.current())
        updates += 1
        if schedule.should_refresh(updates):
            schedule.mark_refreshed(updates)
    assert seen == [1, 1, 2] and computed == [None, 2] and schedule.last_refreshed_at == 2
    assert means.seconds >= 0.0
