"""Memory plan of a launch: what lives on each GPU, and the placement decisions the ``auto`` flags leave to it.

:class:`Placement` is the one object the trainer reads for ``--gradient_reduction``, ``--reference_placement`` and
``--vae_tiling``; :func:`resolve_placement` turns the flags (``auto`` included) into it.
"""

from dataclasses import dataclass

from sage_grpo.config import TrainConfig

# Videos larger than this (frames x height x width) are decoded tile by tile under --vae_tiling auto.
VAE_TILING_PIXELS = 33 * 480 * 854


@dataclass(frozen=True)
class Placement:
    """Resolved memory-placement choices.

    ``reduce_per_backward``: FSDP reduce-scatters the gradients after every backward (sharded gradients only) instead
    of once per optimizer update; ``reference_on_cpu``: the frozen reference's shards are offloaded to the CPU;
    ``vae_tiling``: ``--vae_tiling`` (``auto``: tiled above :data:`VAE_TILING_PIXELS`, see :meth:`tile`).
    """

    reduce_per_backward: bool
    reference_on_cpu: bool
    vae_tiling: str = "auto"

    def tile(self, num_frames: int, height: int, width: int) -> bool:
        """Whether a decode of ``num_frames`` frames of ``height x width`` pixels runs tiled."""
        if self.vae_tiling == "auto":
            return decoded_pixels(num_frames, height, width) > VAE_TILING_PIXELS
        return self.vae_tiling == "true"


def decoded_pixels(num_frames: int, height: int, width: int) -> int:
    return num_frames * height * width


def resolve_placement(cfg: TrainConfig, *, sharded: bool, device_type: str) -> Placement:
    """The placement of ``cfg`` for a run whose policy is FSDP-``sharded`` (or not) on ``device_type``.

    ``auto`` rules: gradients are reduced per backward for a sharded full fine-tune (held unsharded fp32 gradients of
    the whole transformer cost 4 bytes per parameter per GPU) and per update otherwise (LoRA gradients are small);
    the reference is offloaded only with ``--reference_mode_offload`` on an unsharded model (sharded over the GPUs
    its bf16 shards are small).
    """
    if cfg.gradient_reduction == "auto":
        per_backward = sharded and not cfg.use_lora
    else:
        per_backward = cfg.gradient_reduction == "per_backward"
    if cfg.reference_placement == "auto":
        on_cpu = cfg.reference_mode_offload and not sharded
    else:
        on_cpu = cfg.reference_placement == "cpu"
    return Placement(reduce_per_backward=per_backward, reference_on_cpu=on_cpu, vae_tiling=cfg.vae_tiling)
