"""Where a run keeps its memory-heavy pieces: the resolved placement the model builder and the trainer follow.

The memory plan (:mod:`sage_grpo.plan.memory`) decides the ``auto`` flags and hands a :class:`Placement` down; the
models only read it, so they never import the plan.
"""
from dataclasses import dataclass

# Videos larger than this (frames x height x width) are decoded tile by tile under --vae_tiling auto.
VAE_TILING_PIXELS = 33 * 480 * 854


def decoded_pixels(num_frames: int, height: int, width: int) -> int:
    return num_frames * height * width


@dataclass(frozen=True)
class Placement:
    """Resolved memory-placement choices.

    ``reduce_per_backward``: FSDP reduce-scatters the gradients after every backward (sharded gradients only) instead
    of once per optimizer update; ``reference_on_cpu``: the frozen reference's shards are offloaded to the CPU;
    ``vae_tiling``: ``--vae_tiling`` (``auto``: tiled above :data:`VAE_TILING_PIXELS`, see :meth:`tile`);
    ``reference_batch_size``: transitions per no-grad forward of the KL reference means (``--reference_batch_size``);
    ``replay_group_size``: trained steps of a sample per policy forward and backward (``--replay_group_size``);
    ``async_reward``: the reward is scored in a background worker while the reference means run
    (``--async_reward``).
    """

    reduce_per_backward: bool
    reference_on_cpu: bool
    vae_tiling: str = "auto"
    reference_batch_size: int = 1
    replay_group_size: int = 1
    async_reward: bool = False

    def tile(self, num_frames: int, height: int, width: int) -> bool:
        """Whether a decode of ``num_frames`` frames of ``height x width`` pixels runs tiled."""
        if self.vae_tiling == "auto":
            return decoded_pixels(num_frames, height, width) > VAE_TILING_PIXELS
        return self.vae_tiling == "true"
