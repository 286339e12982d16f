"""``python -m sage_grpo.plan``: print the memory plan of a post_train.py launch."""
import sys

from sage_grpo.plan.report import main

if __name__ == "__main__":  # importing this module (gpu_check imports every module) runs nothing
    sys.argv[0] = "python -m sage_grpo.plan"  # argparse's usage line names the command, not __main__.py
    main(sys.argv[1:])
