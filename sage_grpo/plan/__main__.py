"""``python -m sage_grpo.plan``: print the memory plan of a post_train.py launch."""
import sys

from sage_grpo.plan.report import main

sys.argv[0] = "python -m sage_grpo.plan"  # argparse's usage line names the command, not __main__.py
main(sys.argv[1:])
