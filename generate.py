"""Sample videos from HunyuanVideo-1.5 (the ``sage-grpo-generate`` command; code: sage_grpo/cli/generate.py).

    python generate.py --model_path ckpts --resolution 480p --prompt "A cat walks on the grass" \
        --num_inference_steps 50 --video_length 121 --output_path outputs/cat.mp4
    python generate.py --valid_video_csv prompts.csv --checkpoint_path run/checkpoint-100 --output_path outputs/eval

``python generate.py --help`` lists every option.
"""

import sys

from sage_grpo.cli.generate import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
