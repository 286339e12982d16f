"""The client's check of the reward server's ``GET /info`` answer: every field it reads (type, finiteness, range,
length) is checked at start, and an absurd one is refused in one line naming the server's URL, the field and its
value. The server is a real one on 127.0.0.1 in a thread of this process, answering the case's ``/info``."""

import math

import pytest
from reward_options_support import ServerThread, fast_remote

from sage_grpo.rewards.remote import RemoteReward, RemoteRewardError
from sage_grpo.rewards.remote_info import MAX_METRICS
from sage_grpo.rewards.serving import RewardService
from sage_grpo.rewards.toys import ToySuiteReward

VALID = {"reward_model": "toy_suite", "metric_names": ["color", "brightness", "smoothness"], "video_fps": 24.0,
         "max_request_bytes": 1 << 30, "max_videos_per_request": 64}

# (field, value, what the message shows of the value)
ABSURD = [
    ("video_fps", math.nan, "nan"),
    ("video_fps", -24.0, "-24.0"),
    ("video_fps", 0, "0"),
    ("video_fps", math.inf, "inf"),
    ("video_fps", 1e300, "1e+300"),
    ("video_fps", 10 ** 400, "1000000000"),
    ("video_fps", "24", "'24'"),
    ("video_fps", True, "True"),
    ("video_fps", None, "None"),
    ("max_request_bytes", -1, "-1"),
    ("max_request_bytes", 0, "0"),
    ("max_request_bytes", math.nan, "nan"),
    ("max_request_bytes", -math.inf, "-inf"),
    ("max_request_bytes", 1.5e9, "1500000000.0"),
    ("max_request_bytes", 1 << 62, str(1 << 62)),
    ("max_request_bytes", "1GB", "'1GB'"),
    ("max_videos_per_request", -4, "-4"),
    ("max_videos_per_request", 0, "0"),
    ("max_videos_per_request", 10 ** 9, "1000000000"),
    ("max_videos_per_request", 64.0, "64.0"),
    ("max_videos_per_request", False, "False"),
    ("max_videos_per_request", [64], "[64]"),
    ("metric_names", ["m%d" % i for i in range(MAX_METRICS + 1)], "['m0', 'm1', 'm2', 'm3', ...]"),
    ("metric_names", "VQ", "'VQ'"),
    ("metric_names", {"VQ": 1}, "{'VQ': 1}"),
    ("metric_names", [1, 2], "1"),
    ("metric_names", ["VQ", "VQ"], "['VQ', 'VQ']"),
    ("metric_names", [""], "''"),
    ("metric_names", ["x" * 5000], "... (5000 chars)"),
    ("reward_model", 5, "5"),
    ("reward_model", "t" * 100_000, "... (100000 chars)"),
    ("reward_model", ["toy_suite"], "['toy_suite']"),
]


@pytest.fixture(scope="module")
def server():
    server = ServerThread(RewardService(ToySuiteReward(), "toy_suite", video_fps=24.0))
    yield server
    server.stop()


def _start(server: ServerThread, info) -> RemoteReward:
    server.service.info = lambda: info  # the answer this test's server gives
    return RemoteReward("toy_suite", fast_remote(server.url, retries=0), video_fps=24.0)


@pytest.mark.parametrize("field, value, shown", ABSURD, ids=[f"{f}={str(v)[:20]}" for f, v, _ in ABSURD])
def test_an_absurd_info_field_is_refused_in_one_line(server, field, value, shown):
    with pytest.raises(RemoteRewardError) as err:  # the trainer prints a RemoteRewardError as one line and stops
        _start(server, {**VALID, field: value})
    message = str(err.value)
    assert isinstance(err.value, ValueError)
    assert message.startswith(f"the reward server at {server.url} answered GET /info, but its {field}")
    assert shown in message and "\n" not in message and len(message) < 500, message


@pytest.mark.parametrize("info, said", [([1, 2], "it is [1, 2], expected a JSON object"),
                                        ({k: v for k, v in VALID.items() if k != "video_fps"}, "it has no video_fps")])
def test_an_answer_that_is_not_a_reward_servers_is_refused_in_one_line(server, info, said):
    with pytest.raises(RemoteRewardError) as err:
        _start(server, info)
    assert str(err.value).startswith(f"the reward server at {server.url} answered GET /info, but {said}")


def test_a_sound_answer_is_taken_as_it_is(server):
    client = _start(server, {**VALID, "max_request_bytes": 1 << 20, "max_videos_per_request": 1, "video_fps": 24})
    assert client.metric_names == ("color", "brightness", "smoothness") and client.video_fps == 24.0
    assert (client.max_request_bytes, client.max_videos) == (1 << 20, 1)
    assert _start(server, {**VALID, "metric_names": None}).metric_names is None
    assert _start(server, {**VALID, "metric_names": []}).metric_names is None  # declares nothing, as null does
    with pytest.raises(RemoteRewardError, match="serves 'brightness', not --reward_model 'toy_suite'"):
        _start(server, {**VALID, "reward_model": "brightness"})  # a sound answer from another server: refused
