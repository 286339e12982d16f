"""Pure parts of the learning-per-rollout work: the passes' shuffles and metric merging (rl/inner_epochs.py) and
the background media writer (video_io.BackgroundWriter)."""

import threading
import time
from pathlib import Path

import pytest
import torch

from sage_grpo.rl.inner_epochs import derived_seed, merge_pass_metrics, pass_seed, run_inner_epochs, shuffled_pairs
from sage_grpo.video_io import BackgroundWriter


def test_pass_zero_keeps_the_single_pass_seed_and_later_passes_differ():
    assert pass_seed(42, 0, 5, 0) == derived_seed(42, 0, 5, 7)
    seeds = {pass_seed(42, 0, 5, k) for k in range(4)}
    assert len(seeds) == 4 and pass_seed(42, 0, 5, 2) == pass_seed(42, 0, 5, 2)


def test_shuffled_pairs_over_all_steps_are_the_reference_draws():
    shuffle, order = shuffled_pairs(123, 3, torch.arange(5), permute=True)
    generator = torch.Generator().manual_seed(123)
    assert torch.equal(shuffle, torch.randperm(3, generator=generator))
    assert torch.equal(order, torch.stack([torch.randperm(5, generator=generator) for _ in range(3)]))


def test_shuffled_pairs_stay_in_the_window():
    window = torch.arange(2, 5)
    _, order = shuffled_pairs(1, 4, window, permute=True)
    assert order.shape == (4, 3) and all(sorted(row) == [2, 3, 4] for row in order.tolist())
    _, fixed = shuffled_pairs(1, 2, window, permute=False)
    assert fixed.tolist() == [[2, 3, 4], [2, 3, 4]]


def test_one_pass_is_returned_as_it_is_and_several_are_merged():
    single = run_inner_epochs(1, lambda k: {"ratio_mean": 1.0})
    assert single == {"ratio_mean": 1.0}
    calls = []
    merged = run_inner_epochs(2, lambda k: calls.append(k) or {"ratio_mean": 1.0 + k, "KL_weight": 0.1 * (k + 1)})
    assert calls == [0, 1]
    assert merged["ratio_mean"] == 1.5 and merged["KL_weight"] == 0.2  # a mean; the controller's last value
    assert merged["inner_epoch_1/ratio_mean"] == 2.0 and merged["inner_epoch_0/KL_weight"] == 0.1
    assert merge_pass_metrics([{"a": 1.0}, {"a": 3.0, "b": 2.0}])["b"] == 2.0
    with pytest.raises(ValueError, match="num_epochs"):
        run_inner_epochs(0, lambda k: {})


def test_the_writer_runs_jobs_in_order_off_the_calling_thread():
    writer = BackgroundWriter(max_pending=1)
    threads = []

    def job(value):
        time.sleep(0.01)
        threads.append(threading.current_thread().name)
        return value

    for value in range(4):
        writer.submit(lambda v=value: job(v))
    assert writer.flush() == [0, 1, 2, 3]
    assert set(threads) == {"media-writer"} and writer.seconds > 0.03
    assert writer.close() == []
    with pytest.raises(RuntimeError, match="closed"):
        writer.submit(lambda: None)


def test_a_failed_write_surfaces_on_the_training_thread():
    writer, submitted = BackgroundWriter(), threading.Event()

    def failing():
        submitted.wait(5)  # fails only once both jobs are queued (else the second submit would raise)
        raise OSError("disk full")

    writer.submit(failing)
    writer.submit(lambda: "later")  # the worker keeps going
    submitted.set()
    with pytest.raises(RuntimeError, match="disk full"):
        writer.flush()
    assert writer.close() == ["later"]


def test_a_cpu_run_gets_one_thread_unless_told(monkeypatch):
    from sage_grpo.config import parse_cli
    from sage_grpo.config.train import TrainConfig
    from sage_grpo.startup.threads import apply_cpu_thread_policy

    def apply(flags):
        return apply_cpu_thread_policy(parse_cli(TrainConfig, flags).parallel, torch.device("cpu"))

    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        assert "CPU threads: 1," in apply(["--device", "cpu"])
        assert torch.get_num_threads() == 1
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        assert "2, from OMP_NUM_THREADS" in apply(["--device", "cpu"])
        line = apply(["--device", "cpu", "--cpu_threads", "3"])
        assert "3, from --cpu_threads" in line and torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_ffmpeg_starts_without_python_in_the_forked_child():
    """The background writer starts ffmpeg from a thread while other threads run: imageio-ffmpeg's default
    ``preexec_fn`` (Python run between fork and exec) can then deadlock the child, and the writer with it (a dp 2 test
    run hung so). Importing video_io turns it off with imageio-ffmpeg's own switch; a user's explicit setting wins."""
    import subprocess
    import sys

    from imageio_ffmpeg._utils import _popen_kwargs

    import sage_grpo.video_io  # noqa: F401 (sets the switch on import)

    assert _popen_kwargs(prevent_sigint=True)["preexec_fn"] is None
    code = ("import os; os.environ['IMAGEIO_FFMPEG_NO_PREVENT_SIGINT'] = '0'; import sage_grpo.video_io; "
            "from imageio_ffmpeg._utils import _popen_kwargs; print(_popen_kwargs(prevent_sigint=True)['preexec_fn'])")
    root = Path(__file__).resolve().parents[2]
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root,
                          timeout=60).stdout.strip() != "None"
