"""What the memory planner reads of a run: its configuration's sections, declared here by shape (as
:class:`sage_grpo.rl.kl.KLOptions` declares the trust-region options), so that no module of the planner but its
command line imports the training configuration. A ``TrainConfig`` is one.

The planner's entry points (``plan_launch``, ``plan_memory``, ``resolve_placement``, ``check_memory_plan``, ...) take
the run's configuration; below them every formula takes the sections, or the values, it reads.
"""

from typing import Protocol

from sage_grpo.config.train import (DataConfig, DriftGuardConfig, LoRAConfig, ModelConfig, OptimConfig,
                                    ParallelConfig, RewardConfig, RolloutConfig, ThroughputConfig, TrustRegionConfig,
                                    UpdateConfig, ValidationConfig)


class PlanOptions(Protocol):
    """The sections of the run's configuration the memory plan is computed from."""

    model: ModelConfig  # the model root, the dtypes, the text lengths
    data: DataConfig  # the batch
    rollout: RolloutConfig  # the video, the sampling steps, CFG
    reward: RewardConfig  # the reward models and where they run
    update: UpdateConfig  # the trained steps of a sample
    trust_region: TrustRegionConfig  # the KL mode: whether a reference is held
    optim: OptimConfig  # the optimizers' state, the EMA, the accumulation window
    lora: LoRAConfig  # the adapters
    parallel: ParallelConfig  # world layout, FSDP, placements, the GPU's budget
    throughput: ThroughputConfig  # the throughput decisions
    validation: ValidationConfig  # the held-out sampling and its scorers
    drift: DriftGuardConfig  # the drift proxy's frozen base copy

    def replace(self, **options) -> "PlanOptions":
        """A copy with ``options`` (flat names, as the flags name them) changed: the what-fits search and the fixes a
        refused launch is told."""
