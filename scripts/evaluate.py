"""``python scripts/evaluate.py ...`` is ``python -m sage_grpo.evaluate ...`` (see sage_grpo/evaluate/command.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sage_grpo.evaluate import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
