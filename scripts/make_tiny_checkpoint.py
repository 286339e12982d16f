"""Write a tiny random-weight HunyuanVideo-1.5 checkpoint (same classes and layout as the real one) for CPU tests.

``sage-grpo make-tiny`` is the same command; the code and its documentation: sage_grpo/cli/make_tiny.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sage_grpo.cli.make_tiny import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
