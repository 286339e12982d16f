"""``python -m sage_grpo.evaluate``: Table 2 for any set of checkpoints (docs/evaluation.md)."""
import sys

from sage_grpo.evaluate import main

if __name__ == "__main__":  # importing this module (gpu_check imports every module) runs nothing
    sys.exit(main())
