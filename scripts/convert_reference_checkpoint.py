"""Convert the reference's HunyuanVideo-1.5 checkpoint folders into this project's layout (the
``sage-grpo-convert-reference`` command; code: sage_grpo/cli/convert.py and sage_grpo/models/convert.py).

    python scripts/convert_reference_checkpoint.py --reference_root /data/HunyuanVideo-1.5/ckpts --output ckpts

``--help`` lists every option.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sage_grpo.cli.convert import main  # noqa: E402

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
