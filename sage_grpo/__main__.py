"""``python -m sage_grpo VERB [flags...]``: the ``sage-grpo`` command (sage_grpo/cli/main.py), named as typed."""
import sys

from sage_grpo.cli.main import main

if __name__ == "__main__":  # importing this module (gpu_check imports every module) runs nothing
    sys.exit(main(sys.argv[1:], prog="python -m sage_grpo"))
