"""``python -m sage_grpo.plan``: print the memory plan of a post_train.py launch."""
import sys

from sage_grpo.plan.report import main

main(sys.argv[1:])
