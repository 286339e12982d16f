"""``TrainConfig``: every option of ``post_train.py``, declared once, in sections by what they configure.

Field names, types and defaults follow the reference's *effective* behaviour (its argparse defaults, which win over its
dataclass defaults; docs/reference.md#flags-and-defaults, docs/reference.md#settings-without-a-flag). Options the
reference does not expose as flags but that we make configurable (rollout size, sampler settings, logging retention,
...) sit in the section they configure. Options the reference accepts but ignores are accepted with a warning
(``no_effect``, the ``compat`` section).

The command line and YAML files name options flat, as the reference does (``--sde_type``, ``kl_weight: 1e-5``);
:mod:`sage_grpo.config.sections` routes each to its section, so code reads ``cfg.rollout.sde_type``. Each stage is
handed the sections it uses.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Tuple, Union

from sage_grpo.config.sections import build, names_where, owners, with_values

from sage_grpo.config.train.model import (ATTENTION_BACKENDS, MIXED_LENGTH_ATTENTION, LoRAConfig, ModelConfig,
                                          ParallelConfig, ThroughputConfig)
from sage_grpo.config.train.rollout import (DEFAULT_CLIP_MODEL, DEFAULT_REWARD_WEIGHTS, PICKSCORE_MODEL,
                                            PICKSCORE_PROCESSOR, RESOLUTION_BUCKETS, DataConfig,
                                            RewardConfig, RolloutConfig)
from sage_grpo.config.train.objective import OptimConfig, TrustRegionConfig, UpdateConfig
from sage_grpo.config.train.run import (DRIFT_GUARD_ACTIONS, CompatConfig, DriftGuardConfig, OutputConfig,
                                        ValidationConfig)


@dataclass
class TrainConfig:
    """The training configuration: one section per topic of ``--help``, in its order."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    update: UpdateConfig = field(default_factory=UpdateConfig)
    trust_region: TrustRegionConfig = field(default_factory=TrustRegionConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    throughput: ThroughputConfig = field(default_factory=ThroughputConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    drift: DriftGuardConfig = field(default_factory=DriftGuardConfig)
    compat: CompatConfig = field(default_factory=CompatConfig)

    @classmethod
    def of(cls, **options) -> "TrainConfig":
        """A configuration from flat option names, as the command line names them, every other option at its
        default: ``TrainConfig.of(sde_type="cps", kl_weight=0.0)``. The values are code's, taken as given (user input
        goes through :func:`~sage_grpo.config.schema.parse_cli` or ``from_dict``, which type and check them)."""
        return build(cls, options)

    def replace(self, **options) -> "TrainConfig":
        """A copy with ``options`` (flat names) changed in their sections."""
        return with_values(self, **options)

    def __setattr__(self, name: str, value) -> None:
        """An option is set in its section (``cfg.rollout.eta = 0.3``); setting it here would only add an attribute
        nothing reads."""
        if name in owners(TrainConfig):
            raise AttributeError(f"TrainConfig.{name}: options live in sections; set cfg.{owners(TrainConfig)[name]}"
                                 f".{name}, or use cfg.replace({name}=...)")
        object.__setattr__(self, name, value)


# What an option is, read from its declaration (config_field's metadata), never listed by hand:
RUN_DEFINING: Tuple[str, ...] = names_where(TrainConfig, "defines_run")  # a resume refuses to change these
CARD_OPTIONS: Tuple[str, ...] = names_where(TrainConfig, "on_card")  # an exported model's card records these


def read_run_config(path: Union[str, Path]) -> TrainConfig:
    """The ``TrainConfig`` a run recorded in ``path`` (``run_config.yaml``, a checkpoint's ``config.yaml``), checked
    like the command line (:func:`sage_grpo.config.recorded.read_recorded`)."""
    # imported here: the reader checks with config.validation, whose rules import this package's sections
    from sage_grpo.config.recorded import read_recorded

    return read_recorded(path, TrainConfig)
