"""``python -m sage_grpo.evaluate``: Table 2 for any set of checkpoints (docs/evaluation.md)."""
from sage_grpo.config.command import run_module
from sage_grpo.evaluate import main

if __name__ == "__main__":  # importing this module (gpu_check imports every module) runs nothing
    run_module("sage_grpo.evaluate", main)  # its usage line names the command, not __main__.py
