"""The reward server: strangers that never authenticate cannot take a trainer's place, a request costs about
its body in memory (not 14x), a server open to other machines without a token says so, and credentials never reach
a printed line. Every server is a real one on 127.0.0.1 in a thread (of this process, or of the memory
benchmark's fresh process)."""

import re
import selectors
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from bench_support import NUMBER, SCRIPTS, value_of
from procs import eventually, run_group, scaled
from reward_options_support import ServerThread

from sage_grpo.config import parse_cli
from sage_grpo.config.train import TrainConfig
from sage_grpo.config.validation import ConfigError
from sage_grpo.rewards.remote import RemoteSettings, redact_secrets
from sage_grpo.rewards.serving import RewardService, ServerLimits, exposure_warning
from sage_grpo.rewards.setup import check_reward_config
from sage_grpo.rewards.toys import ToySuiteReward

TOKEN = "0123456789abcdef-shared-secret"


@pytest.fixture
def serve():
    servers = []

    def start(reward=None, **service_options) -> ServerThread:
        servers.append(ServerThread(RewardService(reward or ToySuiteReward(), "toy_suite", video_fps=24.0,
                                                  **service_options)))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def _get_info(url: str, token: str) -> int:
    request = urllib.request.Request(url + "/info", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=scaled(5.0)) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def _watch_closes(strangers: list, limit: float) -> tuple:
    """Start a thread that records, for each ``(socket, opened)``, the seconds from ``opened`` until the server closed
    it (EOF or reset; inf when not within ``limit``): the time is taken when it happens, not when the test gets to
    look (the test's own requests come first)."""
    seconds = [float("inf")] * len(strangers)

    def watch():
        with selectors.DefaultSelector() as selector:
            for index, (sock, _) in enumerate(strangers):
                selector.register(sock, selectors.EVENT_READ, index)
            deadline = time.monotonic() + limit
            while selector.get_map() and time.monotonic() < deadline:
                for key, _ in selector.select(timeout=0.05):
                    sock, opened = strangers[key.data]
                    try:
                        closed = not sock.recv(4096)
                    except ConnectionResetError:
                        closed = True
                    if closed:
                        seconds[key.data] = time.monotonic() - opened
                        selector.unregister(sock)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, seconds


def test_trickling_strangers_neither_take_a_trainers_slot_nor_stay_past_a_second(serve):
    """Six connections that trickle a request head without a token, against a server of 2 serving slots: every
    authenticated request of the trainer is served (before: the strangers held both slots and it got 503), and each
    stranger is closed about 1 s (``header_timeout_s``) after it connected (before: 30 s idle, 300 s deadline)."""
    import socket

    server = serve(limits=ServerLimits(max_connections=2), auth_token=TOKEN)
    strangers = []
    for _ in range(6):  # the clock starts before the connect: the server's header clock starts after it
        opened = time.monotonic()
        strangers.append((socket.create_connection(server.address, timeout=scaled(5.0)), opened))
    watcher, open_for = _watch_closes(strangers, scaled(5.0))
    stop = threading.Event()

    def trickle():  # one byte of a header line every 0.1 s: never silent for long, never done
        for sock, _ in strangers:
            sock.sendall(b"GET /info HTTP/1.1\r\nX-Slow: ")
        while not stop.wait(0.1):
            for sock, _ in strangers:
                try:
                    sock.sendall(b"a")
                except OSError:
                    pass

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        time.sleep(0.3)  # the strangers' threads are reading their heads
        statuses = []
        for _ in range(10):  # a served request's handler gives its slot back just after the client has the answer
            assert eventually(lambda: server.server._slots._value == 2)
            statuses.append(_get_info(server.url, TOKEN))
        watcher.join(timeout=scaled(10.0))
    finally:
        stop.set()
        thread.join(timeout=5)
        for sock, _ in strangers:
            sock.close()
    assert statuses == [200] * 10
    assert all(0.95 < seconds < scaled(2.0) for seconds in open_for), open_for


MEMORY_BENCHMARK = SCRIPTS / "benchmark_reward_server_memory.py"  # run in a fresh process per case
BENCHMARKS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"  # its table of what it measured


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak resident memory is read from /proc")
@pytest.mark.parametrize("case, below", [("float_chunked", 2.25), ("uint8", 1.25), ("videoalign", 2.0)])
def test_a_request_costs_its_body_and_what_the_reward_asks_for(case, below):
    """A 64 MiB request of 4 videos. The body is held once and the frames are a view of it; beyond it the server's
    peak rises only by what the reward asks for: a reward that takes float frames, scored one video at a time, one
    video in float32 (4 bytes a value: the body's size again), 2.0x (before: the body read by growing, copied out of
    the header, laid out again and converted with a second float temporary, 5x; 14x with the whole request as one
    chunk); a reward declaring ``accepts_uint8`` (VideoAlign does), scored as one chunk as a trainer's requests are,
    reads the body's frames: 1.0x, VideoAlign 1.56x with one video's sampled frames in float (before: the request in
    float32 besides the body, 5.0x; VideoAlign 5.5x). Measured as the benchmark does, in a fresh process whose
    allocator gives freed buffers back, so nothing that ran before in this process and nothing glibc cached counts;
    the figure docs/benchmarks.md gives is the one measured."""
    done = run_group([sys.executable, str(MEMORY_BENCHMARK), "--case", case], timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "could not be fixed" not in done.stdout, done.stdout
    ratios = (value_of(rf"^{case}: .* peak resident \+[0-9.]+ MiB \({NUMBER}x\)", done.stdout),
              value_of(rf"^{case}: .* tracemalloc peak [0-9.]+ MiB \({NUMBER}x\)", done.stdout))
    assert all(1.0 <= ratio < 4 for ratio in ratios) and ratios[0] < below, ratios
    row = re.search(rf"^\| `{case}`: .*$", BENCHMARKS_PAGE.read_text(), flags=re.MULTILINE).group(0).split("|")
    assert abs(float(re.search(r"\(\**([0-9.]+)×", row[3]).group(1)) - ratios[0]) <= 0.05, (row[3], ratios)  # docs
    if case != "videoalign":  # the reward read the body's frames, as floats or as they arrived: video i is 30 * i
        levels = re.search(r"^  level: (.*)$", done.stdout, flags=re.MULTILINE).group(1).split()
        assert [float(v) for v in levels] == pytest.approx([30 * i / 255 for i in range(4)], abs=1e-4)


def test_a_server_open_to_other_machines_without_a_token_warns(monkeypatch, capsys):
    open_service = RewardService(ToySuiteReward(), "toy_suite", video_fps=24.0)
    for host in ("127.0.0.1", "127.0.0.2", "::1"):
        assert exposure_warning(host, open_service) is None
    assert exposure_warning("0.0.0.0", RewardService(ToySuiteReward(), "toy_suite", video_fps=24.0,
                                                     auth_token=TOKEN)) is None
    warning = exposure_warning("0.0.0.0", open_service)
    assert warning.startswith("warning: the reward server listens on 0.0.0.0, reachable from other machines, "
                              "without --auth_token_file") and "--host 127.0.0.1" in warning

    from sage_grpo.cli import serve_reward
    from sage_grpo.rewards.serving import RewardHTTPServer

    def interrupted(self, *args):
        raise KeyboardInterrupt

    monkeypatch.setattr(RewardHTTPServer, "serve_forever", interrupted)
    assert serve_reward.main(["--reward_model", "toy_suite", "--host", "0.0.0.0", "--port", "0"]) == 0
    assert capsys.readouterr().err.strip() == warning
    assert serve_reward.main(["--reward_model", "toy_suite", "--host", "127.0.0.1", "--port", "0"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("url, shown", [
    ("http://trainer:hunter2@127.0.0.1:8765", "http://***@127.0.0.1:8765"),
    ("https://hunter2@reward.example:443/v1", "https://***@reward.example:443/v1"),
    ("http://127.0.0.1:8765/?token=hunter2", "http://127.0.0.1:8765/?***"),
    ("ftp://trainer:hunter2@127.0.0.1/x?key=hunter2", "ftp://***@127.0.0.1/x?***"),
])
def test_credentials_in_the_remote_reward_url_are_refused_and_never_shown(url, shown):
    """Refused at start (the client would not send them, and the URL is printed in the run summary and recorded in
    run_config.yaml and every checkpoint), in one line that shows the URL masked."""
    with pytest.raises(ValueError) as err:
        RemoteSettings(url)
    assert f"remote_reward_url {shown!r}" in str(err.value) and "hunter2" not in str(err.value)
    cfg = parse_cli(TrainConfig, ["--remote_reward_url", url, "--pretrained_model_root", "/nonexistent"])
    with pytest.raises(ConfigError) as err:
        check_reward_config(cfg)  # the trainer's start, before any model loads or anything is written
    assert "hunter2" not in str(err.value) and "\n" not in str(err.value)
    assert redact_secrets(f"error: {url} failed") == f"error: {shown} failed"


def test_the_servers_log_lines_mask_query_strings(serve, capsys):
    server = serve()
    for path in ("/info?token=hunter2", "/score?key=hunter2&x=1"):
        request = urllib.request.Request(server.url + path, data=b"" if "score" in path else None)
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(request, timeout=scaled(5.0))
    logged = capsys.readouterr().err
    assert '"GET /info?*** HTTP/1.1" 404' in logged and '"POST /score?*** HTTP/1.1" 404' in logged
    assert "hunter2" not in logged


GARBLED_ANSWERS = {
    "not JSON": b"<html>502 Bad Gateway</html>",
    "a list": b"[1, 2]",
    "nested past the recursion limit": b"[" * 200_000 + b"]" * 200_000,
    "scores not an object": b'{"scores": [1]}',
    "a metric not a list": b'{"scores": {"a": 3}}',
    "a score a string": b'{"scores": {"a": ["0.5"]}}',
    "a score a list": b'{"scores": {"a": [[0.5]]}}',
    "a score past float's range": b'{"scores": {"a": [1' + b"0" * 400 + b"]}}",
    "too few scores": b'{"scores": {"a": []}}',
    "another metric": b'{"scores": {"b": [0.5]}}',
}


@pytest.mark.parametrize("payload", GARBLED_ANSWERS.values(), ids=GARBLED_ANSWERS.keys())
def test_a_garbled_score_answer_is_one_remote_reward_error(payload):
    from sage_grpo.rewards.remote import RemoteRewardError, decode_scores

    with pytest.raises(RemoteRewardError, match="^the reward server (answered|returned) ") as info:
        decode_scores(payload, ("a",), 1)
    assert "\n" not in str(info.value) and len(str(info.value)) < 400
    assert decode_scores(b'{"scores": {"a": [0.5, null, 2]}}', ("a",), 3)["a"].tolist()[::2] == [0.5, 2.0]
