"""sage-grpo: GRPO post-training of HunyuanVideo-1.5 with the SAGE-GRPO sampler, equalizer and dual trust region.

Layout: ``config`` (typed schema and CLI), ``sde`` (one file per SDE sampler), ``rl`` (advantages, PPO loss, KL,
controller), ``models`` (HunyuanVideo-1.5 loading, tiny checkpoints), ``pipeline`` (rollout and replay),
``rewards`` (VideoAlign and toy rewards), ``distributed`` (mesh, FSDP2, Ulysses), ``trainer`` and ``checkpoint``.
"""

__version__ = "0.1.0"
