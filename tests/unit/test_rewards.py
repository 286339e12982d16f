"""Rewards: torch preprocessing, the tiny VideoReward in every checkpoint form and key layout, normalisation and
weighting, the mp4 path, the failure policy, plug-ins, toys and the composite's validation."""

import hashlib
import json
import math
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from sage_grpo.rewards import build_reward_fn, register_reward
from sage_grpo.rewards.base import score_with_fallback
from sage_grpo.rewards.prompt_templates import DETAILED_SPECIAL_TEMPLATE, REWARD_TOKENS, build_prompt
from sage_grpo.rewards.builtins import BUILTIN_REWARDS, VIDEOALIGN_METRICS, RewardContext
from sage_grpo.rewards.plugins import import_object
from sage_grpo.rewards.tiny import FULL_STEP, LORA_STEP, RELEASED_NORM_STATS, write_tiny_video_reward
from sage_grpo.rewards.tiny import gradient_videos as smooth_videos
from sage_grpo.rewards.toys import TargetColorReward, TemporalSmoothnessReward
from sage_grpo.rewards.video_preprocess import (
    normalize_frames,
    num_sampled_frames,
    patchify_video,
    sample_frame_indices,
    smart_resize,
)
from sage_grpo.video_io import read_video_frames, write_video
from sage_grpo.rewards.videoalign import VideoAlignReward
from sage_grpo.rewards.videoalign_checkpoint import insert_adapter_name, remap_state_dict_keys, resolve_checkpoint

PROMPTS = [
    "A cat walks on the grass.",
    "A red ball bounces on a wooden floor, slow motion, warm light.",
    "The camera pans over a city at night.",
]


def tiny_reward(root: Path, **kwargs) -> VideoAlignReward:
    return VideoAlignReward(root, device="cpu", dtype=torch.float32, **kwargs)


@pytest.fixture(scope="module")
def tiny_scorer(tiny_reward_root) -> VideoAlignReward:
    return tiny_reward(tiny_reward_root)


@pytest.fixture(scope="module")
def reference_scores(tiny_scorer) -> dict:
    return tiny_scorer(smooth_videos(), PROMPTS)


# ------------------------------------------------------------------ torch preprocessing


def test_frame_sampling_follows_qwen_vl_utils():
    # 81 frames at 24 fps, sampled at 2 fps: 6.75 -> round to even -> 6 frames (spec section 7 example).
    assert num_sampled_frames(81, 24.0, fps=2.0) == 6
    assert sample_frame_indices(81, 6) == [0, 16, 32, 48, 64, 80]
    # 9 frames: 0.75 is clamped up to min_frames = 4; linspace 0, 2.67, 5.33, 8 rounds to 0, 3, 5, 8.
    assert num_sampled_frames(9, 24.0, fps=2.0) == 4
    assert sample_frame_indices(9, 4) == [0, 3, 5, 8]
    # 1000 frames: 83.3 -> 84; 3 frames: max_frames = floor_even(3) = 2; nframes=5 rounds half to even -> 4.
    assert num_sampled_frames(1000, 24.0, fps=2.0) == 84
    assert num_sampled_frames(3, 24.0, fps=2.0) == 2
    assert num_sampled_frames(30, 24.0, nframes=5) == 4
    assert sample_frame_indices(10, 4) == [0, 3, 6, 9]  # linspace 0, 3, 6, 9 exactly


def test_smart_resize_matches_hand_computed_sizes():
    # 352x624 rollout, released max 200704: 364x616 is too big; beta = sqrt(219648/200704) -> floor to 336x588.
    assert smart_resize(352, 624, factor=28, min_pixels=128 * 28 * 28, max_pixels=200704) == (336, 588)
    # Too small: 28x28 grows by sqrt(100352/784) = 11.31 -> ceil to 12*28.
    assert smart_resize(28, 28, factor=28, min_pixels=100352, max_pixels=200704) == (336, 336)
    assert smart_resize(64, 96, factor=28, min_pixels=56 * 56, max_pixels=56 * 84) == (56, 84)
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(10, 3000, factor=28, min_pixels=1, max_pixels=10**9)


def test_patchify_matches_transformers_layout_and_pads_time():
    frames = torch.randn(6, 3, 56, 84)
    flat, grid = patchify_video(frames, patch_size=14, temporal_patch_size=2, merge_size=2)
    # transformers Qwen2VLVideoProcessor.patchify, written out for (B=1, T, C, H, W).
    gt, gh, gw = 3, 4, 6
    expected = frames[None].reshape(1, gt, 2, 3, gh // 2, 2, 14, gw // 2, 2, 14)
    expected = expected.permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9).reshape(gt * gh * gw, 3 * 2 * 14 * 14)
    assert grid == (gt, gh, gw) and torch.equal(flat, expected)
    odd, grid = patchify_video(frames[:3], patch_size=14, temporal_patch_size=2, merge_size=2)
    padded, _ = patchify_video(torch.cat([frames[:3], frames[2:3]]), patch_size=14, temporal_patch_size=2,
                               merge_size=2)
    assert grid == (2, 4, 6) and torch.equal(odd, padded)  # the last frame is repeated


def test_normalisation_is_clip_mean_std_on_0_255_frames():
    frames = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(1, 3, 1, 1) * 255
    assert normalize_frames(frames).abs().max() < 1e-5
    white = normalize_frames(torch.full((1, 3, 1, 1), 255.0)).flatten()
    assert torch.allclose(white, torch.tensor([(1 - 0.48145466) / 0.26862954, (1 - 0.4578275) / 0.26130258,
                                               (1 - 0.40821073) / 0.27577711]), atol=1e-5)


def test_prompt_template_holds_the_three_reward_tokens_in_order():
    text = build_prompt("a {curly} cat", "detailed_special")
    positions = [text.index(token) for token in REWARD_TOKENS]
    assert positions == sorted(positions) and "Textual prompt - a {curly} cat\n" in text
    assert len(DETAILED_SPECIAL_TEMPLATE) == 3997 and text.startswith("\nYou are tasked")
    assert build_prompt("x", "none") == "x"
    with pytest.raises(ValueError, match="detailed_special"):
        build_prompt("x", "simple")


def test_batch_layout_tokens_types_and_padding(tiny_scorer):
    builder = tiny_scorer.inputs
    frames = [builder.frames_from_tensor(v, 24.0) for v in smooth_videos()]
    # 9 frames at 24 fps -> 4 sampled; 64x96 is within max_frame_pixels (56x84 after rounding to 28), so
    # qwen-vl-utils enlarges it to its minimum of 128x28x28 pixels, as VideoAlign does: 280x392
    assert frames[0].shape == (4, 3, 280, 392)
    batch = builder.build(frames, PROMPTS)
    assert batch["video_grid_thw"].tolist() == [[2, 20, 28]] * 3
    assert batch["pixel_values_videos"].shape == (3 * 1120, 3 * 2 * 14 * 14)
    video_id = builder.video_token_id
    assert ((batch["input_ids"] == video_id).sum(-1) == 1120 // 4).all()  # grid_t*grid_h*grid_w / merge^2
    assert torch.equal(batch["mm_token_type_ids"] == 2, batch["input_ids"] == video_id)
    lengths = batch["attention_mask"].sum(-1)
    assert lengths[1] > lengths[0] and lengths.max() == batch["input_ids"].shape[1]
    pad = builder.pad_token_id
    for row, n in enumerate(lengths.tolist()):  # right padding
        assert (batch["input_ids"][row, n:] == pad).all() and (batch["input_ids"][row, :n] != pad).all()
    special = tiny_scorer.tokenizer.convert_tokens_to_ids(list(REWARD_TOKENS))
    assert all(int((batch["input_ids"][r] == s).sum()) == 1 for r in range(3) for s in special)
    chat = builder.render_chat("A cat.")
    assert chat.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                           "<|vision_start|><|video_pad|><|vision_end|>\nYou are tasked")
    assert chat.endswith("END\n<|im_end|>\n<|im_start|>assistant\n")


# ------------------------------------------------------------------ checkpoint forms, key layouts, errors


def _variant_root(tiny_reward_root: Path, tmp_path: Path, rename) -> Path:
    """Copy the tiny checkpoint and rename every checkpoint key with ``rename``."""
    root = tmp_path / "variant"
    shutil.copytree(tiny_reward_root, root)
    for step in (LORA_STEP, FULL_STEP):
        ckpt = root / "VideoReward" / f"checkpoint-{step}"
        for name in ("model.pth", "non_lora_state_dict.pth"):
            if (ckpt / name).exists():
                state = torch.load(ckpt / name, weights_only=True)
                torch.save({rename(k): v for k, v in state.items()}, ckpt / name)
        if (ckpt / "adapter_model.safetensors").exists():
            adapter = load_file(ckpt / "adapter_model.safetensors")
            save_file({rename(k): v for k, v in adapter.items()}, ckpt / "adapter_model.safetensors")
    return root


def _to_current(key: str) -> str:
    return next(iter(remap_state_dict_keys({key: 0}, "v1")))


def _to_odd_variants(key: str) -> str:
    """Legacy keys -> other spellings v3 must understand: vision_tower.* and top-level language_model.*."""
    key = _to_current(key)
    key = key.replace("base_model.model.model.visual.", "base_model.model.vision_tower.")
    return key.replace("base_model.model.model.language_model.", "base_model.model.language_model.")


def test_latest_checkpoint_is_the_default_and_lora_equals_full(tiny_reward_root, tiny_scorer, reference_scores):
    assert (tiny_scorer.checkpoint.step, tiny_scorer.checkpoint.form) == (FULL_STEP, "full")
    lora = tiny_reward(tiny_reward_root, checkpoint_step=LORA_STEP, checkpoint_mode="v1")
    assert (lora.checkpoint.step, lora.checkpoint.form) == (LORA_STEP, "lora")
    scores = lora(smooth_videos(), PROMPTS)
    for key, value in reference_scores.items():
        torch.testing.assert_close(scores[key], value, atol=1e-5, rtol=0)
    # The adapter really loaded: LoRA B matrices hold the written (non-zero) values under the adapter name.
    adapter = insert_adapter_name(remap_state_dict_keys(
        load_file(tiny_reward_root / "VideoReward" / f"checkpoint-{LORA_STEP}" / "adapter_model.safetensors"), "v1"))
    state = lora.model.state_dict()
    key = next(k for k in adapter if "lora_B" in k)
    assert ".lora_B.default." in key and adapter[key].abs().sum() > 0 and torch.equal(state[key], adapter[key])


@pytest.mark.parametrize("rename, step, mode", [
    (_to_current, FULL_STEP, "v2"),
    (_to_current, LORA_STEP, "v2"),
    (_to_current, FULL_STEP, "v3"),
    (_to_odd_variants, LORA_STEP, "v3"),
])
def test_every_remap_mode_loads_its_key_layout(tiny_reward_root, tmp_path, reference_scores, rename, step, mode):
    root = _variant_root(tiny_reward_root, tmp_path, rename)
    scores = tiny_reward(root, checkpoint_step=step, checkpoint_mode=mode)(smooth_videos(), PROMPTS)
    for key, value in reference_scores.items():
        torch.testing.assert_close(scores[key], value, atol=1e-5, rtol=0)


def test_wrong_remap_mode_names_the_layouts(tiny_reward_root):
    with pytest.raises(RuntimeError, match="after 'v2' key remapping.*v1 = pre-4.52"):
        tiny_reward(tiny_reward_root, checkpoint_mode="v2")  # legacy keys need v1 or v3
    with pytest.raises(ValueError, match="v4"):
        tiny_reward(tiny_reward_root, checkpoint_mode="v4")


def test_missing_files_are_listed_in_one_error(tiny_reward_root, tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        resolve_checkpoint(tmp_path / "nothing")
    message = str(info.value)
    assert "model_config.json" in message and "checkpoint-N" in message and "download_weights.sh" in message

    broken = tmp_path / "broken"
    shutil.copytree(tiny_reward_root, broken)
    base = broken / "VideoReward" / "tiny-qwen2-vl-base"
    (base / "model.safetensors").unlink()
    (base / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError) as info:
        resolve_checkpoint(broken, LORA_STEP)
    assert "model.safetensors" in str(info.value) and "tokenizer.json" in str(info.value)
    with pytest.raises(FileNotFoundError, match=r"available steps: \[1, 2\]"):
        resolve_checkpoint(tiny_reward_root, 7)

    # A hub id as model_name_or_path (the release says Qwen/Qwen2-VL-2B-Instruct) resolves to <root>/<repo name>.
    moved = tmp_path / "moved"
    shutil.copytree(tiny_reward_root, moved)
    shutil.move(moved / "VideoReward" / "tiny-qwen2-vl-base", moved / "tiny-qwen2-vl-base")
    config_path = moved / "VideoReward" / "model_config.json"
    config = json.loads(config_path.read_text())
    config["model_config"]["model_name_or_path"] = "SomeOrg/tiny-qwen2-vl-base"
    config_path.write_text(json.dumps(config))
    assert resolve_checkpoint(moved).base_dir == moved / "tiny-qwen2-vl-base"


# ------------------------------------------------------------------ scores, normalisation, weighting


def test_normalisation_overall_and_avg_from_known_logits(tiny_reward_root, monkeypatch):
    logits = torch.tensor([[4.0, 2.0, 3.0], [1.0, 0.5, -1.0]])
    monkeypatch.setattr(VideoAlignReward, "logits", lambda self, batch: logits)
    fn = build_reward_fn("videoalign_local", '{"VQ": 0.5, "MQ": 0.5, "TA": 1.0}',
                         context=RewardContext(tiny_reward_root, dtype=torch.float32))
    out = fn(smooth_videos(2), PROMPTS[:2])
    s = RELEASED_NORM_STATS
    vq = (logits[:, 0].double() - s["VQ_mean"]) / s["VQ_std"]
    mq = (logits[:, 1].double() - s["MQ_mean"]) / s["MQ_std"]
    ta = (logits[:, 2].double() - s["TA_mean"]) / s["TA_std"]
    # Row 0 by hand: VQ = (4 - 3.6757)/2.2476 = 0.14429, MQ = (2 - 1.1646)/1.3811 = 0.60488,
    # TA = (3 - 2.8105)/2.5121 = 0.07544; avg = 0.5*0.14429 + 0.5*0.60488 + 0.07544 = 0.45002.
    assert abs(out["avg"][0].item() - 0.45002) < 1e-4
    torch.testing.assert_close(out["videoalign_local_vq"], vq.float())
    torch.testing.assert_close(out["videoalign_local_overall"], (vq + mq + ta).float())
    torch.testing.assert_close(out["avg"], (0.5 * vq + 0.5 * mq + ta).float())
    assert list(out) == ["videoalign_local_vq", "videoalign_local_mq", "videoalign_local_ta",
                         "videoalign_local_overall", "avg"]
    # Empty weights: the reference's {VQ: 1, MQ: 1, TA: 1}; lower-case metric names resolve too.
    torch.testing.assert_close(build_reward_fn("auto", {}, context=RewardContext(tiny_reward_root, dtype=torch.float32))(
        smooth_videos(2), PROMPTS[:2])["avg"], (vq + mq + ta).float())
    raw = tiny_reward(tiny_reward_root, use_norm=False).scores_from_logits(logits)
    torch.testing.assert_close(raw["Overall"], logits.sum(-1))
    lower = build_reward_fn("videoalign_local", {"vq": 2.0}, context=RewardContext(tiny_reward_root, dtype=torch.float32))
    torch.testing.assert_close(lower(smooth_videos(2), PROMPTS[:2])["avg"], (2 * vq).float())


def test_batched_scores_equal_one_by_one(tiny_scorer, reference_scores):
    videos = smooth_videos()
    singles = [tiny_scorer(videos[i:i + 1], PROMPTS[i:i + 1]) for i in range(3)]
    for key, value in reference_scores.items():
        torch.testing.assert_close(torch.cat([s[key] for s in singles]), value, atol=1e-5, rtol=0)
    # The scores depend on the video and on the prompt (the tolerance above is far below that spread).
    assert (reference_scores["Overall"].max() - reference_scores["Overall"].min()) > 1e-3
    other = tiny_scorer(videos[[0, 0]], [PROMPTS[0], PROMPTS[2]])["Overall"]
    assert abs(other[0] - other[1]) > 1e-4


def test_position_mode_mrope_uses_mm_token_type_ids(tiny_reward_root, reference_scores):
    scores = tiny_reward(tiny_reward_root, position_mode="mrope")(smooth_videos(), PROMPTS)
    assert torch.isfinite(scores["Overall"]).all()
    assert not torch.allclose(scores["Overall"], reference_scores["Overall"], atol=1e-6)


def test_tensor_and_mp4_paths_agree_within_codec_tolerance(tiny_scorer, reference_scores, tmp_path):
    videos = smooth_videos()
    paths = [write_video(tmp_path / f"{i}.mp4", v, fps=24) for i, v in enumerate(videos)]
    decoded, fps = read_video_frames(paths[0])
    assert fps == 24.0 and decoded.shape == (9, 64, 96, 3) and decoded.dtype == torch.uint8
    # Pixels the model sees: tensor path vs decoded mp4, in normalised units (std ~ 1/0.27 per unit pixel).
    builder = tiny_scorer.inputs
    from_tensor = builder.patchify(builder.frames_from_tensor(videos[0], 24.0))[0]
    from_file = builder.patchify(builder.frames_from_uint8(decoded, fps))[0]
    # Measured 0.03-0.045 over these test videos (~3/255 in pixels; yuv420 chroma subsampling dominates).
    assert (from_tensor - from_file).abs().mean() < 0.08
    by_file = tiny_scorer.score_files(paths, PROMPTS)
    # Measured |score diff| <= 1.6e-3 per head and 4.2e-3 for Overall, against an Overall spread of 0.14 between
    # these three videos: the codec moves scores far less than the content does (benchmarks/videoalign_codec.py
    # measures more videos: up to 4.9e-3 per head on gradients like these).
    for key in ("VQ", "MQ", "TA"):
        assert (by_file[key] - reference_scores[key]).abs().max() < 3e-3
    assert (by_file["Overall"] - reference_scores["Overall"]).abs().max() < 8e-3
    spread = reference_scores["Overall"].max() - reference_scores["Overall"].min()
    assert (by_file["Overall"] - reference_scores["Overall"]).abs().max() < 0.25 * spread
    round_trip = tiny_reward(tiny_scorer.checkpoint.reward_dir.parent, from_mp4=True)(videos, PROMPTS)
    torch.testing.assert_close(round_trip["Overall"], by_file["Overall"], atol=1e-6, rtol=0)


# ------------------------------------------------------------------ failure policy


def test_failing_sample_is_nan_with_a_warning_and_others_keep_scores(tiny_reward_root, reference_scores, monkeypatch):
    from sage_grpo.rewards.videoalign_inputs import VideoAlignInputBuilder

    render = VideoAlignInputBuilder.render_chat

    def flaky_render(self, prompt):
        if "red ball" in prompt:
            raise RuntimeError("decoder exploded")
        return render(self, prompt)

    monkeypatch.setattr(VideoAlignInputBuilder, "render_chat", flaky_render)
    fn = build_reward_fn(context=RewardContext(tiny_reward_root, dtype=torch.float32))
    with pytest.warns(RuntimeWarning) as record:
        out = fn(smooth_videos(), PROMPTS)
    messages = [str(w.message) for w in record]
    assert any("retrying sample by sample" in m for m in messages)
    assert any(PROMPTS[1] in m and "decoder exploded" in m for m in messages)
    assert torch.isnan(out["videoalign_local_vq"][1]) and torch.isnan(out["avg"][1])
    for key in ("vq", "mq", "ta", "overall"):
        kept = out[f"videoalign_local_{key}"][[0, 2]]
        torch.testing.assert_close(kept, reference_scores[key.upper() if key != "overall" else "Overall"][[0, 2]],
                                   atol=1e-5, rtol=0)


def test_non_finite_values_and_exceptions_become_nan_per_sample():
    calls = []

    def reward(videos, prompts):
        calls.append(len(prompts))
        if any("boom" in p for p in prompts):
            raise ValueError("bad prompt")
        return {"a": torch.tensor([math.inf if "inf" in p else 1.0 for p in prompts]),
                "b": torch.full((len(prompts),), 2.0)}

    with pytest.warns(RuntimeWarning) as record:
        out = score_with_fallback(reward, torch.zeros(4, 3, 2, 4, 4), ["ok", "boom", "inf", "fine"], name="toy")
    assert calls == [4, 1, 1, 1, 1]
    assert torch.equal(torch.isnan(out["a"]), torch.tensor([False, True, True, False]))
    assert torch.equal(torch.isnan(out["b"]), torch.tensor([False, True, True, False]))
    assert out["b"][0] == 2.0 and out["a"][3] == 1.0
    text = " ".join(str(w.message) for w in record)
    assert "'boom'" in text and "bad prompt" in text and "'inf'" in text and "non-finite" in text
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        score_with_fallback(lambda v, p: {"a": torch.zeros(2)}, torch.zeros(1, 3, 1, 2, 2), ["x"], name="bad")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = score_with_fallback(reward, torch.zeros(2, 3, 1, 2, 2), ["x", "y"], name="t", batch_size=1)
    assert out["a"].tolist() == [1.0, 1.0]


# ------------------------------------------------------------------ plug-ins, toys, validation

PLUGIN_SOURCE = '''
import torch

from sage_grpo.rewards import reward_plugin

@reward_plugin
def redness(videos, prompts):
    return {"red": videos[:, 0].mean(dim=(1, 2, 3)), "green": videos[:, 1].mean(dim=(1, 2, 3))}

@reward_plugin
class Scaled:
    metric_names = ("value",)
    def __init__(self, factor=1.0):
        self.factor = factor
    def __call__(self, videos, prompts):
        return {"value": self.factor * videos.mean(dim=(1, 2, 3, 4))}
'''


def test_plugin_by_dotted_path_joins_the_composite(tmp_path, monkeypatch):
    (tmp_path / "my_rewards_pkg").mkdir()
    (tmp_path / "my_rewards_pkg" / "__init__.py").write_text("")
    (tmp_path / "my_rewards_pkg" / "scores.py").write_text(PLUGIN_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    videos = torch.zeros(2, 3, 2, 4, 4)
    videos[0, 0] = 1.0  # video 0 all red, video 1 black
    fn = build_reward_fn("my_rewards_pkg.scores:redness", {"red": 2.0})
    out = fn(videos, ["a", "b"])
    assert out["my_rewards_pkg.scores:redness_red"].tolist() == [1.0, 0.0] and out["avg"].tolist() == [2.0, 0.0]
    register_reward("scaled", "my_rewards_pkg.scores.Scaled")
    fn = build_reward_fn("brightness", extra_models={
        "brightness": {"weight": 0.5}, "scaled": {"weight": 0.5, "kwargs": {"factor": 3.0}}})
    out = fn(videos, ["a", "b"])
    # brightness = 1/3 for video 0; scaled = 3 * 1/3 = 1; avg = 0.5 * 1/3 + 0.5 * 1 = 2/3.
    torch.testing.assert_close(out["avg"], torch.tensor([2 / 3, 0.0]))
    assert list(out) == ["brightness", "scaled_value", "avg"]
    assert out["scaled_value"].tolist() == pytest.approx([1.0, 0.0])
    with pytest.raises(ImportError, match="no_such_module"):
        build_reward_fn("no_such_module.rewards:fn")
    with pytest.raises(ImportError, match="has no attribute 'missing'"):
        import_object("my_rewards_pkg.scores:missing")
    with pytest.raises(ValueError, match="built-in"):
        register_reward("target_color", "my_rewards_pkg.scores.Scaled")


def test_toy_rewards_are_smooth_known_functions():
    target = torch.tensor([0.0, 0.0, 1.0]).view(1, 3, 1, 1, 1).expand(2, 3, 4, 5, 5).clone()
    target[1] = 0.0  # black
    # The demo config's spelling: the metric carries the model's name, reported under the bare key.
    fn = build_reward_fn("target_color", '{"target_color": 1.0}', reward_kwargs={"target_rgb": [0, 0, 1]})
    out = fn(target, ["x", "y"])
    assert list(out) == ["target_color", "avg"] and fn.metric_names == ("target_color", "avg")
    assert out["target_color"].tolist() == pytest.approx([1.0, 1 - 1 / 3]) and torch.equal(out["avg"],
                                                                                        out["target_color"])
    flicker = torch.zeros(1, 3, 4, 2, 2)
    flicker[:, :, 1::2] = 1.0
    smoothness = TemporalSmoothnessReward()
    assert smoothness(flicker, ["x"])["temporal_smoothness"].item() == pytest.approx(-1.0)
    assert smoothness(target, ["x", "y"])["temporal_smoothness"].tolist() == [0.0, 0.0]
    video = torch.full((1, 3, 2, 2, 2), 0.5, requires_grad=True)
    TargetColorReward([1, 0, 0])(video, ["x"])["target_color"].sum().backward()
    # d/dx of 1 - mean ||x - c||^2 / 3 at 0.5: red +2*0.5/(3*8), green/blue -2*0.5/(3*8) per element.
    assert video.grad[0, 0].flatten()[0].item() == pytest.approx(1 / 24)
    suite = build_reward_fn("toy_suite", {"color": 1.0, "smoothness": 0.5}, reward_kwargs='{"target_rgb": [0, 0, 1]}')
    out = suite(target, ["x", "y"])
    torch.testing.assert_close(out["avg"], out["toy_suite_color"] + 0.5 * out["toy_suite_smoothness"])
    mean = build_reward_fn("toy_suite")(target, ["x", "y"])
    torch.testing.assert_close(mean["avg"], (mean["toy_suite_color"] + mean["toy_suite_brightness"]
                                             + mean["toy_suite_smoothness"]) / 3)


@pytest.mark.parametrize("kwargs, match", [
    (dict(reward_model="target_color", extra_models={"target_color": {"weight": 0.5}}), "must have weight 1.0"),
    (dict(reward_model="video_align"), "not supported.*videoalign_local"),
    (dict(reward_model="video_score2"), "not supported"),
    (dict(reward_model="nonsense"), "unknown reward model 'nonsense'; known: .*target_color"),
    (dict(reward_model="target_color", reward_weights='{"target_color": 1'), "not valid JSON"),
    (dict(reward_model="target_color", reward_weights={"VQ": 1.0}), r"no metric 'VQ'.*\('target_color',\)"),
    (dict(reward_model="videoalign_local", reward_weights={"XQ": 1.0}), "no metric 'XQ'"),
    (dict(reward_model="target_color", reward_weights={"target_color": "high"}), "must be a number"),
    (dict(reward_model="brightness", extra_models={"target_color": {"w": 1}}), "needs 'weight'"),
    (dict(reward_model="target_color", reward_kwargs={"target_rgb": [2, 0, 0]}), "three values in"),
    (dict(reward_model="brightness", batch_size=0), "batch_size"),
    (dict(reward_model="target_color", reward_kwargs="[0, 0, 1]"), "reward_kwargs must be a dict"),
    (dict(reward_model="brightness", extra_models='{"target_color": '), "extra_models is not valid JSON"),
])
def test_invalid_configurations_raise_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_reward_fn(**kwargs)  # videoalign_local errors here are raised before any model loads


def test_builtin_metric_table_matches_the_callables():
    assert VIDEOALIGN_METRICS == VideoAlignReward.metric_names
    assert sorted(BUILTIN_REWARDS) == ["brightness", "clipscore", "pickscore", "target_color", "temporal_smoothness",
                                       "toy_large", "toy_red", "toy_redness", "toy_suite", "videoalign_local"]
    from sage_grpo.rewards.toys import TOY_REWARDS

    for name, cls in TOY_REWARDS.items():
        assert BUILTIN_REWARDS[name].metric_names == cls.metric_names


def test_tiny_checkpoint_is_small_and_deterministic(tiny_reward_root, tmp_path):
    reward_dir = write_tiny_video_reward(tmp_path, seed=0, key_layout="legacy")

    def digests(root):
        return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(root.rglob("*")) if p.is_file()}

    files = digests(reward_dir)
    assert files == digests(tiny_reward_root / "VideoReward")
    assert sum(p.stat().st_size for p in reward_dir.rglob("*") if p.is_file()) < 5e6
    assert {"model_config.json", "checkpoint-1/adapter_model.safetensors", "checkpoint-1/adapter_config.json",
            "checkpoint-1/non_lora_state_dict.pth", "checkpoint-2/model.pth",
            "tiny-qwen2-vl-base/config.json", "tiny-qwen2-vl-base/tokenizer.json"} <= set(files)
    config = json.loads((reward_dir / "model_config.json").read_text())
    assert config["model_config"]["reward_token"] == "special"
    assert config["inference_config"] == RELEASED_NORM_STATS
    assert files != digests(write_tiny_video_reward(tmp_path / "other", seed=1))
