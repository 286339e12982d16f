"""Training checkpoints that resume exactly, written atomically by one :class:`CheckpointManager`.

The trainer builds the manager once with the stateful objects it owns: the model bundle (its trainable and anchor
state dicts, LoRA's extra folder), the optimizer, the KL controller, the moving-anchor schedule, its counters, and the
parallel layout. ``save(step)`` writes ``checkpoint-{step}``; ``load(path, training_state)`` restores all of them in
place, the small ones through their ``state_dict()``/``load_state_dict()`` (as torchtitan's checkpoint manager does).
The training loop only says when.

``checkpoint-{step}/`` holds::

    transformer/model.safetensors   trainable weights (all weights, or the LoRA adapter weights with --use_lora)
    training_state.pt               counters (the step fixes the data position and the LR), KL controller, anchor
                                    schedule, drift guard (``--drift_guard``), parallel layout, RNG states
    config.yaml                     the run's resolved configuration
    lora/                           LoRA runs not sharded by FSDP: the peft adapter folder
    ema/model.safetensors           --ema_decay: the EMA of the trainable weights (whole; on several processes gathered
                                    to rank 0 like transformer/, and sharded in the DCP part ``ema``)

and, written by one process::

    anchor/model.safetensors        moving-anchor (reference) weights, once the anchor has moved
    optimizer.pt                    optimizer state

or, written by several processes::

    transformer_dcp/                torch.distributed.checkpoint: every rank writes its shards of
                                      model      trainable weights (the keys of transformer/model.safetensors)
                                      optimizer  {part: get_optimizer_state_dict(...)} per torch optimizer (muon, adamw)
                                      anchor     moving-anchor weights (the bundle's reference_state: the reference
                                                 module, or the LoRA anchor adapter), once the anchor has moved
                                      ema        the EMA's shards (--ema_decay)

Several processes record the RNG states of every rank (``rng_per_rank``) and the optimizer parts in the training
state, one process its own RNG states (``rng``). ``transformer/model.safetensors`` is in both formats (gathered to
rank 0 from several processes): it is what ``generate.py`` and the export read. The full gather costs one
all-gather of the trainable weights per checkpoint and rank 0 CPU memory for one copy of them (33 GB in fp32 for the
8.3B model). DCP stores each tensor with its global shape and reshards on load, so a sharded checkpoint resumes on
any number of processes, one included; a one-process checkpoint resumes on one process.

Only where the optimizer state and the anchor live differs; the rest is one code path for one and many processes:
the training state, the full trainable weights, the config, the LoRA folder, the pruning and the atomic write. Every
rank writes into ``.checkpoint-{step}.tmp``; once every file is there (the fault-injection point ``checkpoint``) all
meet at a barrier, rank 0 renames it into place and all meet again, so a crash mid-save never leaves a directory that
looks like a finished checkpoint (rename is atomic on POSIX file systems). On several processes ``save`` and
``load`` are collectives: every rank enters each of their collectives, in the same order.
"""

from sage_grpo.checkpoint.files import (StateDict, gather_to_main, is_sharded_checkpoint, prune_checkpoints,
                                        resolve_resume_path, resumes, write_checkpoint_files)
from sage_grpo.checkpoint.manager import CheckpointedModels, CheckpointManager
from sage_grpo.checkpoint.rng import (capture_rng_state, check_rng_state, gather_rng_states, restore_rng_state,
                                      seed_everything)
from sage_grpo.checkpoint_layout import TRAINING_STATE_FILE, list_checkpoints

__all__ = ["StateDict", "gather_to_main", "is_sharded_checkpoint", "prune_checkpoints", "resolve_resume_path",
           "resumes", "write_checkpoint_files", "CheckpointedModels", "CheckpointManager", "capture_rng_state",
           "check_rng_state", "gather_rng_states", "restore_rng_state", "seed_everything", "TRAINING_STATE_FILE",
           "list_checkpoints"]
