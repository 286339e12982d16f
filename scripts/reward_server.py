"""Serve a reward model over HTTP for ``post_train.py --remote_reward_url`` (wire format: sage_grpo/rewards/remote.py).

``sage-grpo serve-reward`` is the same command; the code and its documentation: sage_grpo/cli/serve_reward.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sage_grpo.cli.serve_reward import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
