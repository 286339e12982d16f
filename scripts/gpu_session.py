"""The GPU proof in one command (docs/gpu_runbook.md says how to run it and read what comes back).

    python3 scripts/gpu_session.py                          # on the GPU machine: every part, 480 s deadline
    python3 scripts/gpu_session.py step --cap step=400      # a rerun of one part (the checkpoint is reused there)
    .venv/bin/python scripts/gpu_session.py --cpu           # the same commands at the tiny geometry on the CPU

The parts, in priority order (what the deadline leaves out is cut from the end of this list):

1. ``check``: ``scripts/gpu_check.py`` (versions, device, every ``sage_grpo`` module imports, one tiny bf16 forward +
   backward), then the device test tier (``pytest -m device --device cuda -x``: it stops at the first failure).
   When gpu_check fails the CUDA path does not work: nothing else runs (stop the GPU work there).
2. ``step``: one GRPO step at the real width (8 of the 54 blocks, 81x352x624, the released VAE; a warm-up step
   first) with the seconds and the peak GPU memory of each phase next to the memory planner's figure for the same
   launch (``benchmarks/benchmark_step.py``). Its checkpoint (``make_tiny_checkpoint.py --real_width_blocks 8``, CPU
   work) is written in the background from the end of gpu_check on, while the device tier and ``mfu`` use the GPU.
3. ``mfu``: the transformer's forward + backward at the real width (4 blocks, 18,018 video tokens, bf16, CFG),
   checkpointing off and on: TFLOP/s, MFU against the device's bf16 peak, each block's saved bytes against the
   planner (``benchmarks/benchmark_transformer.py``).
4. ``attention``: every usable attention backend against diffusers' dense-mask processor, the CFG pair with its key
   mask and without one (``benchmarks/benchmark_attention.py --key_mask both``); the unusable backends with why.
5. ``rollout``: our rollout against diffusers' ``HunyuanVideo15Pipeline`` at the real width (8 blocks, 8 ODE steps;
   ``benchmarks/benchmark_rollout.py``).

They run in the order check, mfu, step, attention, rollout (the checkpoint is being written meanwhile).

Time: a global deadline (``--deadline``, default 480 s from the start: 8 minutes, under a scheduler's 10-minute limit
per command, so that a rerun of one part still fits in a 15-minute slot on the GPU machine) and a cap per command
(``--cap LABEL=SECONDS``). A command is given min(its cap, what is left of the deadline less :data:`GRACE_S` and less
the caps of the higher-priority parts still to run); under :data:`MIN_LIMIT_S` it is skipped. At its limit its process
group gets SIGINT (pytest and the scripts unwind), then SIGKILL :data:`GRACE_S` s later; it is recorded as ``timeout``
and the next command runs.

Results: at most 7 files under ``$OUT`` (default ``./gpu_out``): ``env.txt`` (the runner's settings, what is cut, the
wheels' install, ``nvidia-smi``), ``summary.tsv`` (part, label, status: exit code | timeout | skipped, seconds, limit,
command), and one log per part (``check.log``, ``mfu.log``, ``step.log``, ``attention.log``, ``rollout.log``). The end
of each command's output and the summary are printed too (a remote runner that returns only the end of the output gets
the summary in its last 12,000 characters). Exit status 0 when every command passed, 1 otherwise, 2 for a usage error.

``--cpu`` runs every command on the CPU at the tiny geometry (the runner's own test, tests/e2e/test_gpu_session_runs.py),
installs nothing and writes the checkpoint to a temporary folder. Only the standard library is imported here: on the
GPU machine the wheels this installs (``.whl/``, made by ``scripts/gpu_wheels.sh``) are what the parts import.
"""

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
GRACE_S = 10  # SIGINT -> SIGKILL of a command at its limit
MIN_LIMIT_S = 10  # a command that would get less is skipped
DEFAULT_DEADLINE_S = 480
WHEELS = REPO / ".whl"  # made here by scripts/gpu_wheels.sh, carried by the run call
GPU_CHECKPOINT = Path("/tmp/sage_gpu_real8")  # kept between calls on a warm machine (a rerun of `step` reuses it)
WHEEL_SITE = "/tmp/site"
OUTPUTS = ("env.txt", "summary.tsv")  # besides each part's log
MARKER = ".written"  # in a finished checkpoint: the writer's command line (what determines its contents)

# What the one call does not run, and why (printed to env.txt; docs/gpu_runbook.md "Cut").
CUT = (
    ("the unit tier on the machine's CPU under torch 2.11", "about 150 s; it passed on the CPU under the image's "
     "transformers 5.17 / huggingface_hub 1.33, scripts/torch_api_audit.py screens torch 2.11's API, and the device "
     "tier runs under torch 2.11 here"),
    ("MFU per attention backend, as one rank of sp 2, at 8 and 54 blocks", "30-60 s each; the 4-block native run is "
     "the headline figure, and the attention part times every backend"),
    ("torch.compile of the blocks (inductor)", "its compile time on a GPU is unknown (minutes on the CPU): it could "
     "take the rest of the run"),
    ("generate.py's speed flags (benchmark_generate.py)", "4-8 minutes of renders; the parts above come first"),
    ("the rollout at all 54 blocks", "8 blocks, the step checkpoint's depth, keep the part under a minute; the "
     "attention processor that makes the difference is per block"),
    ("a 16-block step, multi-GPU FSDP / Ulysses over NCCL", "one GPU per machine; the 8-block plan leaves 2x margin"),
    ("flash-attn, SageAttention, xformers", "not in the image; the attention part lists them as unusable, with why"),
)


@dataclass(frozen=True)
class Command:
    """One bounded command of a part; ``gate``: when it fails, nothing after it runs."""

    label: str
    argv: tuple
    cap: float
    tail: int = 25  # lines of its output echoed to stdout
    gate: bool = False


@dataclass(frozen=True)
class Part:
    name: str
    priority: int  # 1 is kept longest
    log: str  # file under $OUT
    commands: tuple
    background: Optional[Command] = None  # started once the gate passed; the part waits for it first


# Per device: the benchmarks' flags (the CPU's are the tiny geometry, in seconds) and the checkpoint writer's.
GEOMETRY = {
    "cuda": dict(
        mfu=("--geometry", "real", "--blocks", "4", "--device", "cuda", "--dtype", "bf16", "--repeats", "3"),
        step=("--geometry", "real", "--device", "cuda", "--repeats", "1", "--warmup", "1"),
        attention=("--geometry", "real", "--blocks", "4", "--device", "cuda", "--dtype", "bf16", "--repeats", "2"),
        rollout=("--geometry", "real", "--blocks", "8", "--device", "cuda", "--dtype", "bf16", "--batch", "1",
                 "--steps", "8", "--repeats", "1", "--warmup", "1"),
        checkpoint=("--real_width_blocks", "8", "--vae", "real")),
    "cpu": dict(
        mfu=("--geometry", "tiny", "--device", "cpu", "--repeats", "1", "--warmup", "0", "--threads", "2"),
        step=("--geometry", "tiny", "--device", "cpu", "--steps", "2", "--repeats", "1", "--warmup", "0",
              "--threads", "2"),
        attention=("--geometry", "tiny", "--device", "cpu", "--repeats", "1", "--warmup", "0", "--threads", "2"),
        rollout=("--geometry", "tiny", "--device", "cpu", "--batch", "1", "--steps", "2", "--repeats", "1",
                 "--warmup", "0", "--threads", "2"),
        checkpoint=("--no_reward",)),
}
CAPS = dict(wheels=60, nvidia_smi=20, gpu_check=60, device_tier=120, checkpoint=180, mfu=90, step=240, attention=90,
            rollout=90)
RUN_ORDER = ("check", "mfu", "step", "attention", "rollout")


def build_parts(device: str, python: str, checkpoint: Path, tests: Sequence[str]) -> Dict[str, Part]:
    """The parts by name on ``device`` (cuda | cpu), run with ``python``."""
    flags = GEOMETRY[device]

    def bench(name: str, script: str, *extra: str) -> Command:
        return Command(name, (python, f"benchmarks/{script}", *flags[name], *extra), CAPS[name])

    check = (Command("gpu_check", (python, "scripts/gpu_check.py", "--device", device), CAPS["gpu_check"], gate=True),
             Command("device_tier", (python, "-m", "pytest", *tests, "--device", device, "-m", "device", "-x", "-q",
                                     "-rfE", "-p", "no:cacheprovider"), CAPS["device_tier"], tail=8))
    writer = Command("checkpoint", (python, "scripts/make_tiny_checkpoint.py", "--output", str(checkpoint),
                                    *flags["checkpoint"]), CAPS["checkpoint"], tail=3)
    return {
        "check": Part("check", 1, "check.log", check),
        "step": Part("step", 2, "step.log", (bench("step", "benchmark_step.py", "--checkpoint_root", str(checkpoint)),),
                     background=writer),
        "mfu": Part("mfu", 3, "mfu.log", (bench("mfu", "benchmark_transformer.py", "--checkpointing", "both"),)),
        "attention": Part("attention", 4, "attention.log", (bench("attention", "benchmark_attention.py", "--key_mask",
                                                                  "both", "--skip", "_native_math"),)),
        "rollout": Part("rollout", 5, "rollout.log", (bench("rollout", "benchmark_rollout.py",
                                                            "--diffusers_joint_attention"),)),
    }


def with_caps(parts: Dict[str, Part], caps: Dict[str, float]) -> Dict[str, Part]:
    """``parts`` with the caps of the commands named in ``caps`` replaced."""
    def capped(command: Optional[Command]) -> Optional[Command]:
        return replace(command, cap=caps[command.label]) if command and command.label in caps else command

    return {name: replace(part, commands=tuple(capped(c) for c in part.commands), background=capped(part.background))
            for name, part in parts.items()}


def reserved(parts: Sequence[Part], index: int) -> float:
    """Seconds kept for the parts after ``parts[index]`` in run order that outrank it (their foreground caps)."""
    priority = parts[index].priority
    return sum(c.cap for part in parts[index + 1:] if part.priority < priority for c in part.commands)


class Session:
    """Runs the parts against one deadline, writing the logs and summary.tsv under ``out``."""

    def __init__(self, out: Path, deadline_s: float, env: Dict[str, str]):
        self.out, self.env = out, env
        self.start = time.monotonic()
        self.deadline = self.start + deadline_s
        self.failed = 0
        self.running: List[subprocess.Popen] = []  # killed whatever happens to the runner

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def limit(self, cap: float, reserve: float = 0.0) -> float:
        return min(cap, self.left() - reserve - GRACE_S)

    def note(self, log: str, text: str) -> None:
        with open(self.out / log, "a") as handle:
            handle.write(text + "\n")
        print(text, flush=True)

    def record(self, part: str, command: Command, status: str, seconds: float, limit: float) -> None:
        if status != "0":
            self.failed += 1
        with open(self.out / "summary.tsv", "a") as handle:
            handle.write(f"{part}\t{command.label}\t{status}\t{seconds:.0f}\t{max(limit, 0):.0f}\t"
                         f"{' '.join(command.argv)}\n")

    def skip(self, part: Part, command: Command, why: str) -> None:
        self.note(part.log, f"=== {part.name}/{command.label}: SKIPPED ({why})")
        self.record(part.name, command, "skipped", 0.0, 0.0)

    def launch(self, part: Part, command: Command, limit: float) -> subprocess.Popen:
        self.note(part.log, f"=== {part.name}/{command.label} (limit {limit:.0f} s): {' '.join(command.argv)}")
        with open(self.out / part.log, "a") as log:
            proc = subprocess.Popen(command.argv, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.running.append(proc)
        return proc

    def finish(self, proc: subprocess.Popen, timeout: float) -> str:
        """Waits up to ``timeout`` s; then SIGINT to the group, SIGKILL :data:`GRACE_S` s later. The status: the exit
        code, or ``timeout``."""
        try:
            return str(proc.wait(timeout=max(timeout, 0)))
        except subprocess.TimeoutExpired:
            signal_group(proc, signal.SIGINT)
            try:
                proc.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                pass
            return "timeout"
        finally:
            signal_group(proc, signal.SIGKILL)  # whatever it started and left behind
            proc.wait()
            self.running.remove(proc)

    def run(self, part: Part, command: Command, reserve: float = 0.0) -> str:
        limit = self.limit(command.cap, reserve)
        if limit < MIN_LIMIT_S:
            self.skip(part, command, f"{self.left():.0f} s left of the deadline, {reserve:.0f} s of it kept for "
                                     "higher-priority parts")
            return "skipped"
        log = self.out / part.log
        offset = log.stat().st_size if log.exists() else 0
        started = time.monotonic()
        try:
            proc = self.launch(part, command, limit)
        except OSError as err:  # no such program: into the log, echoed below with the command's output
            with open(log, "a") as handle:
                handle.write(f"error: {err}\n")
            status = "127"
        else:
            status = self.finish(proc, limit)
        self.report(part, command, status, time.monotonic() - started, limit, offset)
        return status

    def report(self, part: Part, command: Command, status: str, seconds: float, limit: float, offset: int) -> None:
        """Echoes the end of the command's output, notes its end and records it."""
        with open(self.out / part.log, errors="replace") as handle:
            handle.seek(offset)
            lines = handle.read().splitlines()[1:]  # after the command's own header line
        if command.tail and lines:
            print("\n".join(lines[-command.tail:]), flush=True)
        outcome = "TIMED OUT" if status == "timeout" else f"exit {status}"
        self.note(part.log, f"=== {part.name}/{command.label}: {outcome} after {seconds:.0f} s")
        self.record(part.name, command, status, seconds, limit)

    def kill_all(self) -> None:
        for proc in list(self.running):
            signal_group(proc, signal.SIGKILL)
            proc.wait()
            self.running.remove(proc)


def signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


class Checkpoint:
    """The step's checkpoint: written in the background once, reused while its marker names the same writer."""

    def __init__(self, path: Path, ours: bool):
        self.path, self.ours = path, ours
        self.proc: Optional[subprocess.Popen] = None
        self.limit = self.started = 0.0
        self.ended: Optional[float] = None
        self.offset = 0  # where the writer's lines start in the part's log

    def written_by(self, command: Command) -> bool:
        marker = self.path / MARKER
        return marker.is_file() and marker.read_text() == " ".join(command.argv[1:])

    def check_path(self, command: Command) -> Optional[str]:
        """Why the path cannot be used (None: it can): a folder we did not write is never removed."""
        if self.path.exists() and not self.ours and not self.written_by(command):
            return (f"--checkpoint {self.path} exists and was not written by this runner's writer "
                    f"({' '.join(command.argv[1:])}): name a new folder, or leave --checkpoint out")
        return None

    def start(self, session: Session, part: Part) -> None:
        command = part.background
        if self.written_by(command):
            session.note(part.log, f"=== {part.name}/{command.label}: reusing {self.path}")
            return
        self.limit = session.limit(command.cap)
        if self.limit < MIN_LIMIT_S:
            return  # the step part records it as skipped
        shutil.rmtree(self.path, ignore_errors=True)  # ours (check_path): a write cut short earlier
        log = session.out / part.log
        self.offset = log.stat().st_size if log.exists() else 0
        self.started = time.monotonic()
        self.proc = session.launch(part, replace(command, label=f"{command.label} (background)"), self.limit)
        self.ended = None
        threading.Thread(target=self._note_end, args=(self.proc,), daemon=True).start()

    def _note_end(self, proc: subprocess.Popen) -> None:
        proc.wait()
        self.ended = time.monotonic()  # its own seconds, not those until the step part waited for it

    def wait(self, session: Session, part: Part) -> str:
        """The writer's status once it ended (waiting what is left of its limit); "0" when reused."""
        command = part.background
        if self.proc is None:
            if self.written_by(command):
                return "0"
            session.skip(part, command, "not started: the check failed or the deadline had passed")
            return "skipped"
        status = session.finish(self.proc, self.limit - (time.monotonic() - self.started))
        seconds = (self.ended if status != "timeout" and self.ended else time.monotonic()) - self.started
        session.report(part, command, status, seconds, self.limit, self.offset)
        if status == "0":
            (self.path / MARKER).write_text(" ".join(command.argv[1:]))
        return status


def run_session(session: Session, parts: List[Part], checkpoint: Checkpoint) -> None:
    """The parts in run order; the step's checkpoint starts in the background once gpu_check passed."""
    writer = next((part for part in parts if part.background is not None), None)
    stopped = None
    if writer is not None and not any(part.name == "check" for part in parts):
        checkpoint.start(session, writer)  # a rerun without the check part
    for index, part in enumerate(parts):
        for command in part.commands:
            if stopped:
                session.skip(part, command, stopped)
                continue
            if part is writer and checkpoint.wait(session, part) != "0":
                session.skip(part, command, f"no checkpoint at {checkpoint.path} (see the lines above)")
                continue
            status = session.run(part, command, reserved(parts, index))
            if command.gate and status != "0":
                stopped = f"{part.name}/{command.label} failed: the CUDA path does not work; give the machine back"
            elif command.gate and writer is not None:
                checkpoint.start(session, writer)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("parts", nargs="*", metavar="PART",
                        help=f"parts to run (default: all): {', '.join(RUN_ORDER)}; they run in that order")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU at the tiny geometry (the runner's test)")
    parser.add_argument("--deadline", type=float, default=DEFAULT_DEADLINE_S,
                        help="seconds from the start by which every command has ended")
    parser.add_argument("--cap", action="append", default=[], metavar="LABEL=SECONDS",
                        help=f"a command's cap; labels: {', '.join(CAPS)}")
    parser.add_argument("--checkpoint", default=None,
                        help=f"the step's checkpoint folder (default: {GPU_CHECKPOINT} on the GPU, a temporary one "
                             "with --cpu)")
    parser.add_argument("--tests", nargs="+", default=["tests"], help="what the device tier collects")
    args = parser.parse_args(argv)
    unknown = [name for name in args.parts if name not in RUN_ORDER]
    if unknown:
        parser.error(f"unknown part {unknown[0]!r}: choose from {', '.join(RUN_ORDER)}")
    caps = {}
    for item in args.cap:
        label, _, seconds = item.partition("=")
        if label not in CAPS or not seconds.replace(".", "", 1).isdigit():
            parser.error(f"--cap {item}: give LABEL=SECONDS with a label of {', '.join(CAPS)}, e.g. step=400")
        caps[label] = float(seconds)
    args.caps = caps
    return args


def describe(session: Session, args, parts: List[Part]) -> None:
    """The runner's settings and what is cut, to env.txt."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                text=True).stdout.strip()
    except OSError:  # no git there
        commit = ""
    session.note("env.txt", f"gpu_session.py on {socket.gethostname()}, {os.cpu_count()} CPUs, "
                            f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, python {sys.executable}, git "
                            f"{commit or '? (no .git here: the commit is the one the call was made from)'}")
    session.note("env.txt", f"device {'cpu' if args.cpu else 'cuda'}, deadline {args.deadline:.0f} s, parts "
                            + ", ".join(f"{p.name} (priority {p.priority})" for p in parts))
    for part in parts:
        for command in part.commands + ((part.background,) if part.background else ()):
            session.note("env.txt", f"  {part.name}/{command.label}: cap {command.cap:.0f} s")
    for what, why in CUT:
        session.note("env.txt", f"cut: {what}: {why}")


def setup_gpu(session: Session) -> bool:
    """Installs the carried wheels into WHEEL_SITE (first on PYTHONPATH) and records nvidia-smi; False on failure."""
    setup = Part("setup", 0, "env.txt", ())
    wheels = sorted(str(path) for path in WHEELS.glob("*.whl"))
    if not wheels:
        session.note("env.txt", "error: no wheels in .whl/: run 'bash scripts/gpu_wheels.sh' here first and name "
                                ".whl in the run call's carry")
        return False
    install = Command("wheels", (sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                                 "--no-compile", "--no-cache-dir", "--upgrade", "--target", WHEEL_SITE, *wheels),
                      CAPS["wheels"], tail=5)
    if session.run(setup, install) != "0":
        return False
    session.env["PYTHONPATH"] = os.pathsep.join(filter(None, (WHEEL_SITE, session.env.get("PYTHONPATH"))))
    session.run(setup, Command("nvidia_smi", ("nvidia-smi",), CAPS["nvidia_smi"], tail=20))
    return True


def main(argv=None) -> int:
    args = parse_args(argv)
    device = "cpu" if args.cpu else "cuda"
    temporary = None
    if args.checkpoint is None and args.cpu:
        temporary = tempfile.mkdtemp(prefix="sage_gpu_session_")
    path = Path(args.checkpoint or temporary or GPU_CHECKPOINT)
    every = with_caps(build_parts(device, sys.executable, path, args.tests), args.caps)
    parts = [every[name] for name in RUN_ORDER if name in (args.parts or RUN_ORDER)]
    checkpoint = Checkpoint(path, ours=args.checkpoint is None)
    refusal = checkpoint.check_path(every["step"].background)
    if refusal:
        print(f"error: {refusal}", file=sys.stderr)
        return 2
    out = Path(os.environ.get("OUT") or REPO / "gpu_out")
    out.mkdir(parents=True, exist_ok=True)
    for name in OUTPUTS + tuple(part.log for part in every.values()):  # a previous run's, by these names only
        (out / name).unlink(missing_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONUNBUFFERED": "1"}
    session = Session(out, args.deadline, env)
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally below still ends every command
    try:
        describe(session, args, parts)
        if args.cpu or setup_gpu(session):
            run_session(session, parts, checkpoint)
        else:
            session.failed += 1
    finally:
        session.kill_all()
        signal.signal(signal.SIGTERM, previous)
        if temporary:
            shutil.rmtree(temporary, ignore_errors=True)
    print(f"summary ({out / 'summary.tsv'}; part, label, status, seconds, limit): {session.failed} command(s) failed, "
          f"timed out or skipped, {time.monotonic() - session.start:.0f} s in all")
    if (out / "summary.tsv").exists():
        for line in (out / "summary.tsv").read_text().splitlines():
            print("  " + "\t".join(line.split("\t")[:5]))
    return 0 if session.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
