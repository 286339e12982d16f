"""scripts/gpu_session.py, the GPU runbook's one-call runner, with stand-in commands: time kept for the
higher-priority parts, a command past its limit interrupted then killed, a failed gate stopping the session, the
step's checkpoint reused or refused, and every benchmark command's flags parsed by its script on both devices (the
GPU's cannot run here). The whole CPU mode runs in tests/e2e/test_gpu_session_runs.py."""
import os
import re
import sys
import time
from pathlib import Path

import pytest

from bench_support import benchmark_module
from gpu_session_support import REPO_ROOT, load_runner, summary
from procs import run_group, running

runner = load_runner()
PY = sys.executable


def _command(label, code, cap=30.0, gate=False):
    return runner.Command(label, (PY, "-c", code), cap, gate=gate)


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_every_benchmark_command_parses_with_its_script(device):
    parts = runner.build_parts(device, PY, Path("/ckpt"), ["tests"])
    assert list(runner.RUN_ORDER) == ["check", "mfu", "step", "attention", "rollout"]
    assert sorted((p.priority, name) for name, p in parts.items())[:2] == [(1, "check"), (2, "step")]
    scripts = {}
    for part in parts.values():
        for command in part.commands:
            if command.argv[1].startswith("benchmarks/"):
                scripts[part.name] = command.argv[2:]
                module = benchmark_module(Path(command.argv[1]).stem)
                if part.name == "step":
                    _, unknown = module.parse_args(list(command.argv[2:]))
                    assert unknown == []  # no flag left over for the trainer
                else:
                    module.parse_args(list(command.argv[2:]))
    assert sorted(scripts) == ["attention", "mfu", "rollout", "step"]
    assert scripts["step"][-2:] == ("--checkpoint_root", "/ckpt")
    writer = parts["step"].background.argv
    if device == "cuda":
        assert scripts["mfu"][:4] == ("--geometry", "real", "--blocks", "4")
        assert writer[2:] == ("--output", "/ckpt", "--real_width_blocks", "8", "--vae", "real")
    gate, tier = parts["check"].commands
    assert gate.gate and gate.argv[1:] == ("scripts/gpu_check.py", "--device", device)
    assert tier.argv[1:] == ("-m", "pytest", "tests", "--device", device, "-m", "device", "-x", "-q", "-rfE", "-p",
                             "no:cacheprovider")


def test_lower_priority_parts_leave_time_for_the_step():
    parts = [p for _, p in sorted(runner.build_parts("cuda", PY, Path("/c"), ["tests"]).items(),
                                  key=lambda item: runner.RUN_ORDER.index(item[0]))]
    # mfu runs before the step (the checkpoint is being written) but ranks below it: the step's cap is kept
    assert [runner.reserved(parts, i) for i in range(len(parts))] == [0, 240, 0, 0, 0]
    capped = list(runner.with_caps(dict(zip(runner.RUN_ORDER, parts)), {"step": 400, "checkpoint": 60}).values())
    assert runner.reserved(capped, 1) == 400 and capped[2].background.cap == 60
    session = runner.Session(Path("."), deadline_s=300, env={})
    assert session.limit(90, reserve=240) == pytest.approx(300 - 240 - runner.GRACE_S, abs=1)
    assert session.limit(90) == 90


def test_a_command_past_its_limit_is_interrupted_then_killed(tmp_path, monkeypatch):
    """A command that ignores SIGINT and has a child: SIGINT at the limit, SIGKILL of the whole group after the grace;
    recorded as a timeout, and the next part still runs."""
    monkeypatch.setattr(runner, "GRACE_S", 1)
    monkeypatch.setattr(runner, "MIN_LIMIT_S", 1)
    pids, script = tmp_path / "pids", tmp_path / "stubborn.py"
    script.write_text(f"""import signal, subprocess, time
signal.signal(signal.SIGINT, lambda *_: open({str(tmp_path / 'sigint')!r}, 'w').close())
child = subprocess.Popen(['sleep', '300'])
open({str(pids)!r}, 'w').write(f'{{child.pid}}')
time.sleep(300)
""")
    stubborn = runner.Command("stubborn", (PY, str(script)), 4)
    parts = [runner.Part("mfu", 3, "mfu.log", (stubborn,)), runner.Part("rollout", 5, "rollout.log",
                                                                         (_command("next", "print('ran')"),))]
    session = runner.Session(tmp_path, deadline_s=60, env=dict(os.environ))
    start = time.monotonic()
    runner.run_session(session, parts, runner.Checkpoint(tmp_path / "ckpt", ours=True))
    assert time.monotonic() - start < 4 + 1 + 5  # the cap, the grace, the second command
    assert summary(tmp_path) == [("mfu", "stubborn", "timeout"), ("rollout", "next", "0")]
    assert (tmp_path / "sigint").exists()  # SIGINT came first
    assert not running(int(pids.read_text()))  # the child went with the group
    assert "=== mfu/stubborn: TIMED OUT after " in (tmp_path / "mfu.log").read_text()
    assert session.failed == 1 and session.running == []


def test_a_failed_gate_or_the_deadline_skips_what_follows(tmp_path):
    check = runner.Part("check", 1, "check.log", (_command("gpu_check", "raise SystemExit(3)", gate=True),
                                                  _command("device_tier", "pass")))
    later = runner.Part("rollout", 5, "rollout.log", (_command("rollout", "pass"),))
    session = runner.Session(tmp_path / "a", deadline_s=60, env=dict(os.environ))
    session.out.mkdir()
    runner.run_session(session, [check, later], runner.Checkpoint(tmp_path / "ckpt", ours=True))
    assert summary(session.out) == [("check", "gpu_check", "3"), ("check", "device_tier", "skipped"),
                                    ("rollout", "rollout", "skipped")]
    assert ("=== rollout/rollout: SKIPPED (check/gpu_check failed: the CUDA path does not work; give the machine "
            "back)") in (session.out / "rollout.log").read_text()
    # 60 s left: a priority-5 part before a priority-1 part capped at 100 s gets nothing; the latter runs
    first = runner.Part("attention", 4, "attention.log", (_command("attention", "pass", cap=5),))
    session = runner.Session(tmp_path / "b", deadline_s=60, env=dict(os.environ))
    session.out.mkdir()
    runner.run_session(session, [first, runner.Part("step", 1, "step.log", (_command("step", "pass", cap=100),))],
                       runner.Checkpoint(tmp_path / "ckpt", ours=True))
    assert summary(session.out) == [("attention", "attention", "skipped"), ("step", "step", "0")]
    assert "s of it kept for higher-priority parts" in (session.out / "attention.log").read_text()


def test_the_step_checkpoint_is_reused_or_refused(tmp_path, monkeypatch, capsys):
    writer = runner.build_parts("cuda", PY, tmp_path / "ckpt", ["tests"])["step"]
    checkpoint = runner.Checkpoint(tmp_path / "ckpt", ours=False)
    (tmp_path / "ckpt").mkdir()
    assert "exists and was not written by this runner's writer" in checkpoint.check_path(writer.background)
    (tmp_path / "ckpt" / runner.MARKER).write_text(" ".join(writer.background.argv[1:]))
    assert checkpoint.check_path(writer.background) is None
    session = runner.Session(tmp_path, deadline_s=60, env={})
    checkpoint.start(session, writer)
    assert checkpoint.proc is None and checkpoint.wait(session, writer) == "0"  # nothing ran
    assert f"=== step/checkpoint: reusing {tmp_path / 'ckpt'}" in (tmp_path / "step.log").read_text()
    # a folder of the user's that the writer did not finish: refused before anything runs, never removed
    (tmp_path / "ckpt" / runner.MARKER).unlink()
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    assert runner.main(["--checkpoint", str(tmp_path / "ckpt")]) == 2
    assert "exists and was not written by this runner's writer" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and (tmp_path / "ckpt").is_dir()


def test_without_wheels_the_gpu_call_stops_before_any_part(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runner, "WHEELS", tmp_path / "no_wheels")
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    (tmp_path / "out").mkdir()
    for name, text in (("summary.tsv", "check\tgpu_check\t0\n"), ("notes.txt", "mine")):  # an earlier run's, a user's
        (tmp_path / "out" / name).write_text(text)
    assert runner.main(["--checkpoint", str(tmp_path / "ckpt")]) == 1
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"
    env = (tmp_path / "out" / "env.txt").read_text()
    assert "error: no wheels in .whl/: run 'bash scripts/gpu_wheels.sh'" in env
    assert "cut: torch.compile of the blocks (inductor): " in env  # what the one call leaves out is named
    assert not (tmp_path / "out" / "summary.tsv").exists() and not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize("argv, message", [(["bogus"], "unknown part 'bogus': choose from check, mfu, step"),
                                           (["--cap", "step=soon"], "--cap step=soon: give LABEL=SECONDS")])
def test_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        runner.parse_args(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_the_runbook_names_the_command_and_everything_cut():
    runbook = (REPO_ROOT / "docs" / "gpu_runbook.md").read_text().replace("`", "")
    assert "```bash\npython3 scripts/gpu_session.py " in (REPO_ROOT / "docs" / "gpu_runbook.md").read_text()
    assert f"global deadline of {runner.DEFAULT_DEADLINE_S} s" in runbook
    for what, _ in runner.CUT:
        assert f"| {what} |" in runbook, what
    benchmarks = (REPO_ROOT / "docs" / "benchmarks.md").read_text()
    assert "## GPU numbers (measured)\n\n**Not yet measured.**" in benchmarks


def test_the_runbook_speaks_of_the_project_only():
    """Whoever has a GPU runs one command: the page says nothing about how a GPU is obtained (the words below are its
    own list of what it must not say), nor names files outside the repository."""
    text = (REPO_ROOT / "docs" / "gpu_runbook.md").read_text().replace("gpu_session", "runner")
    found = re.findall(r"\b(le[a]se|le[n]t|le[n]d\w*|sessions?|give[_]back|budget[_]left_s|device[ ]tool|not[_]drawn|"
                       r"issue \d+)\b|/work/", text, flags=re.IGNORECASE)
    assert found == []


@pytest.mark.skipif(not (REPO_ROOT / ".git").exists(), reason="not a git checkout (the device machine's copy)")
def test_carried_wheels_and_runner_output_stay_out_of_git():
    proc = run_group(["git", "check-ignore", ".whl/diffusers-0.42.1-py3-none-any.whl", "gpu_out/check.log"],
                     cwd=REPO_ROOT, timeout=30)
    assert proc.returncode == 0 and len(proc.stdout.split()) == 2, proc.stdout + proc.stderr
