"""sage-grpo: GRPO post-training of HunyuanVideo-1.5 with the SAGE-GRPO sampler, equalizer and dual trust region.

Layout, low layers first (the order tests/unit/test_architecture.py enforces): ``config`` (typed schema and CLI),
``sde`` (one file per SDE kernel), ``rl`` (advantages, PPO loss, KL, anchor, controller, equalizer), ``models``
(HunyuanVideo-1.5 loading, LoRA, VAE decode, tiny checkpoints), ``distributed`` (mesh, FSDP2, Ulysses), ``optim``,
``rewards`` (VideoAlign, toy rewards, reward setup), ``tracking`` (run directory, trackers, plots), ``export``,
``pipeline`` (the sampler: rollout, replay, generation), ``plan`` (the memory planner), ``checkpoint`` and
``resume``, ``trainer``, ``cli``; ``toy`` is the toy world and its study.
"""

__version__ = "0.2.0"
