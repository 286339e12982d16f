"""The reward server script and a trainer step scored by a remote reward with advantage aggregation."""
import json
import subprocess
import sys
import threading

import torch

from sage_grpo.config import parse_cli
from sage_grpo.config.train import TrainConfig
from sage_grpo.rewards.remote import RemoteReward
from sage_grpo.rewards.serving import RewardService
from sage_grpo.rewards.toys import ToySuiteReward
from sage_grpo.rl import group_advantages

from procs import kill_group, scaled
from reward_options_support import REPO_ROOT, ServerThread, fast_remote, random_videos


def test_reward_server_script_serves_the_configured_reward():
    cmd = [sys.executable, str(REPO_ROOT / "scripts" / "reward_server.py"), "--reward_model", "target_color",
           "--reward_kwargs", '{"target_rgb": [0, 0, 1]}', "--port", "0", "--device", "cpu", "--dtype", "fp32"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        timer = threading.Timer(scaled(60.0), kill_group, args=(proc,))  # a hung start cannot hang the test
        timer.start()
        line = proc.stdout.readline()
        timer.cancel()
        assert line.startswith("serving reward 'target_color'"), line + proc.stderr.read()
        client = RemoteReward("target_color", fast_remote(line.split()[-1]), video_fps=24.0)
        videos = random_videos(3, 3, 8, 8)
        scores = client(videos, ["a", "b", "c"])
        from sage_grpo.rewards.toys import TargetColorReward
        expected = TargetColorReward(target_rgb=[0, 0, 1])(videos, ["a", "b", "c"])["target_color"]
        assert torch.equal(scores["target_color"], expected.float())
    finally:
        kill_group(proc)


def test_trainer_step_with_a_remote_reward_and_advantage_aggregation(tiny_root, tmp_path):
    """One tiny training step scored by a reward server, advantages aggregated per term: each logged advantage is
    sum_k w_k * (z-score of term k within the group), recomputed here from the logged rewards."""
    from model_fixtures import tiny_args
    from sage_grpo.trainer import GRPOTrainer

    server = ServerThread(RewardService(ToySuiteReward(), "toy_suite", video_fps=24.0))
    try:
        weights = {"color": 1.0, "brightness": 0.5, "smoothness": 0.25}
        trainer = GRPOTrainer(parse_cli(TrainConfig, tiny_args(
            tiny_root, tmp_path / "run", "--max_steps", "1", "--reward_model", "toy_suite", "--reward_weights",
            json.dumps(weights), "--reward_aggregation", "advantage", "--remote_reward_url", server.url,
            "--save_rollout_videos", "true")))
        assert isinstance(trainer.reward_fn.fns["toy_suite"], RemoteReward)
        trainer.train()
    finally:
        server.stop()
    group = json.loads(next((trainer.run_dir / "rl_samples").glob("*/group_0/*_rewards.json")).read_text())
    terms = {key: torch.tensor([g[f"toy_suite_{key}"] for g in group]) for key in weights}
    expected = sum(w * group_advantages(terms[key], len(group)) for key, w in weights.items())
    torch.testing.assert_close(torch.tensor([g["advantage"] for g in group]), expected)
    # two members: sum gives +-1; advantage gives +-1 +-0.5 +-0.25 when every term differs within the group
    assert all(torch.isfinite(t).all() and t[0] != t[1] for t in terms.values())
    assert not torch.allclose(expected.abs(), torch.ones(2))
