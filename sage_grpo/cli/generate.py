"""Sample videos from HunyuanVideo-1.5 (base or trained weights) with the Euler ODE sampler.

    sage-grpo-generate --model_path ckpts --resolution 480p --prompt "A cat walks on the grass" \
        --num_inference_steps 50 --video_length 121 --output_path outputs/cat.mp4
    sage-grpo-generate --valid_video_csv prompts.csv --checkpoint_path run/checkpoint-100 --output_path outputs/eval
    sage-grpo-generate --prompt "A cat walks" --lora_path run/checkpoint-100/lora --offloading false

(``python generate.py ...`` is the same command.) ``--checkpoint_path`` takes full, LoRA and sharded
(``transformer_dcp/``) training checkpoints and exported folders (``sage-grpo-export``); ``--lora_path`` a peft adapter
folder. Options: ``--help`` (sage_grpo/config/generate.py); behaviour and the speed flags:
sage_grpo/pipeline/generation.py.
"""

import sys

from sage_grpo.config.generate import GenerateConfig
from sage_grpo.config.schema import parse_cli
from sage_grpo.models.layout import MissingCheckpointError
from sage_grpo.pipeline.generation import NonFiniteVideoError, plan_generation, run_generation, settings_path
from sage_grpo.safe_io import CheckpointError, check_output_outside_inputs


def main(argv=None) -> int:
    config = parse_cli(GenerateConfig, argv, description=__doc__.splitlines()[0])
    from sage_grpo.plan.fit import check_generate_weights_fit

    try:
        plan = plan_generation(config)  # bad prompts, sizes or CSVs fail here, before any model loads
        check_generate_weights_fit(config.model_path, plan.transformer_version, config.dtype, plan.device.type)
        inputs = {"--model_path": config.model_path, "--checkpoint_path": config.checkpoint_path,
                  "--lora_path": config.lora_path}
        # the folder and every file written (resolved: an existing output that links into an input is refused too)
        for path in [plan.output_paths[0].parent, *plan.output_paths, *map(settings_path, plan.output_paths)]:
            check_output_outside_inputs(path, "--output_path", inputs)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        run_generation(config)
    except (CheckpointError, MissingCheckpointError, NonFiniteVideoError) as err:  # an unreadable, unsafe or missing
        # weight file, or weights that sample NaN
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
