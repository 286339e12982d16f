"""Every point a researcher extends is a table: an SDE, a KL controller, a reward, a held-out scorer, a drift proxy is
one new module and one table line. The toy SDE and the toy KL controller below are written as files and added with a
line each, then a step of the tiny model trains with them; the other tables are checked where they are read."""
import sys
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch
from model_fixtures import tiny_args

from sage_grpo.config import ConfigError, parse_cli
from sage_grpo.config.train import TrainConfig
from sage_grpo.config.validation import check_option_values
from sage_grpo.rl import build_kl_controller, kl_mode_of
from sage_grpo.rl.kl_controllers import KL_CONTROLLERS
from sage_grpo.sde.registry import SDE_KERNELS
from sage_grpo.tracking.run_dir import read_metrics, training_rows
from sage_grpo.trainer import GRPOTrainer

pytestmark = pytest.mark.unit

TOY_SDE = '''"""A toy SDE: the Euler mean with noise of a fixed std 0.1; it records the sigmas it steps from."""
import torch

from sage_grpo.sde.base import SDEKernel, gaussian_log_density

STEPPED_FROM = set()


def stds(sigmas, eta):
    std = torch.full_like(sigmas.sigma, 0.1)
    return std, std


def mean(x, v, sigmas, eta, sde_solver):
    STEPPED_FROM.update(round(s, 6) for s in sigmas.sigma.flatten().tolist())
    return x + sigmas.dt * v


KERNEL = SDEKernel(name="toy_sde", stds=stds, mean=mean, log_density=gaussian_log_density, needs_positive_noise=True)
'''

TOY_KL = '''"""A toy KL controller: beta starts at --kl_weight and halves at every update; it keeps the KL values it saw."""
import torch


class Halving:
    def __init__(self, beta, device):
        self.kl_coef, self.seen = torch.full((), beta, dtype=torch.float64, device=device), []

    def update(self, kl):
        self.seen.append(float(kl))
        self.kl_coef = self.kl_coef / 2
        return self.kl_coef

    def state_dict(self):
        return {"kl_coef": float(self.kl_coef), "seen": list(self.seen)}

    def load_state_dict(self, state):
        self.kl_coef, self.seen = torch.tensor(state["kl_coef"], dtype=torch.float64), list(state["seen"])


def build(options, device):
    return Halving(options.kl_weight, device)
'''


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """The two files, and one line in each table."""
    (tmp_path / "toy_sde_plugin.py").write_text(TOY_SDE)
    (tmp_path / "toy_kl_plugin.py").write_text(TOY_KL)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(SDE_KERNELS, "toy_sde", "toy_sde_plugin")
    monkeypatch.setitem(KL_CONTROLLERS, "toy_kl", "toy_kl_plugin")
    yield
    for name in ("toy_sde_plugin", "toy_kl_plugin"):
        sys.modules.pop(name, None)


def test_a_toy_sde_and_a_toy_kl_controller_train_a_step_from_one_file_and_one_line_each(plugins, tiny_root, tmp_path):
    """The tiny run with 2 SDE steps: 2 samples x 2 steps, one inner epoch, so the controller sees four KL values (0:
    before its first update the policy is its KL reference, and replay gives the rollout's log-probs), β halves four
    times from --kl_weight and the logged β is the fourth iteration's (read before its update); every transition
    (rollout, reference means, replay) is the toy kernel's, from the run's two sigmas."""
    cfg = parse_cli(TrainConfig, tiny_args(tiny_root, tmp_path / "run", "--max_steps", "1", "--report_to", "none",
                                           "--grpo_sampling_steps", "2", "--use_muon", "false", "--sde_type", "toy_sde",
                                           "--kl_controller", "toy_kl"))
    trainer = GRPOTrainer(cfg)
    toy_sde = sys.modules["toy_sde_plugin"]
    assert trainer.sampler.kernel is toy_sde.KERNEL
    trainer.train()
    assert trainer.kl_controller.state_dict() == {"controller": "toy_kl", "kl_coef": 1e-3 / 2 ** 4, "seen": [0.0] * 4}
    assert training_rows(read_metrics(trainer.run_dir))[0]["KL_weight"] == pytest.approx(1e-3 / 2 ** 3)
    assert toy_sde.STEPPED_FROM == {round(s, 6) for s in trainer.sampler.sigmas[:-1].tolist()} and \
        len(toy_sde.STEPPED_FROM) == 2


# ---------------------------------------------------------------- the KL-controller table


def test_the_constant_controller_holds_beta_at_the_kl_weight():
    """--kl_controller constant: β = --kl_weight, a device tensor, whatever the KL; --kl_coef 0 --kl_min_coef 0 (the
    adaptive β that stays 0, no KL) still has a KL term, and the adaptive controller's notes are not given."""
    flags = ["--kl_weight", "1e-3", "--kl_coef", "0", "--kl_min_coef", "0"]
    adaptive = parse_cli(TrainConfig, flags)
    constant = parse_cli(TrainConfig, flags + ["--kl_controller", "constant"])
    assert adaptive.trust_region.kl_controller == "adaptive" and kl_mode_of(adaptive.trust_region).name == "none"
    assert kl_mode_of(constant.trust_region).name == "dual_moving"
    assert check_option_values(constant) == [] and len(check_option_values(adaptive)) == 1
    controller = build_kl_controller("constant", constant.trust_region, torch.device("cpu"))
    for kl in (0.0, 5.0, 1e9):
        beta = controller.update(torch.tensor(kl, dtype=torch.float64))
        assert beta.dtype == torch.float64 and beta.shape == () and float(beta) == 1e-3
    assert controller.state_dict() == {"controller": "constant"}
    with pytest.raises(ValueError, match="the saved KL-controller state is the 'adaptive' controller's; this run's "
                                         "is 'constant'"):
        controller.load_state_dict({"kl_coef": 1e-4, "num_updates": 3, "history": [0.1]})  # before the table


def test_the_adaptive_controller_is_the_default_and_names_its_state():
    cfg = parse_cli(TrainConfig, [])
    controller = build_kl_controller(cfg.trust_region.kl_controller, cfg.trust_region, torch.device("cpu"))
    controller.update(torch.tensor(1.0, dtype=torch.float64))
    assert controller.state_dict() == {"controller": "adaptive", "kl_coef": pytest.approx(1e-7 + (1e-5 - 1e-7) / 100),
                                       "num_updates": 1, "history": [1.0]}
    with pytest.raises(SystemExit):
        parse_cli(TrainConfig, ["--kl_controller", "pid"])


def _saved_state(controller: dict) -> dict:
    from sage_grpo.checkpoint import capture_rng_state

    return {"global_step": 2, "update_steps": 2, "micro_steps": 2, "kl_controller": controller,
            "anchor_schedule": {"last_refreshed_at": None}, "layout": {"videos_per_step": 4},
            "rng": capture_rng_state()}


def test_a_resume_refuses_another_controllers_state(tiny_root, tmp_path):
    """One line before any model loads, --allow_config_change or not: a constant run cannot continue an adaptive
    state, nor an adaptive run a constant one's; a state of a controller this version lacks is refused too."""
    import yaml

    from sage_grpo.checkpoint import write_checkpoint_files
    from sage_grpo.config import to_dict
    from sage_grpo.resume import check_resume, check_training_state
    from sage_grpo.safe_io import CheckpointError

    args = tiny_args(tiny_root, tmp_path / "run")
    path = tmp_path / "run" / "checkpoint-2"
    for saved, now in (({"controller": "adaptive", "kl_coef": 1e-4, "num_updates": 4, "history": [0.1]}, "constant"),
                       ({"kl_coef": 1e-4, "num_updates": 4, "history": [0.1]}, "constant"),  # before the table
                       ({"controller": "constant"}, "adaptive")):
        cfg = parse_cli(TrainConfig, args)
        write_checkpoint_files(path, model_state={"w": torch.ones(2)}, optimizer_state={"state": {}},
                               training_state=_saved_state(saved), config_yaml=yaml.safe_dump(to_dict(cfg)))
        cfg = parse_cli(TrainConfig, args + ["--resume_from_checkpoint", str(path), "--kl_controller", now,
                                             "--allow_config_change", "true"])
        old = saved.get("controller", "adaptive")
        with pytest.raises(ConfigError, match=rf"checkpoint-2 holds the state of the '{old}' KL controller, and this "
                                              rf"run asks for --kl_controller {now}: a controller cannot continue "
                                              rf"another's state. Resume with --kl_controller {old}, or start a new run"):
            check_resume(cfg, kl_mode_of(cfg.trust_region), distributed=False)
    with pytest.raises(CheckpointError, match=r"training_state.pt: kl_controller.controller must name a KL controller "
                                              r"of this version \(adaptive, constant\), got 'pid'"):
        check_training_state(_saved_state({"controller": "pid"}), tmp_path / "training_state.pt")
    check_training_state(_saved_state({"controller": "constant"}), tmp_path / "training_state.pt")


# ---------------------------------------------------------------- the reward, held-out scorer and drift-proxy tables

PLUGIN = '''from sage_grpo.rewards import reward_plugin


@reward_plugin
def mean_level(videos, prompts):
    return {"score": videos.mean(dim=(1, 2, 3, 4))}


mean_level.metric_names = ("score",)
'''


def test_a_reward_resolves_through_the_table_then_the_plugin_rule(tmp_path, monkeypatch):
    from sage_grpo.rewards import registry

    (tmp_path / "level_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "REWARDS", dict(registry.REWARDS))
    by_path = registry.resolve_reward("level_plugin:mean_level")  # not in the table: the plug-in rule
    registry.register_reward("level", "level_plugin:mean_level")  # one table line
    assert registry.REWARDS["level"] == "level_plugin:mean_level" and registry.resolve_reward("level") is by_path
    assert registry.resolve_reward("brightness") is registry.BUILTIN_REWARDS["brightness"]
    with pytest.raises(ValueError, match=r"unknown reward model 'levels'; known: \[.*'brightness'.*, 'level'\]"):
        registry.resolve_reward("levels")
    sys.modules.pop("level_plugin", None)


def test_a_held_out_scorer_line_reports_a_reward_under_its_own_keys(tmp_path, monkeypatch):
    """Any reward is a held-out metric under ``<name>_<metric>``; a line in the scorer table reports its metrics under
    their own names (as clipscore's and pickscore's)."""
    from sage_grpo.rewards import registry, scorers

    (tmp_path / "level_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "REWARDS", dict(registry.REWARDS))
    registry.register_reward("level", "level_plugin:mean_level")
    video = torch.full((3, 2, 4, 4), 0.25)
    plan = dict(model_root=str(tmp_path), clip_model="c", pickscore_model="p", pickscore_processor="q")
    as_reward = scorers.Scorers(scorers.plan_metrics(["level"], **plan), str(tmp_path), torch.device("cpu"),
                                torch.float32)
    assert as_reward(video, "a prompt") == {"level_score": 0.25}
    monkeypatch.setitem(scorers.HELD_OUT_SCORERS, "level", scorers.HeldOutScorer("level"))
    metrics = scorers.plan_metrics(["level"], **plan)
    assert metrics.rewards == () and scorers.held_out_key_test(metrics)("level_score") is True
    assert scorers.Scorers(metrics, str(tmp_path), torch.device("cpu"), torch.float32)(video, "a prompt") == \
        {"score": 0.25}
    sys.modules.pop("level_plugin", None)


def test_the_drift_metric_measures_the_tables_proxy(monkeypatch):
    """The validation metric takes the mean of the proxy's values over the validation samples; a table line is a
    proxy, and the denoising error is the default."""
    from sage_grpo.pipeline import drift, drift_proxies

    assert drift_proxies.drift_proxy(drift_proxies.DEFAULT_DRIFT_PROXY) is drift.base_denoising_errors
    calls = []

    def spread(base, sampler, latents, embeds, seeds, sigmas):
        calls.append((base, sampler, embeds, tuple(seeds), tuple(sigmas)))
        return latents.flatten(1).std(1)

    monkeypatch.setattr(sys.modules[__name__], "spread", spread, raising=False)
    monkeypatch.setitem(drift_proxies.DRIFT_PROXIES, "spread", f"{__name__}:spread")

    @contextmanager
    def base_on_device():
        yield "base"

    latents = [torch.tensor([0.0, 2.0, 0.0, 2.0]).view(1, 1, 4), torch.tensor([1.0, 1.0, 1.0, 1.0]).view(1, 1, 4)]
    samples = SimpleNamespace(models=SimpleNamespace(base_on_device=base_on_device), sampler="sampler", samples=[
        SimpleNamespace(latents=x.unsqueeze(1).expand(1, 2, 1, 4), embeds=f"e{i}", item=SimpleNamespace(seed=i))
        for i, x in enumerate(latents)])
    metric = drift.DriftProxyMetric([0.5], proxy="spread")
    assert metric(samples) == {"drift_proxy": pytest.approx((4 / 3) ** 0.5 / 2)}  # sample stds 1.1547 and 0
    assert calls == [("base", "sampler", "e0", (0,), (0.5,)), ("base", "sampler", "e1", (1,), (0.5,))]
    with pytest.raises(ValueError, match="unknown drift proxy 'nope'; the table holds: denoising_error, spread"):
        drift.DriftProxyMetric([0.5], proxy="nope")
