"""Picture of a run: the GRPO reward and the manifold error (when the reward reports one) per step, as a PNG.

``sage-grpo plot`` is the same command; the code and its documentation: sage_grpo/cli/plot.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sage_grpo.cli.plot import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
