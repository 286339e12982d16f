"""Train on any scorer, hold out the others: CLIPScore and PickScore are rewards like any other, several
rewards combine from the config with weights, a plug-in's weights are checked against its metrics before any model
loads, and the held-out validation metrics are planned (names, folders) before any model loads too."""
import pytest
import torch

from sage_grpo.cli.train import main as train_main
from sage_grpo.config import ConfigError, parse_cli
from sage_grpo.config.train import TrainConfig
from sage_grpo.rewards import build_reward_fn
from sage_grpo.rewards.registry import RewardContext
from sage_grpo.rewards.setup import check_reward_config
from sage_grpo.rewards.tiny import write_tiny_clip_scorers
from trust_support import write_module

README_PLUGIN = ("from sage_grpo.rewards import reward_plugin\n\n@reward_plugin\ndef my_reward(videos, prompts):\n"
                 "    return {'score': videos.mean(dim=(1, 2, 3, 4))}\n")
DECLARED = README_PLUGIN + "\n\nmy_reward.metric_names = ('score',)\n"


@pytest.fixture(scope="module")
def scorer_root(tmp_path_factory):
    return write_tiny_clip_scorers(tmp_path_factory.mktemp("scorers"), seed=0)


def refused(capsys, monkeypatch, tmp_path, *flags) -> str:
    """post_train.py's one-line error, with the model build replaced by a failure (so nothing may load first)."""
    import sage_grpo.startup.build as startup_build

    def no_models(*args):
        raise AssertionError("models must not load")

    monkeypatch.setattr(startup_build, "build_models", no_models)
    csv = tmp_path / "train.csv"
    csv.write_text("prompt\na red disk\n")
    with pytest.raises(SystemExit) as stop:
        train_main(["--train_video_csv", str(csv), "--pretrained_model_root", str(tmp_path), "--device", "cpu",
                    "--sp_size", "1", "--batch_size", "4", "--output_dir", str(tmp_path / "run"), *flags])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    return err


@pytest.mark.parametrize("module, source, message", [
    ("readme_reward", README_PLUGIN, "the weights {\"VQ\": 0.5, \"MQ\": 0.5, \"TA\": 1.0} are VideoAlign's (the default of "
                    "--reward_weights), and reward model '{module}:my_reward' declares no metric_names to check "
                    "them against; use --reward_weights '{\"<its metric>\": 1.0}' (or '' to weigh its metrics "
                    "equally), or declare its metrics (e.g. my_reward.metric_names = (\"score\",))"),
    ("declared_reward", DECLARED, "reward model '{module}:my_reward' has no metric 'VQ' for sub_reward; its metrics: ('score',); "
               "use --reward_weights '{\"score\": 1.0}' (or '' to weigh its metrics equally)"),
])
def test_a_plugin_with_mismatched_weights_fails_in_one_line_before_any_model_loads(tmp_path, monkeypatch, capsys,
                                                                                   module, source, message):
    """The README's plug-in as it was (no metric names, the default weights) and declaring its metric."""
    monkeypatch.syspath_prepend(str(tmp_path))
    write_module(tmp_path, module, source)
    err = refused(capsys, monkeypatch, tmp_path, "--reward_model", f"{module}:my_reward")
    assert err == f"error: --reward_model {module}:my_reward: {message.replace('{module}', module)}"


def test_a_declared_plugin_takes_its_own_weights_and_an_extra_one_is_told_its_entry(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    write_module(tmp_path, "declared_reward", DECLARED)
    cfg = parse_cli(TrainConfig, ["--reward_model", "declared_reward:my_reward", "--reward_weights", '{"score": 1}'])
    assert check_reward_config(cfg).models["declared_reward:my_reward"]["sub_reward"] == {"score": 1.0}
    # an extra model is told what to put in its entry
    cfg = parse_cli(TrainConfig, ["--reward_model", "target_color", "--reward_weights", '{"target_color": 1}',
                                  "--extra_rewards", '{"declared_reward:my_reward": {"weight": 1, "sub_reward": '
                                                     '{"VQ": 1}}}'])
    with pytest.raises(ConfigError, match=r"give its entry \"sub_reward\": \{\"score\": 1.0\} \(or none"):
        check_reward_config(cfg)


def test_several_rewards_combine_from_words_a_yaml_mapping_or_a_list(tmp_path):
    words = parse_cli(TrainConfig, ["--reward_model", "brightness", "--reward_weights", "",
                                    "--extra_rewards", "target_color=0.5", "temporal_smoothness"])
    assert words.reward.extra_rewards == {"target_color": 0.5, "temporal_smoothness": None}
    assert parse_cli(TrainConfig, ["--extra_rewards", '{"target_color": {"weight": 0.5}}']).reward.extra_rewards == {
        "target_color": {"weight": 0.5}}  # JSON on the command line
    config = tmp_path / "run.yaml"
    config.write_text("reward_model: brightness\nreward_weights: ''\nextra_rewards:\n  brightness: 0.25\n"
                      "  target_color: {weight: 0.5, kwargs: {target_rgb: [0, 0, 1]}}\n")
    mapping = parse_cli(TrainConfig, ["--config", str(config)])
    config.write_text("reward_model: brightness\nreward_weights: ''\nextra_rewards: [target_color]\n")
    listed = parse_cli(TrainConfig, ["--config", str(config)])
    assert listed.reward.extra_rewards == {"target_color": None}
    videos = torch.zeros(2, 3, 2, 4, 4)
    videos[0, 2] = 1.0  # video 0 all blue, video 1 black
    out = {}
    for name, cfg in (("words", words), ("mapping", mapping), ("listed", listed)):
        plan = check_reward_config(cfg)
        out[name] = build_reward_fn(cfg.reward.reward_model, plan.weights, extra_models=cfg.reward.extra_rewards)(videos, ["a", "b"])
    # brightness 1/3 and 0; target_color (red by default) 1 - ||blue - red||^2 / 3 = 1/3 and 1 - 1/3; smoothness 0
    torch.testing.assert_close(out["words"]["avg"], torch.tensor([1 / 3 + 0.5 / 3, 0.5 * 2 / 3]))
    # the mapping sets the primary's weight (0.25) and a blue target: 0.25 / 3 + 0.5 * 1 and 0 + 0.5 * 2 / 3
    torch.testing.assert_close(out["mapping"]["avg"], torch.tensor([0.25 / 3 + 0.5, 0.5 * 2 / 3]))
    torch.testing.assert_close(out["listed"]["avg"], torch.tensor([1 / 3 + 1 / 3, 2 / 3]))


def test_clipscore_and_pickscore_train_like_any_reward(scorer_root):
    context = RewardContext(model_root=scorer_root)
    fn = build_reward_fn("clipscore", None, context=context, extra_models={"pickscore": 0.01})
    videos = torch.rand(2, 3, 2, 20, 24, generator=torch.Generator().manual_seed(0))
    out = fn(videos, ["a red ball", "a cat"])
    assert list(out) == ["clipscore", "clipscore_clip_flowgrpo", "clipscore_clip_cosine", "pickscore",
                         "pickscore_pickscore_cosine", "avg"]
    torch.testing.assert_close(out["avg"], out["clipscore"] + 0.01 * out["pickscore"])


def test_missing_scorer_folders_and_unknown_held_out_metrics_stop_before_any_model_loads(tmp_path, scorer_root):
    cfg = parse_cli(TrainConfig, ["--reward_model", "clipscore", "--reward_weights", "", "--pretrained_model_root",
                                  str(tmp_path)])
    with pytest.raises(ConfigError, match=r"--clip_model openai/clip-vit-large-patch14: neither a folder nor found "):
        check_reward_config(cfg)
    base = ["--reward_model", "target_color", "--reward_weights", '{"target_color": 1}', "--pretrained_model_root",
            str(scorer_root)]
    with pytest.raises(ConfigError, match="--validation_metrics: unknown metric 'fid': use videoalign, clipscore"):
        check_reward_config(parse_cli(TrainConfig, base + ["--validation_metrics", "clipscore,fid"]))
    plan = check_reward_config(parse_cli(TrainConfig, base + ["--validation_metrics", "clipscore", "pickscore",
                                                              "target_color"]))
    assert plan.held_out.names == ("clipscore", "pickscore") and plan.held_out.clip_model == (
        scorer_root / "clip-vit-large-patch14")
    assert plan.notes == ("--validation_metrics target_color: the training reward scores the validation videos "
                          "already (Validation/<its keys>)",)
    off = check_reward_config(parse_cli(TrainConfig, base + ["--validation_metrics", "clipscore",
                                                             "--validation_interval", "0"]))
    assert off.held_out is None and "no validation runs" in off.notes[0]
