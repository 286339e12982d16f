"""Trainer building blocks that need no model: prompt data, seeds, optimizer, LR schedule, run dir, checkpoints."""

from types import SimpleNamespace

import pytest
import torch

from sage_grpo.checkpoint import (CheckpointManager, capture_rng_state, list_checkpoints, resolve_resume_path,
                                  restore_rng_state, write_checkpoint_files)
from sage_grpo.config.train import TrainConfig
from sage_grpo.config.validation import ConfigError
from sage_grpo.data import GroupedPromptSampler, read_prompt_csvs, sample_seeds
from sage_grpo.distributed import ParallelDims
from sage_grpo.optim.optimizers import LRSchedule, MuonWithAdamW, build_optimizer
from sage_grpo.rl import AdaptiveKLController, MovingAnchorSchedule
from sage_grpo.safe_io import UnsafeFileError, load_plain
from sage_grpo.tracking.trackers import TensorBoardTracker, TrackerRun
from sage_grpo.tracking.run_dir import (MetricsLogger, prepare_run_dir, prune_rollout_media, read_metrics,
                                        tensorboard_tag)
from sage_grpo.pipeline.validation import validation_items


def _csv(tmp_path, text, name="p.csv"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_csv_reading_defaults_and_concatenation(tmp_path):
    a = _csv(tmp_path, "prompt,seed\nfirst,7\nsecond,\n", "a.csv")
    b = _csv(tmp_path, "index,prompt\n10,third\n", "b.csv")
    items = read_prompt_csvs([a, b])
    assert [(i.index, i.prompt, i.seed) for i in items] == [(0, "first", 7), (1, "second", 42), (10, "third", 42)]


def test_csv_reader_rules_shared_with_generate(tmp_path):
    """generate.py reads its CSVs with this reader too: its --seed for rows without one, column names with spaces,
    and every file must hold prompts (not only the first)."""
    a = _csv(tmp_path, "prompt, seed\nfirst, 7\nsecond,\n", "a.csv")
    assert [(i.prompt, i.seed) for i in read_prompt_csvs([a], default_seed=930)] == [("first", 7), ("second", 930)]
    with pytest.raises(ConfigError, match="empty.csv' holds no prompts"):
        read_prompt_csvs([a, _csv(tmp_path, "prompt,seed\n", "empty.csv")])


def test_validation_rows_without_a_seed_get_the_validation_seed(tmp_path):
    cfg = TrainConfig.of(valid_video_csv=[_csv(tmp_path, "prompt,seed\nfirst,5\nsecond,\n")], validation_global_seed=930)
    items = validation_items(cfg.validation)
    assert [(i.prompt, i.seed) for i in items] == [("first", 5), ("second", 930)]


@pytest.mark.parametrize("text,match", [
    ("text,seed\nhello,1\n", "no 'prompt' column"),
    ("prompt,seed\n", "holds no prompts"),
    ("prompt,seed\nhello,abc\n", "must be integers"),
    ("prompt,ref_image_path\nhello,/does/not/exist.png\n", r"row 2: reference image '/does/not/exist.png' does not"),
])
def test_csv_errors_are_clear(tmp_path, text, match):
    with pytest.raises(ConfigError, match=match):
        read_prompt_csvs([_csv(tmp_path, text)])


def test_missing_csv_names_the_file():
    with pytest.raises(ConfigError, match="nope.csv.*does not exist"):
        read_prompt_csvs(["nope.csv"])


def test_sampler_layout_groups_span_consecutive_ranks():
    # B=2, G=4, dp=4: U = 2*4/4 = 2 unique prompts per step; ranks (0,1) share one prompt, ranks (2,3) the other.
    per_rank = [GroupedPromptSampler(8, 2, 4, 4, r, seed=42).indices(0) for r in range(4)]
    assert per_rank[0] == per_rank[1] and per_rank[2] == per_rank[3]
    assert len(set(per_rank[0])) == 1 and per_rank[0][0] != per_rank[2][0]


def test_sampler_whole_groups_per_rank_and_epoch_advances():
    sampler = GroupedPromptSampler(6, 4, 2, 1, 0, seed=42)   # U = 4*1/2 = 2, steps/epoch = 6 // 2 = 3
    assert sampler.steps_per_epoch == 3
    epoch0 = [sampler.indices(s) for s in range(3)]
    for batch in epoch0:                                       # [p, p, q, q]: two whole groups of 2
        assert batch[0] == batch[1] and batch[2] == batch[3]
    assert sorted(i for b in epoch0 for i in b[::2]) == list(range(6))  # every prompt once per epoch
    epoch1 = [sampler.indices(s) for s in range(3, 6)]
    assert epoch1 != epoch0                                    # the order changes with the epoch


def test_sampler_needs_enough_prompts():
    with pytest.raises(ConfigError, match="cannot fill one step"):
        GroupedPromptSampler(1, 4, 2, 1, 0, seed=0)            # U = 2 > 1 prompt


def test_sample_seeds_follow_reference_offsets():
    assert sample_seeds([42, 42, 7, 7], num_generations=2, dp_rank=0, batch_size=4) == [42, 43, 7, 8]
    # group spans 2 ranks (B=2, G=4): rank_in_group 1 -> offsets 1*2+0, 1*2+1
    assert sample_seeds([42, 42], num_generations=4, dp_rank=3, batch_size=2) == [44, 45]
    assert sample_seeds([42, 42], 4, 3, 2, use_same_noise=True) == [42, 42]


def test_muon_takes_matrices_and_adamw_the_rest():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Conv3d(2, 2, 1))
    opt = build_optimizer(model.named_parameters(), use_muon=True, lr=1e-2, weight_decay=0.0)
    assert isinstance(opt, MuonWithAdamW)
    muon = opt.optimizers["muon"].param_groups[0]["params"]
    assert len(muon) == 1 and muon[0] is model[0].weight
    assert opt.optimizers["muon"].param_groups[0]["adjust_lr_fn"] == "match_rms_adamw"
    before = model[0].weight.detach().clone()
    model[0](torch.randn(3, 4)).pow(2).sum().backward()
    opt.step()
    # One Muon step moves W by lr * 0.2 * sqrt(max(8, 4)) * U with U orthogonal-ish: |dW|_max is O(lr * 0.57).
    delta = (model[0].weight - before).abs().max().item()
    assert 1e-4 < delta < 2e-2
    state = opt.state_dict()
    opt2 = build_optimizer(model.named_parameters(), use_muon=True, lr=1e-2, weight_decay=0.0)
    opt2.load_state_dict(state)
    assert torch.equal(opt2.optimizers["muon"].state_dict()["state"][0]["momentum_buffer"],
                       state["muon"]["state"][0]["momentum_buffer"])


def test_adamw_when_muon_is_off():
    opt = build_optimizer(torch.nn.Linear(2, 2).named_parameters(), use_muon=False, lr=1e-3, weight_decay=0.01)
    assert isinstance(opt, torch.optim.AdamW) and opt.param_groups[0]["betas"] == (0.9, 0.999)


def test_lr_schedules():
    assert [LRSchedule("constant", 1e-5, 500).lr_at(s) for s in (0, 10)] == [1e-5, 1e-5]  # warm-up ignored
    warm = LRSchedule("constant_with_warmup", 1e-4, 4)
    assert [warm.lr_at(s) for s in range(5)] == pytest.approx([0.0, 2.5e-5, 5e-5, 7.5e-5, 1e-4])  # diffusers' rule
    linear = LRSchedule("linear", 1e-4, 2, total_updates=6)
    assert [linear.lr_at(s) for s in range(7)] == pytest.approx([0.0, 5e-5, 1e-4, 7.5e-5, 5e-5, 2.5e-5, 0.0])


@pytest.mark.parametrize("kind", ["constant", "constant_with_warmup", "linear", "cosine", "cosine_with_restarts",
                                  "polynomial"])
def test_lr_schedule_is_diffusers_get_scheduler_on_each_sub_optimizer(kind):
    """Stepping diffusers' LambdaLR once per update on each of Muon's and AdamW's optimizers sets the learning rate
    that LRSchedule computes from the update count alone (what makes a resume exact without scheduler state)."""
    from diffusers.optimization import get_scheduler

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    optimizer = build_optimizer(model.named_parameters(), use_muon=True, lr=3e-4, weight_decay=0.0)
    settings = dict(num_warmup_steps=3, num_training_steps=12, num_cycles=2, power=2.0)
    schedulers = {name: get_scheduler(kind, opt, **settings) for name, opt in optimizer.optimizers.items()}
    ours = LRSchedule(kind, 3e-4, 3, total_updates=12, num_cycles=2, power=2.0)
    for update in range(12):
        for name, opt in optimizer.optimizers.items():
            assert all(group["lr"] == ours.lr_at(update) for group in opt.param_groups), (name, update)
            opt.step()
            schedulers[name].step()


def test_tensorboard_tag_routing():
    assert tensorboard_tag("gathered_avg_reward_mean") == "Reward/gathered_avg_reward_mean"
    assert tensorboard_tag("KL_weight") == "KL/KL_weight" and tensorboard_tag("approx_kl") == "KL/approx_kl"
    assert tensorboard_tag("rollout_time") == "Time/rollout_time"
    assert tensorboard_tag("clipfrac") == "Train/clipfrac"


def test_run_dir_refuses_a_second_run(tmp_path):
    run = prepare_run_dir(str(tmp_path / "run"), resuming=False, overwrite=False)
    (run / "run_config.yaml").write_text("x: 1\n")
    with pytest.raises(ConfigError, match="already holds a run"):
        prepare_run_dir(str(run), resuming=False, overwrite=False)
    prepare_run_dir(str(run), resuming=True, overwrite=False)


def test_overwrite_starts_over_in_place(tmp_path):
    run = prepare_run_dir(str(tmp_path / "run"), resuming=False, overwrite=False)
    (run / "run_config.yaml").write_text("x: 1\n")
    MetricsLogger(run).log_step(1, {"loss": 1.0})
    write_checkpoint_files(run / "checkpoint-1", model_state={"w": torch.ones(1)}, training_state={})
    (run / "notes.txt").write_text("mine")
    for tracker_dir in ("wandb", "swanlog"):
        (run / tracker_dir / "offline-run-x").mkdir(parents=True)
    (run / "trackers.json").write_text('{"wandb": "abc"}')  # a new run must not continue the old tracker runs
    prepare_run_dir(str(run), resuming=False, overwrite=True)
    assert read_metrics(run) == [] and not list_checkpoints(run) and not (run / "tb").exists()
    assert not any((run / name).exists() for name in ("wandb", "swanlog", "trackers.json"))
    assert (run / "notes.txt").read_text() == "mine"  # only what a run writes is removed


def test_metrics_logger_writes_jsonl_and_tensorboard(tmp_path):
    logger = MetricsLogger(tmp_path, trackers=[TensorBoardTracker(TrackerRun(tmp_path, "p", "run", {}, None))])
    metrics = {"gathered_avg_reward_mean": 0.6708, "gathered_avg_reward_std": 0.0027, "kl_loss": 1.07e-4,
               "KL_weight": 5.0e-5, "total_loss": -8.5e-5, "rollout_time": 1.5, "grpo_loop_time": 4.25,
               "failed_reward_count": 0.0, "clipfrac": 0.0}
    logger.log_step(3, metrics)
    logger.close()
    assert read_metrics(tmp_path) == [{"step": 3, **metrics}]  # every metric, in the file and in TensorBoard
    assert any((tmp_path / "tb").iterdir())
    line = (tmp_path / "train.log").read_text().strip().split("] ", 1)[1]
    assert line == "step 3 | reward 0.6708 ± 0.0027 | kl 0.000107 | β 5e-05 | loss -8.5e-05 | 5.8 s/step"


def test_rollout_media_retention(tmp_path):
    for step in range(5):
        (tmp_path / "rl_samples" / f"{step:07d}").mkdir(parents=True)
    prune_rollout_media(tmp_path, keep=2)
    assert sorted(p.name for p in (tmp_path / "rl_samples").iterdir()) == ["0000003", "0000004"]


class StandInModels:
    """What CheckpointManager uses of the model bundle: a (2, 3) linear policy, a frozen copy as the KL reference."""

    def __init__(self, seed: int, with_reference: bool = True):
        torch.manual_seed(seed)
        self.policy = torch.nn.Linear(3, 2)
        self.reference = torch.nn.Linear(3, 2).requires_grad_(False) if with_reference else None
        self.extras_written_into = []

    def trainable_state_dict(self):
        return {n: p.detach() for n, p in self.policy.named_parameters()}

    @torch.no_grad()
    def load_trainable_state_dict(self, state):
        for name, param in self.policy.named_parameters():
            param.copy_(state[name])

    def reference_state(self):
        return self.reference.state_dict()

    def load_reference_state(self, state):
        self.reference.load_state_dict(state, strict=True)

    def save_extras(self, checkpoint_dir):
        self.extras_written_into.append(checkpoint_dir.name)


class Counters:
    def __init__(self):
        self.global_step = self.update_steps = self.micro_steps = 0

    def state_dict(self):
        return {"global_step": self.global_step, "update_steps": self.update_steps, "micro_steps": self.micro_steps}

    def load_state_dict(self, state):
        self.global_step, self.update_steps, self.micro_steps = (state["global_step"], state["update_steps"],
                                                                 state["micro_steps"])


def _manager(run_dir, models, keep_checkpoints=0, counters=None):
    """A one-process manager over ``models``, AdamW, a KL controller and a moving anchor (both only with a
    reference, as the trainer builds them); ``manager.notes`` collects what it logs."""
    notes = []
    manager = CheckpointManager(
        models=models, optimizer=torch.optim.AdamW(models.policy.parameters(), lr=0.1),
        kl_controller=AdaptiveKLController.from_flags(0.1, 0.01, 0.001) if models.reference is not None else None,
        anchor_schedule=MovingAnchorSchedule(models.reference is not None, 2), counters=counters or Counters(),
        dims=ParallelDims(world_size=1), run_dir=run_dir, keep_checkpoints=keep_checkpoints,
        layout={"world_size": 1, "dp_size": 1, "sp_size": 1, "videos_per_step": 2}, config_yaml=lambda: "seed: 1\n",
        log=notes.append)
    manager.notes = notes
    return manager


def _train_to(manager, update):
    """One AdamW step and the counters, KL controller and anchor as a run at ``update`` has them."""
    manager.models.policy(torch.ones(1, 3)).sum().backward()
    manager.optimizer.step()
    manager.optimizer.zero_grad()
    manager.counters.global_step = manager.counters.update_steps = manager.counters.micro_steps = update
    manager.kl_controller.update(0.5)
    manager.models.reference.load_state_dict(manager.models.policy.state_dict())
    manager.anchor_schedule.mark_refreshed(update)


class GuardedCounters(Counters):
    """The trainer's state in a guarded run: the counters and the drift guard's state (GRPOTrainer.state_dict)."""

    def __init__(self):
        from sage_grpo.rl.drift_guard import DriftGuard, GuardBounds

        super().__init__()
        self.guard = DriftGuard(GuardBounds(2.0, 3, 0.0, 0.05))

    def state_dict(self):
        return {**super().state_dict(), "drift_guard": self.guard.state_dict()}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        if "drift_guard" in state:
            self.guard.load_state_dict(state["drift_guard"])


def test_the_drift_guard_resumes_and_a_roll_back_keeps_the_counters_and_the_guard(tmp_path):
    manager = _manager(tmp_path, StandInModels(seed=0), counters=GuardedCounters())
    manager.counters.guard.observe(0, 0.01, {})
    _train_to(manager, 2)
    manager.save(2)
    at_two = {name: value.clone() for name, value in manager.models.policy.state_dict().items()}
    training = load_plain(tmp_path / "checkpoint-2" / "training_state.pt", "training state")
    assert training["drift_guard"]["proxy_baseline"] == 0.01
    resumed = _manager(tmp_path, StandInModels(seed=1), counters=GuardedCounters())
    resumed.load(tmp_path / "checkpoint-2", training)
    assert resumed.counters.state_dict() == manager.counters.state_dict()
    unguarded = _manager(tmp_path, StandInModels(seed=1))  # a guarded run's checkpoint resumed without the guard
    unguarded.load(tmp_path / "checkpoint-2", training)
    assert unguarded.counters.state_dict() == {"global_step": 2, "update_steps": 2, "micro_steps": 2}

    _train_to(manager, 4)  # the weights move on; a drifted point, then the rollback to checkpoint-2
    manager.counters.guard.record_reward(0.5)
    manager.counters.guard.observe(4, 0.05, {})
    state, draw = manager.counters.state_dict(), torch.get_rng_state()
    manager.roll_back(tmp_path / "checkpoint-2")
    for name, value in manager.models.policy.state_dict().items():
        assert torch.equal(value, at_two[name]), name
    assert manager.counters.state_dict() == state and state["global_step"] == 4  # the counters and the guard stay
    assert manager.anchor_schedule.last_refreshed_at == 2 and manager.optimizer.state_dict()["state"][0]["step"] == 1
    assert torch.equal(torch.get_rng_state(), draw)


def test_checkpoint_manager_roundtrip_atomic_and_latest(tmp_path):
    saved = _manager(tmp_path, StandInModels(seed=0), keep_checkpoints=1)
    for update in (2, 4):
        _train_to(saved, update)
        saved.save(update)
    assert saved.models.extras_written_into == [".checkpoint-2.tmp", ".checkpoint-4.tmp"]  # inside the atomic write
    (tmp_path / ".checkpoint-6.tmp").mkdir()   # an interrupted save is never picked up
    assert list(list_checkpoints(tmp_path)) == [4]  # keep_checkpoints 1 pruned checkpoint-2
    latest = resolve_resume_path("latest", tmp_path)
    assert sorted(p.name for p in latest.iterdir()) == ["anchor", "config.yaml", "optimizer.pt", "training_state.pt",
                                                        "transformer"]
    training = load_plain(latest / "training_state.pt", "training state")
    assert list(training) == ["global_step", "update_steps", "micro_steps", "kl_controller", "anchor_schedule",
                              "layout", "rng"]
    next_draw = torch.rand(3)  # the global RNG continues from the state saved in checkpoint-4

    loaded = _manager(tmp_path, StandInModels(seed=1))
    loaded.load(latest, training)
    for name, value in saved.models.policy.state_dict().items():
        assert torch.equal(loaded.models.policy.state_dict()[name], value), name
        assert torch.equal(loaded.models.reference.state_dict()[name], value), name
    assert torch.equal(loaded.optimizer.state_dict()["state"][0]["exp_avg"],
                       saved.optimizer.state_dict()["state"][0]["exp_avg"])
    assert loaded.counters.state_dict() == {"global_step": 4, "update_steps": 4, "micro_steps": 4}
    assert loaded.kl_controller.state_dict() == saved.kl_controller.state_dict()
    assert loaded.anchor_schedule.last_refreshed_at == 4
    assert torch.equal(torch.rand(3), next_draw) and loaded.notes == []


def test_checkpoint_manager_resume_edge_cases(tmp_path):
    saved = _manager(tmp_path, StandInModels(seed=0))
    _train_to(saved, 2)
    path = saved.save(2)
    training = load_plain(path / "training_state.pt", "training state")

    # a run without a KL reference ignores the saved anchor and its schedule
    no_kl = _manager(tmp_path, StandInModels(seed=1, with_reference=False))
    no_kl.load(path, training)
    assert no_kl.counters.update_steps == 2 and no_kl.anchor_schedule.last_refreshed_at is None

    # written by another number of processes: the global RNG states are left as they are, with a note
    rng_elsewhere = {k: v for k, v in training.items() if k != "rng"}
    rng_elsewhere["rng_per_rank"] = [training["rng"], training["rng"]]
    other_world = _manager(tmp_path, StandInModels(seed=1))
    other_world.load(path, rng_elsewhere)
    assert other_world.notes == ["note: the checkpoint was written by 2 processes; global RNG states are not restored"]

    torch.save({"payload": SimpleNamespace()}, path / "optimizer.pt")  # not plain data
    with pytest.raises(UnsafeFileError, match="optimizer.pt"):
        _manager(tmp_path, StandInModels(seed=1)).load(path, training)


def test_rng_state_roundtrip():
    state = capture_rng_state()
    first = torch.rand(3)
    restore_rng_state(state)
    assert torch.equal(torch.rand(3), first)


def test_cuda_rng_states_restore_onto_fewer_visible_gpus(monkeypatch):
    """A checkpoint saved where 4 GPUs were visible resumes where 2 are: the first two states are set, by index, and
    a note names the two left (torch.cuda.set_rng_state_all would stop with an IndexError)."""
    restored = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: restored.__setitem__(device, state))
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [torch.full((4,), i, dtype=torch.uint8)
                                                                  for i in range(4)])
    state = capture_rng_state()
    assert len(state["cuda"]) == 4
    notes = restore_rng_state(state)
    assert sorted(restored) == [0, 1] and all(torch.equal(restored[i], state["cuda"][i]) for i in (0, 1))
    assert notes == ["note: the checkpoint holds CUDA RNG states of 4 GPUs and this process sees 2: those of cuda:2 "
                     "to cuda:3 are not restored"]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    restored.clear()
    assert restore_rng_state(state) == [] and sorted(restored) == [0, 1, 2, 3]
