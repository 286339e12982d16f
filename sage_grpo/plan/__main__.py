"""``python -m sage_grpo.plan``: print the memory plan of a post_train.py launch."""
from sage_grpo.config.command import run_module
from sage_grpo.plan.report import main

if __name__ == "__main__":  # importing this module (gpu_check imports every module) runs nothing
    run_module("sage_grpo.plan", main)  # its usage line names the command, not __main__.py
