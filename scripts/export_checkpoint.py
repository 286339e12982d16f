"""Export a training checkpoint for diffusers / peft (the ``sage-grpo-export`` command; code: sage_grpo/cli/export.py).

    python scripts/export_checkpoint.py --checkpoint outputs/run/checkpoint-100 --model_root ckpts \
        --output exported/transformer [--format transformer|lora] [--dtype fp32|bf16]

``--help`` lists every option; library code: sage_grpo/export/weights.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sage_grpo.cli.export import main  # noqa: E402

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
