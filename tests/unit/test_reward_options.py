"""Reward options: VideoAlign sampling overrides, frame picking before any
full-size work, reward aggregation at the advantage level, and the remote reward server and client."""
import importlib.util
import json
import math
import time
import urllib.error
import urllib.request
import warnings

import pytest
import torch

from sage_grpo.config import parse_cli
from sage_grpo.config.train import TrainConfig
from sage_grpo.config.validation import ConfigError
from sage_grpo.rewards import avg_term_weights, build_reward_fn, plan_reward_models
from sage_grpo.rewards.registry import RewardContext
from sage_grpo.rewards.remote import RemoteReward, RemoteRewardError, RemoteSettings, encode_request
from sage_grpo.rewards.serving import RequestError, RewardService, ServerLimits, decode_request
from sage_grpo.rewards.toys import ToySuiteReward
from sage_grpo.rewards.videoalign import VideoAlignReward
from sage_grpo.rewards.videoalign_inputs import FrameSampler, SamplingOverrides
from sage_grpo.rl import RewardAggregation, local_advantages
from sage_grpo.rewards.setup import check_reward_config

from procs import scaled
from reward_options_support import REPO_ROOT, ServerThread, fast_remote, random_videos


PROMPTS = ["A cat walks on the grass.", "The camera pans over a city at night."]


def _benchmark_script():
    """benchmarks/benchmark_videoalign_preprocess.py, which keeps the old preprocessing path as the reference."""
    path = REPO_ROOT / "benchmarks" / "benchmark_videoalign_preprocess.py"
    spec = importlib.util.spec_from_file_location("benchmark_videoalign_preprocess", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def videoalign(tiny_reward_root) -> VideoAlignReward:
    return VideoAlignReward(tiny_reward_root, device="cpu", dtype=torch.float32)


@pytest.mark.parametrize("spec_name", ["tiny", "released"])
def test_picking_frames_first_gives_the_old_paths_frames_bit_for_bit(videoalign, spec_name):
    bench = _benchmark_script()
    sampler = videoalign.inputs if spec_name == "tiny" else FrameSampler(bench.RELEASED_SPEC)
    gen = torch.Generator().manual_seed(1)
    # 33 frames at 24 fps -> 4 sampled of 33; values outside [0, 1] exercise the clamp; bf16 the dtype conversion.
    video = torch.rand(3, 33, 72, 100, generator=gen) * 1.2 - 0.1
    for tensor in (video, video.bfloat16()):
        old = bench.reference_frames_from_tensor(sampler, tensor, 24.0)
        new = sampler.frames_from_tensor(tensor, 24.0)
        assert new.shape[0] == 4 and torch.equal(old, new)
    frames_uint8 = torch.randint(0, 256, (33, 72, 100, 3), dtype=torch.uint8, generator=gen)
    old = bench.reference_frames_from_uint8(sampler, frames_uint8, 24.0)
    new = sampler.frames_from_uint8(frames_uint8, 24.0)
    assert torch.equal(old, new) and torch.equal(new, new.round())  # file frames stay on uint8 levels
    if spec_name == "tiny":  # the pixel values the model sees are the same tensors
        assert torch.equal(videoalign.inputs.patchify(old)[0], videoalign.inputs.patchify(new)[0])


def test_videoalign_scores_uint8_videos_as_the_same_videos_over_255(videoalign, monkeypatch):
    """``accepts_uint8``: the reward server hands VideoAlign the request's uint8 frames (no float32 copy of the
    request); the frames the model sees are those of the same videos / 255 (so are the scores: the remote test below
    compares them with the local reward's), and with ``--reward_from_mp4`` the videos written are those of the float
    path."""
    from sage_grpo.rewards import videoalign as videoalign_module

    levels = torch.randint(0, 256, (2, 3, 9, 64, 96), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    as_float = levels.float() / 255.0
    assert VideoAlignReward.accepts_uint8 is True
    for video, reference in zip(levels, as_float):
        assert torch.equal(videoalign.inputs.frames_from_tensor(video, 24.0),
                           videoalign.inputs.frames_from_tensor(reference, 24.0))
    written = []

    def write_video(path, video, fps):  # what the mp4 round trip would encode (the encoding itself is not ours)
        written.append(video)
        raise StopIteration

    monkeypatch.setattr(videoalign_module, "write_video", write_video)
    monkeypatch.setattr(videoalign, "from_mp4", True)
    for videos in (levels, as_float):
        with pytest.raises(StopIteration):
            videoalign(videos, PROMPTS)
    assert written[0].dtype == torch.float32 and torch.equal(written[0], written[1])


def test_default_sampling_is_the_checkpoints(videoalign, tiny_reward_root):
    data = json.loads((tiny_reward_root / "VideoReward" / "model_config.json").read_text())["data_config"]
    spec = videoalign.inputs.spec
    assert (spec.fps, spec.num_frames, spec.max_pixels) == (data["fps"], data["num_frames"], data["max_frame_pixels"])
    # 9 frames at 24 fps, 2 fps -> 0.75 clamped up to 4 frames; 112x168 is 18816 px > 56*84 -> halved to 56x84
    assert videoalign.inputs.frames_from_tensor(random_videos(1, 9, 112, 168)[0], 24.0).shape == (4, 3, 56, 84)
    assert SamplingOverrides().apply(spec) == spec  # no flag given: nothing changes


def test_overrides_change_the_frames_and_pixels_the_model_sees(videoalign, tiny_reward_root):
    videos = random_videos(2, 9, 112, 168)
    overridden = build_reward_fn("videoalign_local", context=RewardContext(
        tiny_reward_root, device="cpu", dtype=torch.float32,
        videoalign_sampling=SamplingOverrides(num_frames=8, max_pixels=200704)))
    inputs = overridden.fns["videoalign_local"].inputs
    frames = [inputs.frames_from_tensor(v, 24.0) for v in videos]
    # 8 of 9 frames; 112x168 fits the new budget, so qwen-vl-utils enlarges it to its minimum of 128x28x28 pixels
    assert frames[0].shape == (8, 3, 280, 392)
    batch = inputs.build(frames, PROMPTS)
    assert batch["video_grid_thw"].tolist() == [[4, 20, 28]] * 2  # default: [[2, 4, 6]]
    default_batch = videoalign.inputs.build([videoalign.inputs.frames_from_tensor(v, 24.0) for v in videos], PROMPTS)
    assert default_batch["video_grid_thw"].tolist() == [[2, 4, 6]] * 2
    scores, default = overridden(videos[:1], PROMPTS[:1]), videoalign(videos[:1], PROMPTS[:1])
    assert torch.isfinite(scores["avg"]).all() and not torch.equal(scores["videoalign_local_vq"], default["VQ"])
    # a rate instead of a count: 24 fps over 9 frames -> 9, rounded to even (ties to even) -> 8
    by_rate = SamplingOverrides(fps=24.0).apply(videoalign.inputs.spec)
    assert (by_rate.fps, by_rate.num_frames) == (24.0, None)
    assert FrameSampler(by_rate).frame_indices(9, 24.0) == [0, 1, 2, 3, 5, 6, 7, 8]


def test_sampling_flags_are_checked_before_any_model_loads():
    cfg = parse_cli(TrainConfig, ["--videoalign_fps", "4", "--videoalign_max_pixels", "200704"])
    plan = check_reward_config(cfg)
    assert plan.sampling == SamplingOverrides(fps=4.0, max_pixels=200704)
    both = parse_cli(TrainConfig, ["--videoalign_fps", "4", "--videoalign_num_frames", "8"])
    with pytest.raises(ConfigError, match="videoalign_fps 4.0 and videoalign_num_frames 8 both set.*give one"):
        check_reward_config(both)
    for flags, match in ((["--videoalign_num_frames", "1"], "must be >= 2"),
                         (["--videoalign_fps", "0"], "positive"),
                         (["--videoalign_max_pixels", "100"], "must be >= 784")):
        with pytest.raises(ConfigError, match=match):
            check_reward_config(parse_cli(TrainConfig, flags))


def test_a_pixel_budget_below_the_checkpoints_minimum_is_refused(tiny_reward_root):
    with pytest.raises(ValueError, match="below the checkpoint's minimum frame size 100352 pixels"):
        VideoAlignReward(tiny_reward_root, device="cpu", dtype=torch.float32,
                         sampling=SamplingOverrides(max_pixels=28 * 56))


VQ = torch.tensor([1.0, 2.0, 3.0, 4.0])
MQ = torch.tensor([0.0, 0.0, 2.0, 2.0])
TA = torch.tensor([5.0, 5.0, 5.0, 5.0])
WEIGHTS = {"vq": 0.5, "mq": 0.5, "ta": 1.0}


def _rewards(vq, mq, ta) -> dict:
    return {"vq": vq, "mq": mq, "ta": ta, "avg": 0.5 * vq + 0.5 * mq + 1.0 * ta}


def test_advantage_aggregation_by_hand():
    rewards = _rewards(VQ, MQ, TA)
    # sum: avg = [5.5, 6, 7.5, 8], mean 6.75, pop std sqrt(1.0625) = 1.030776 -> (avg - 6.75) / 1.030776
    total = RewardAggregation("sum")(rewards, 4)
    torch.testing.assert_close(total, torch.tensor([-1.212678, -0.727607, 0.727607, 1.212678]))
    # advantage: Â(VQ) = [-3, -1, 1, 3] / (2 sqrt(1.25)) = [-1.341641, -0.447214, 0.447214, 1.341641];
    # Â(MQ) = [-1, -1, 1, 1]; Â(TA) = 0 (no spread). 0.5 Â(VQ) + 0.5 Â(MQ) + 1.0 * 0:
    per_term = RewardAggregation("advantage", WEIGHTS)(rewards, 4)
    torch.testing.assert_close(per_term, torch.tensor([-1.170820, -0.723607, 0.723607, 1.170820]))


def test_a_failed_sample_is_excluded_the_same_way_in_both_modes():
    rewards = _rewards(VQ, torch.tensor([0.0, math.nan, 2.0, 2.0]), TA)  # sample 1's MQ failed -> avg[1] NaN
    # sum: finite avg [5.5, 7.5, 8], mean 7, pop std sqrt(3.5 / 3) = 1.080123; the failed sample gets 0
    torch.testing.assert_close(RewardAggregation("sum")(rewards, 4),
                               torch.tensor([-1.388730, 0.0, 0.462910, 0.925820]))
    # advantage: sample 1 is left out of every term, VQ included (its VQ = 2 is finite):
    # Â(VQ | [1, 3, 4]) = [-5/3, 1/3, 4/3] / 1.247219; Â(MQ | [0, 2, 2]) = [-4/3, 2/3, 2/3] / 0.942809
    expected = 0.5 * torch.tensor([-1.336306, 0.0, 0.267261, 1.069045]) \
        + 0.5 * torch.tensor([-1.414214, 0.0, 0.707107, 0.707107])
    torch.testing.assert_close(RewardAggregation("advantage", WEIGHTS)(rewards, 4), expected)
    all_failed = _rewards(VQ, torch.full((4,), math.nan), TA)
    assert torch.equal(RewardAggregation("advantage", WEIGHTS)(all_failed, 4), torch.zeros(4))
    assert torch.equal(RewardAggregation("sum")(all_failed, 4), torch.zeros(4))


def test_advantage_aggregation_over_a_group_spread_over_ranks():
    rewards = _rewards(VQ, MQ, TA)  # one group of 4 gathered from 2 ranks of B = 2
    aggregation = RewardAggregation("advantage", WEIGHTS)
    halves = [local_advantages(rewards, 4, 2, rank, 2, aggregation) for rank in (0, 1)]
    torch.testing.assert_close(torch.cat(halves), aggregation(rewards, 4))
    with pytest.raises(ValueError, match="needs the weights"):
        RewardAggregation("advantage")
    with pytest.raises(KeyError, match=r"\['vq'\].*not among the rewards"):
        aggregation({"mq": MQ, "ta": TA, "avg": MQ}, 4)


def test_term_weights_reproduce_avg_for_weighted_and_unweighted_models():
    models = plan_reward_models("videoalign_local")
    assert avg_term_weights(models) == {"videoalign_local_vq": 0.5, "videoalign_local_mq": 0.5,
                                        "videoalign_local_ta": 1.0}
    extra = {"toy_suite": {"weight": 0.5}, "brightness": {"weight": 0.25, "sub_reward": {"Brightness": 2.0}}}
    models = plan_reward_models("target_color", None, extra_models=extra)
    weights = avg_term_weights(models)
    assert weights == {"target_color": 1.0, "toy_suite_color": 0.5 / 3, "toy_suite_brightness": 0.5 / 3,
                       "toy_suite_smoothness": 0.5 / 3, "brightness": 0.5}
    fn = build_reward_fn("target_color", extra_models=extra)
    out = fn(random_videos(4, 3, 8, 8), ["p"] * 4)
    torch.testing.assert_close(out["avg"], sum(w * out[k] for k, w in weights.items()))
    cfg = parse_cli(TrainConfig, ["--reward_aggregation", "advantage"])
    assert check_reward_config(cfg).aggregation == RewardAggregation("advantage", avg_term_weights(
        plan_reward_models("videoalign_local", {"VQ": 0.5, "MQ": 0.5, "TA": 1.0})))


def test_advantage_aggregation_needs_known_terms(tmp_path, monkeypatch):
    plugin = tmp_path / "undeclared_reward.py"
    plugin.write_text("from sage_grpo.rewards import reward_plugin\n\n@reward_plugin\n"
                      "def score(videos, prompts):\n    return {'a': videos.mean(dim=(1, 2, 3, 4))}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="declares no metric_names and has no sub_reward"):
        avg_term_weights(plan_reward_models("undeclared_reward:score"))
    assert avg_term_weights(plan_reward_models("undeclared_reward:score", {"a": 2.0})) == {
        "undeclared_reward:score_a": 2.0}


@pytest.fixture
def toy_server():
    server = ServerThread(RewardService(ToySuiteReward(), "toy_suite", video_fps=24.0))
    yield server
    server.stop()


def test_remote_videoalign_scores_equal_the_local_ones(videoalign, tiny_reward_root):
    server = ServerThread(RewardService(videoalign, "videoalign_local", video_fps=24.0))
    try:
        videos = random_videos(2, 9, 64, 96)  # on the 8-bit grid: the uint8 wire format is exact
        remote = build_reward_fn("videoalign_local", context=RewardContext(tiny_reward_root),
                                 remote=fast_remote(server.url))
        assert isinstance(remote.fns["videoalign_local"], RemoteReward)
        local = build_reward_fn("videoalign_local", context=RewardContext(tiny_reward_root, device="cpu",
                                                                                dtype=torch.float32))
        remote_scores, local_scores = remote(videos, PROMPTS), local(videos, PROMPTS)
        assert list(remote_scores) == list(local_scores) == ["videoalign_local_vq", "videoalign_local_mq",
                                                             "videoalign_local_ta", "videoalign_local_overall", "avg"]
        for key, value in local_scores.items():
            assert torch.equal(remote_scores[key], value), key
    finally:
        server.stop()


def test_requests_are_split_to_fit_the_servers_limits(toy_server):
    toy_server.service.limits = ServerLimits(max_videos_per_request=2)
    calls = []
    score = toy_server.service.score
    toy_server.service.score = lambda body: calls.append(len(body)) or score(body)
    client = RemoteReward("toy_suite", fast_remote(toy_server.url), video_fps=24.0)
    videos = random_videos(5, 3, 8, 8)
    scores = client(videos, ["p"] * 5)
    expected = ToySuiteReward()(videos, ["p"] * 5)
    assert len(calls) == 3 and all(torch.equal(scores[k], expected[k].float()) for k in expected)


def test_a_server_failing_twice_with_500_is_retried(toy_server):
    failures = []
    score = toy_server.service.score

    def flaky(body):
        if len(failures) < 2:
            failures.append(1)
            raise RuntimeError("GPU busy")
        return score(body)

    toy_server.service.score = flaky
    client = RemoteReward("toy_suite", fast_remote(toy_server.url, retries=2), video_fps=24.0)
    videos = random_videos(2, 3, 8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a retried success warns about nothing
        scores = client(videos, ["a", "b"])
    assert len(failures) == 2 and torch.equal(scores["color"], ToySuiteReward()(videos, ["a", "b"])["color"].float())


def test_a_dead_server_gives_nan_after_the_retries(toy_server):
    client = RemoteReward("toy_suite", fast_remote(toy_server.url, retries=2), video_fps=24.0)
    composite = build_reward_fn("toy_suite", remote=fast_remote(toy_server.url, retries=2))
    toy_server.stop()
    start = time.perf_counter()
    with pytest.warns(RuntimeWarning, match=r"failed on 3 videos; they score NaN.*failed POST /score 3 times"):
        scores = client(random_videos(3, 3, 8, 8), ["a", "b", "c"])
    assert time.perf_counter() - start < scaled(5.0)
    assert set(scores) == {"color", "brightness", "smoothness"}
    assert all(torch.isnan(v).all() and v.shape == (3,) for v in scores.values())
    with pytest.warns(RuntimeWarning):
        out = composite(random_videos(2, 3, 8, 8), ["a", "b"])
    assert torch.isnan(out["avg"]).all()  # the trainer counts this step as failed


def test_the_client_checks_the_server_at_start(toy_server):
    with pytest.raises(ValueError, match="serves 'toy_suite', not --reward_model 'brightness'"):
        RemoteReward("brightness", fast_remote(toy_server.url), video_fps=24.0)
    with pytest.raises(ValueError, match="start it with --video_fps 16.0"):
        RemoteReward("toy_suite", fast_remote(toy_server.url), video_fps=16.0)
    url = toy_server.url
    toy_server.stop()
    with pytest.raises(RemoteRewardError, match="Start the server first"):
        RemoteReward("toy_suite", fast_remote(url, retries=0), video_fps=24.0)
    with pytest.raises(ValueError, match="must be an http"):
        RemoteSettings("127.0.0.1:8765")


def test_the_server_refuses_malformed_requests(toy_server):
    limits, body = ServerLimits(max_videos_per_request=4), encode_request(random_videos(2, 3, 8, 8), ["a", "b"], 24.0)
    videos, prompts = decode_request(body, limits, 24.0)
    assert videos.dtype == torch.uint8 and videos.shape == (2, 3, 3, 8, 8) and prompts == ["a", "b"]

    def with_header(**changes):
        header = {"prompts": ["a", "b"], "shape": [2, 3, 8, 8, 3], "dtype": "uint8", "video_fps": 24.0, **changes}
        text = json.dumps({k: v for k, v in header.items() if v is not None}).encode()
        return len(text).to_bytes(4, "big") + text + bytes(2 * 3 * 8 * 8 * 3)

    bad = {
        b"\x00\x00": "shorter than its 4-byte header",
        b"\x00\x10\x00\x00{}": "header length",
        b"\x00\x00\x00\x03\xff\xfe\x00": "not UTF-8 JSON",
        with_header(dtype="float32"): "dtype must be 'uint8'",
        with_header(shape=[2, 3, 8, 8, 4]): r"shape must be \[B, F, H, W, 3\]",
        with_header(shape=[2, 3, 8, -8, 3]): "positive integers",
        with_header(shape=[8, 3, 8, 8, 3]): "exceeds the limits",
        with_header(prompts=["a"]): "list of 2 strings",
        with_header(video_fps=30): "not the server's 24.0",
        with_header(video_fps=None): "exactly the keys",
        with_header(__class__="x"): "exactly the keys",
        body[:-1]: "do not fill shape",
    }
    for request, match in bad.items():
        with pytest.raises(RequestError, match=match):
            decode_request(request, limits, 24.0)
    # over HTTP: a 400 with the reason, and the client does not retry it
    calls = []
    score = toy_server.service.score
    toy_server.service.score = lambda body: calls.append(1) or score(body)
    request = urllib.request.Request(toy_server.url + "/score", data=with_header(dtype="int8"), method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=scaled(5.0))
    assert err.value.code == 400 and "dtype must be 'uint8'" in json.loads(err.value.read())["error"]
    client = RemoteReward("toy_suite", fast_remote(toy_server.url), video_fps=24.0)
    client.video_fps = 30.0  # as if the check at start had been skipped
    with pytest.warns(RuntimeWarning, match="refused POST /score: HTTP 400"):
        assert torch.isnan(client(random_videos(1, 3, 8, 8), ["a"])["color"]).all()
    assert len(calls) == 2  # the raw request and the client's single attempt
