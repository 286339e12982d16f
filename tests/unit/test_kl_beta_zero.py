"""The adaptive β from --kl_coef and --kl_min_coef as the reference builds it (docs/differences.md, the KL at β = 0):
its ``kl_min_coef or kl_coef`` (a floor of 0 is --kl_coef), and a β that starts at 0 stays 0 for the whole run, the
KL never computed (the reference computes it, and updates the controller, only while β > 0): a run without KL and,
here, without a reference model."""

import pytest

from model_fixtures import TINY_IMAGE_TOKENS, TINY_TEXT
from sage_grpo.config import parse_cli
from sage_grpo.config.train import TrainConfig
from sage_grpo.config.validation import check_option_values
from sage_grpo.rl import AdaptiveKLController, kl_mode_of

# for a target (--kl_weight) of 1e-3, horizon 4, window 2: the warm-up, then too small (×1.1), then too large (×0.9)
KLS = [1e-3] * 3 + [0.0] * 4 + [5e-3] * 30


def test_beta_zero_stays_zero_and_the_controller_never_moves():
    controller = AdaptiveKLController.from_flags(kl_weight=1e-3, kl_coef=0.0, kl_min_coef=0.0, horizon=4, window=2)
    assert (controller.min_coef, controller.init_coef, controller.max_coef) == (0.0, 0.0, 1e-3)
    assert [controller.update(kl) for kl in KLS] == [0.0] * len(KLS)
    assert controller.state_dict() == {"kl_coef": 0.0, "num_updates": 0, "history": []}  # nothing recorded


def test_beta_zero_is_a_run_without_kl():
    from sage_grpo.rl.kl_controller import beta_stays_zero

    flags = ["--kl_weight", "1e-5", "--kl_coef", "0", "--kl_min_coef", "0"]
    mode = kl_mode_of(parse_cli(TrainConfig, flags).trust_region)
    assert (mode.name, mode.uses_reference, mode.moving_anchor, mode.dual) == ("none", False, False, False)
    assert kl_mode_of(parse_cli(TrainConfig, flags[:4]).trust_region).name == "dual_moving"  # --kl_min_coef 1e-7: β > 0
    assert kl_mode_of(parse_cli(TrainConfig, ["--kl_weight", "1e-5", "--kl_min_coef", "0"]).trust_region).name == "dual_moving"
    assert [beta_stays_zero(*flags) for flags in [(1e-5, 0.0, 0.0), (0.0, 0.0, 0.0), (1e-5, 1e-7, 0.0),
                                                  (1e-5, 0.0, 1e-7)]] == [True, False, False, False]
    notes = check_option_values(parse_cli(TrainConfig, flags))
    assert ("--kl_coef 0 with --kl_min_coef 0: the KL weight beta stays 0 for the whole run (the reference computes "
            "the KL only while beta > 0), so --kl_weight 1e-05 adds no KL term and no reference model is loaded; for "
            "a KL term set --kl_coef > 0") in notes


def test_beta_zero_loads_no_reference_model(tiny_root):
    from sage_grpo.models.bundle import build_models, resolve_device
    from sage_grpo.plan.memory import placement_of

    cfg = TrainConfig.of(pretrained_model_root=str(tiny_root), dtype="fp32", device="cpu", kl_weight=1e-3, kl_coef=0.0,
                      kl_min_coef=0.0, enable_gradient_checkpointing=False,
                      vision_num_semantic_tokens=TINY_IMAGE_TOKENS, text_max_length=TINY_TEXT.max_length,
                      byt5_max_length=TINY_TEXT.max_length_2)
    models = build_models(cfg, kl_mode_of(cfg.trust_region), placement_of(cfg, resolve_device(cfg)))
    assert models.reference is None and models.policy is not None


def test_min_coef_zero_falls_back_to_kl_coef():
    """--kl_min_coef 0 with --kl_coef 1e-4: the floor and the warm-up's start are 1e-4, not 0."""
    from sage_grpo.rl.kl_controller import reference_coefs

    assert reference_coefs(1e-3, 1e-4, 0.0) == (1e-4, 1e-4)
    assert reference_coefs(1e-3, 1e-4, 2e-4) == (2e-4, 2e-4)  # a floor given: kept, β_0 clamped up to it
    assert reference_coefs(1e-3, 0.0, 2e-4) == (2e-4, 2e-4)
    controller = AdaptiveKLController.from_flags(kl_weight=1e-3, kl_coef=1e-4, kl_min_coef=0.0, horizon=4, window=2)
    betas = [controller.update(kl) for kl in KLS]
    assert betas[:3] == pytest.approx([3.25e-4, 5.5e-4, 7.75e-4], rel=1e-12)  # 1e-4 + 9e-4·n/4
    # mean(1e-3, 0) = target/2: unchanged; then mean 0: ×1.1 (the third clamped to the max, 1e-3); then a mean of
    # 2.5 or 5 times the target: ×0.9 each time
    assert betas[3:8] == pytest.approx([7.75e-4, 8.525e-4, 9.3775e-4, 1e-3, 9e-4], rel=1e-12)
    assert betas[-1] == 1e-4 and min(betas) == 1e-4  # clamped at the floor, --kl_coef (without the fallback: 0)
    notes = check_option_values(parse_cli(TrainConfig, ["--kl_weight", "1e-3", "--kl_coef", "1e-4",
                                                          "--kl_min_coef", "0"]))
    assert ("--kl_min_coef 0 means --kl_coef 0.0001 (the reference's 'kl_min_coef or kl_coef'): beta's floor and the "
            "start of its warm-up") in notes
