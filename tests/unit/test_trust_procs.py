"""In-process: a reward server fit for a shared cluster, workers that cannot outlive their
agent, ``--resume_from_checkpoint auto``, rank-aimed faults and the collective timeout (the torchrun cases are in
tests/distributed/test_restart.py, the pdsh launcher's in tests/unit/test_distributed.py).

Every server here is a real one on 127.0.0.1 in a thread of this process; every wait is bounded in count and time.
"""

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
from procs import eventually, run_group, running, scaled
from reward_options_support import ServerThread

from sage_grpo.rewards.remote import TOKEN_ENV, RemoteReward, RemoteRewardError, RemoteSettings, encode_request
from sage_grpo.rewards.serving import RequestError, RewardService, ServerLimits, check_json_depth, make_server
from sage_grpo.rewards.toys import ToySuiteReward

REPO_ROOT = Path(__file__).resolve().parents[2]
TOKEN = "0123456789abcdef-shared-secret"


@pytest.fixture
def serve():
    servers = []

    def start(limits: ServerLimits = ServerLimits(), auth_token=None) -> ServerThread:
        servers.append(ServerThread(RewardService(ToySuiteReward(), "toy_suite", video_fps=24.0, limits=limits,
                                                  auth_token=auth_token)))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def _seconds_until_closed(sock: socket.socket, limit: float, since: float | None = None) -> float:
    """Wait (at most ``limit`` s) for the server to close ``sock``; the seconds since ``since`` (default: now)."""
    start = time.monotonic() if since is None else since
    sock.settimeout(limit)
    while sock.recv(4096):  # a 503 or an answer first, then EOF; a recv past the limit raises TimeoutError
        pass
    return time.monotonic() - start


def _connect(server: ServerThread) -> socket.socket:
    return socket.create_connection(server.address, timeout=scaled(5.0))


def _get(url: str, headers=None) -> tuple[int, dict]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=scaled(5.0)) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _fast(url: str, **changes) -> RemoteSettings:
    return RemoteSettings(url, **{"retries": 0, "timeout_s": scaled(5.0), "backoff_s": 0.01, **changes})


# ---------------------------------------------------------------- item 5: the reward server


def test_a_silent_connection_is_dropped_after_the_idle_timeout(serve):
    server = serve(limits=ServerLimits(idle_timeout_s=0.5))
    opened = time.monotonic()  # before the connect: the server's idle clock starts after it, whatever the load
    silent, headers_only = _connect(server), _connect(server)
    headers_only.sendall(b"POST /score HTTP/1.1\r\nContent-Length: 100\r\n\r\nabc")  # then the body stalls
    assert 0.45 < _seconds_until_closed(silent, scaled(5.0), since=opened) < scaled(3.0)
    assert _seconds_until_closed(headers_only, scaled(5.0)) < scaled(3.0)
    assert eventually(lambda: server.service.buffered_bytes == 0)  # the stalled body's reservation was returned
    assert _get(server.url + "/info")[0] == 200  # the server still serves


def test_a_trickling_body_is_dropped_at_the_request_deadline(serve):
    server = serve(limits=ServerLimits(idle_timeout_s=1.2, request_timeout_s=1.5))
    start = time.monotonic()  # before the connect: the server's deadline starts after it, whatever the load
    sock = _connect(server)
    sock.sendall(b"POST /score HTTP/1.1\r\nContent-Length: 1000\r\n\r\n")  # the head in time, then the body
    with pytest.raises(OSError):  # the server shuts the connection down mid-trickle: a send fails (EPIPE, reset)
        for _ in range(int(scaled(100))):  # one byte per 0.1 s: never idle for 1.2 s, never done
            sock.sendall(b"G")
            time.sleep(0.1)
            sock.settimeout(0.01)
            try:
                if sock.recv(1) == b"":
                    raise ConnectionResetError("closed by the server")
            except TimeoutError:
                pass
    assert 1.45 < time.monotonic() - start < scaled(5.0)


def test_the_connection_caps_refuse_the_next_request_and_connection(serve):
    server = serve(limits=ServerLimits(max_connections=3, max_pending_connections=1, header_timeout_s=30.0,
                                       idle_timeout_s=30.0))
    held = [_connect(server) for _ in range(3)]
    for sock in held:  # each is being served: its head arrived, its body is awaited
        sock.sendall(b"POST /score HTTP/1.1\r\nContent-Length: 100\r\n\r\n")
    assert eventually(lambda: server.server._slots._value == 0)  # the 3 handler threads have taken their slots
    status, answer = _get(server.url + "/info")
    assert status == 503 and answer["error"] == ("the reward server is serving --max_connections 3 requests; "
                                                 "retry later")
    # The /info connection's thread gives its place back only after the client has its answer: wait for it, or the
    # next connection can be refused in its stead and the one after it admitted (the race a CI run once hit).
    assert eventually(lambda: server.server._open._value == 1)
    silent = _connect(server)  # the one connection allowed besides the served ones
    assert eventually(lambda: server.server._open._value == 0)  # accepted: it holds the last place
    extra = _connect(server)
    extra.settimeout(scaled(5.0))
    answer = extra.recv(4096)
    assert answer.startswith(b"HTTP/1.0 503") and b"as many connections open as it allows" in answer
    assert _seconds_until_closed(extra, scaled(5.0)) < scaled(2.0)
    for sock in held + [silent]:
        sock.close()
    assert eventually(lambda: server.server._slots._value == 3)  # slots come back once the handlers end
    assert eventually(lambda: server.server._open._value == 4)  # and the connections' places, just after
    assert _get(server.url + "/info")[0] == 200


def test_buffered_bytes_are_capped_over_all_connections(serve):
    body = encode_request(torch.rand(1, 3, 2, 8, 8), ["a"], 24.0)
    server = serve(limits=ServerLimits(max_request_bytes=len(body), max_buffered_bytes=len(body) + 10))
    first = _connect(server)  # a request whose body is held half-sent: its bytes stay reserved
    first.sendall(b"POST /score HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:10])
    assert eventually(lambda: server.service.buffered_bytes == len(body))
    request = urllib.request.Request(server.url + "/score", data=body, method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=scaled(5.0))
    assert err.value.code == 503 and "retry later" in json.loads(err.value.read())["error"]
    first.sendall(body[10:])  # the first request completes, its bytes are released, the next one fits
    assert b"200 OK" in first.recv(4096)
    assert eventually(lambda: server.service.buffered_bytes == 0)  # released just after the answer is written
    with urllib.request.urlopen(request, timeout=scaled(5.0)) as response:
        assert set(json.loads(response.read())["scores"]) == {"color", "brightness", "smoothness"}


def test_a_missing_or_wrong_token_gets_401_and_the_client_sends_it_from_the_environment(serve, monkeypatch):
    server = serve(auth_token=TOKEN)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN},
                    {"Authorization": f"Bearer {TOKEN}x"}):
        status, answer = _get(server.url + "/info", headers)
        assert status == 401 and "--auth_token_file" in answer["error"], headers
    unread = urllib.request.Request(server.url + "/score", data=b"x" * 1000, method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:  # refused before its body is read
        urllib.request.urlopen(unread, timeout=scaled(5.0))
    assert err.value.code == 401 and server.service.buffered_bytes == 0
    assert _get(server.url + "/info", {"Authorization": f"Bearer {TOKEN}"})[0] == 200

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(RemoteRewardError, match=f"requires a token; set {TOKEN_ENV}"):
        RemoteReward("toy_suite", _fast(server.url), video_fps=24.0)
    monkeypatch.setenv(TOKEN_ENV, "not-the-token-at-all")
    with pytest.raises(RemoteRewardError, match=f"refused the token in {TOKEN_ENV}"):
        RemoteReward("toy_suite", _fast(server.url), video_fps=24.0)
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    videos = torch.rand(2, 3, 2, 8, 8)
    scores = RemoteReward("toy_suite", _fast(server.url), video_fps=24.0)(videos, ["a", "b"])
    assert torch.isfinite(scores["color"]).all() and scores["color"].shape == (2,)


def test_the_token_file_is_checked(tmp_path):
    from sage_grpo.rewards.serving import read_auth_token

    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    assert read_auth_token(str(path)) == TOKEN
    for bad in ("short", "two words in a long token", ""):
        path.write_text(bad)
        with pytest.raises(ValueError, match="at least 16"):
            read_auth_token(str(path))
    with pytest.raises(ValueError, match="cannot read it"):
        read_auth_token(str(tmp_path / "missing"))


def test_deeply_nested_json_is_a_400_not_a_500(serve):
    check_json_depth('{"prompts": ["[[[[[[{{{{{{"], "shape": [1, 2]}')  # brackets inside strings do not count
    check_json_depth('{"a": "\\"[[[[[[[", "b": [[]]}')  # nor after an escaped quote
    with pytest.raises(RequestError, match="nests deeper than 4"):
        check_json_depth('{"a": [[[[1]]]]}')
    server = serve()
    header = b"[" * 200_000
    body = len(header).to_bytes(4, "big") + header
    start = time.process_time()
    request = urllib.request.Request(server.url + "/score", data=body, method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=scaled(5.0))
    assert err.value.code == 400 and "nests deeper" in json.loads(err.value.read())["error"]
    unterminated = b'["' + b'\\"' * 300_000  # a string that never ends: still one linear pass
    body = len(unterminated).to_bytes(4, "big") + unterminated
    request = urllib.request.Request(server.url + "/score", data=body, method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=scaled(5.0))
    assert err.value.code == 400
    assert time.process_time() - start < 2.0  # CPU seconds of this process (server thread included)


def test_the_client_start_against_a_silent_socket_fails_within_the_probe_timeout():
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        url = "http://127.0.0.1:%d" % silent.getsockname()[1]
        start = time.monotonic()
        with pytest.raises(RemoteRewardError) as err:
            RemoteReward("toy_suite", _fast(url, timeout_s=600.0, retries=3, probe_timeout_s=1.0), video_fps=24.0)
        elapsed = time.monotonic() - start
    message = str(err.value)
    assert 0.9 < elapsed < scaled(4.0), elapsed
    assert "\n" not in message and url in message and "within 1 s" in message and "--host" in message


def test_a_wrong_url_that_answers_is_named_in_one_line(serve):
    server = serve()
    with pytest.raises(RemoteRewardError, match=r"answered GET /info with HTTP 404"):
        RemoteReward("toy_suite", _fast(server.url + "/v1"), video_fps=24.0)


def test_the_reward_server_options_are_checked():
    from sage_grpo.config.reward_server import RewardServerConfig

    for bad in ({"max_connections": 0}, {"idle_timeout_s": float("nan")}, {"request_timeout_s": 0.0},
                {"max_buffered_mb": 10, "max_request_mb": 20}, {"video_fps": 0}, {"video_fps": 1001},
                {"max_videos_per_request": (1 << 16) + 1}, {"max_request_mb": (1 << 20) + 1}):
        with pytest.raises(ValueError, match=f"--{next(iter(bad))}"):
            RewardServerConfig(**bad)


def test_the_server_script_refuses_a_bad_token_file_before_loading(tmp_path):
    (tmp_path / "token").write_text("short")
    proc = run_group([sys.executable, str(REPO_ROOT / "scripts" / "reward_server.py"), "--reward_model",
                      "toy_suite", "--port", "0", "--auth_token_file", str(tmp_path / "token")],
                     timeout=60, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("error: --auth_token_file")


# ---------------------------------------------------------------- item 4: lost agent, hung peer, restarts

PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", '''
import sys, time
sys.path.insert(0, {repo!r})
from sage_grpo.distributed.liveness import install_parent_death_signal
assert install_parent_death_signal()
print("ready", flush=True)
time.sleep(60)
'''], stdout=subprocess.PIPE, text=True)
assert child.stdout.readline() == "ready\\n"
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux")
def test_a_worker_dies_with_its_parent():
    import signal

    from procs import kill_group, start_group

    parent = start_group([sys.executable, "-c", PARENT.format(repo=str(REPO_ROOT))], stdout=subprocess.PIPE,
                         text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    child = None
    try:
        timer = threading.Timer(scaled(60.0), kill_group, args=(parent,))  # a stuck start cannot hang the test
        timer.start()
        child = int(parent.stdout.readline())
        timer.cancel()
        os.kill(parent.pid, signal.SIGKILL)  # the parent only, as a kill -9 of the torchrun agent
        start = time.monotonic()
        assert eventually(lambda: not running(child), limit=5.0), "the worker outlived its parent"
        assert time.monotonic() - start < scaled(5.0)
    finally:
        kill_group(parent)
        if child is not None and running(child):
            os.kill(child, signal.SIGKILL)


def test_resume_auto_resumes_only_when_there_is_a_checkpoint(tmp_path):
    from sage_grpo.checkpoint import TRAINING_STATE_FILE, resolve_resume_path, resumes

    assert not resumes(None, tmp_path) and not resumes("auto", tmp_path / "missing") and not resumes("auto", tmp_path)
    (tmp_path / ".checkpoint-3.tmp").mkdir()  # an unfinished checkpoint is not one
    assert not resumes("auto", tmp_path) and resumes("latest", tmp_path)
    for step in (1, 2):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / TRAINING_STATE_FILE).write_bytes(b"")
    assert resumes("auto", tmp_path) and resolve_resume_path("auto", tmp_path) == tmp_path / "checkpoint-2"


def test_a_fault_names_its_rank_and_fires_on_the_first_attempt_only(monkeypatch):
    import signal

    from sage_grpo import faults

    killed = []
    monkeypatch.setattr(faults.os, "kill", lambda pid, sig: killed.append(sig))
    monkeypatch.setenv(faults.FAULT_ENV, "update:2@1")
    cases = [({"RANK": "1"}, [signal.SIGKILL]), ({"RANK": "0"}, []),
             ({"RANK": "1", "TORCHELASTIC_RESTART_COUNT": "0"}, [signal.SIGKILL]),
             ({"RANK": "1", "TORCHELASTIC_RESTART_COUNT": "1"}, [])]
    for env, expected in cases:
        monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        killed.clear()
        faults.fault_point("update", 2)
        faults.fault_point("update", 1)
        assert killed == expected, env
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT")
    monkeypatch.setenv(faults.FAULT_ENV, "rollout:3")  # no rank: every rank, as before
    killed.clear()
    faults.fault_point("rollout", 3)
    assert killed == [signal.SIGKILL]


def test_the_collective_timeout_is_bounded_and_checked():
    from sage_grpo.config.train import TrainConfig
    from sage_grpo.distributed.liveness import PeerWatch, collective_timeout

    assert TrainConfig.of().parallel.collective_timeout_minutes == 30.0  # the reference waits 120
    assert collective_timeout(0.5).total_seconds() == 30.0
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="--collective_timeout_minutes must be a positive number"):
            collective_timeout(bad)
    watch = PeerWatch(collective_timeout(1.0))  # one process: nothing to watch, errors pass through unchanged
    with pytest.raises(RuntimeError, match="Timed out"):
        with watch.guard():
            raise RuntimeError("Timed out waiting 1000ms for recv operation to complete")

