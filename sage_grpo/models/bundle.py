"""``ModelBundle``: the trainer's one handle on its models (the policy, the KL reference or anchor, the VAE and the
prompt encoder), built by :func:`build_models`, so the loop itself never touches loading, dtypes, devices, adapters or
where the reference lives.

Precision: the transformer is loaded in ``--dtype``; the trained parameters are kept in ``--master_weight_type``
(fp32 by default) and the forward runs under ``--dtype`` autocast when that is bf16 (on one process the reference
leaves the parameters in bf16; we honour ``--master_weight_type`` everywhere). The reference model stays in
``--dtype`` and is frozen.

Full fine-tune: ``policy`` is trained whole, ``reference`` is a second, frozen copy of the base transformer (the
moving anchor overwrites it with the policy's weights).

LoRA (``--use_lora``, :mod:`sage_grpo.models.lora`): the base weights stay frozen in ``--dtype`` and only the adapter
(``--master_weight_type``) trains. There is no second transformer: ``reference`` is the policy module itself and
:meth:`ModelBundle.reference_on_device` yields it switched to the reference (adapters disabled = the base model, or
the ``anchor`` adapter once the moving anchor has been refreshed). The trainable state dict and the anchor state hold
only adapter tensors, keyed as peft saves them (``<module>.lora_A.weight``); :meth:`ModelBundle.save_extras` adds the
peft adapter folder ``lora/`` to a checkpoint. ``--reference_mode_offload`` has no second model to move with LoRA.
Parallelism wrappers go on ``policy`` and on :attr:`ModelBundle.separate_reference`, never on ``reference`` itself.

The frozen base model of the drift proxy (``--drift_proxy``, ``--drift_guard``; :meth:`ModelBundle.base_on_device`):
with LoRA the policy with its adapters disabled, with a KL anchor that never moves the reference, and otherwise
``base``, a third transformer loaded and placed like the reference (``sage_grpo.rl.drift_guard.drift_watch_of``).

Placement (:class:`sage_grpo.models.placement.Placement`, from ``--reference_placement``, ``--gradient_reduction`` and
``--vae_tiling``; ``auto`` decided by the memory plan): whether the reference lives on the CPU between its passes,
and whether decodes are tiled. With ``--offload_text_encoders`` (default) the text encoders live on the CPU and visit
the GPU only to encode prompts not cached yet (the cache keeps every prompt's embeddings, so after the first epoch
they never move).

Image-to-video (an ``_i2v`` transformer version): ``images`` builds the image condition of the samples whose prompt
row names a reference image (SigLIP encoder offloaded with the text encoders; the VAE encodes the frame);
:meth:`ModelBundle.encode` attaches it to their prompt embeddings.
"""

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Protocol, Sequence, Tuple

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from sage_grpo.checkpoint_layout import LORA_DIR
from sage_grpo.config.launch_env import read_launch_env
from sage_grpo.config.train.model import LoRAConfig, ModelConfig, ParallelConfig, ThroughputConfig
from sage_grpo.config.train.rollout import DataConfig, RolloutConfig
from sage_grpo.config.train.run import DriftGuardConfig, ValidationConfig
from sage_grpo.dtypes import DTYPES
from sage_grpo.models.lora import LoraTraining, check_lora_settings, reference_pass
from sage_grpo.models.image_condition import ImageConditionEncoder
from sage_grpo.models.attention import install_joint_attention, split_rows_of
from sage_grpo.models.layout import transformer_layout, version_task
from sage_grpo.models.loading import load_components, load_transformer
from sage_grpo.models.sharded_load import load_sharded_weights, transformer_on_meta
from sage_grpo.models.text_encoding import PromptEmbeds, PromptEncoder, TextEncoderSettings
from sage_grpo.models.placement import Placement
from sage_grpo.models.vae import decode_latents
from sage_grpo.rl import KLMode, drift_watch_of


class ParallelOptions(Protocol):
    """Where a process computes and whether it shards: the configuration's ``parallel`` section (by shape)."""

    parallel: ParallelConfig


class LoraOptions(Protocol):
    """A run's adapters: the ``lora`` section, and the ``data`` section's seed their initialisation draws from."""

    lora: LoRAConfig
    data: DataConfig


class FrozenTransformerOptions(Protocol):
    """A frozen base transformer: the ``model`` section (which, in which dtype, its attention) and the ``throughput``
    section (``--mixed_length_attention``)."""

    model: ModelConfig
    throughput: ThroughputConfig


class ModelOptions(Protocol):
    """The sections of the training configuration the models are built from (declared by shape): the model and its
    adapters, where they run and how (``parallel``, ``throughput``), the adapters' seed (``data``), the negative
    prompt (``rollout``) and whether the drift proxy needs a base copy (``drift``, ``validation``)."""

    model: ModelConfig
    lora: LoRAConfig
    parallel: ParallelConfig
    throughput: ThroughputConfig
    data: DataConfig
    rollout: RolloutConfig
    drift: DriftGuardConfig
    validation: ValidationConfig


def resolve_device(cfg: ParallelOptions) -> torch.device:
    """This process's device, decided once: ``--device``, else CUDA when available, else the CPU. A CUDA device
    always carries its index, this process's ``cuda:LOCAL_RANK`` when ``--device cuda`` names none: the NCCL barrier
    needs the index, and tensors report ``cuda:N``, which never equals a bare ``cuda``."""
    local_rank = read_launch_env().local_rank  # checked: LOCAL_RANK=abc is one line, not a traceback
    if cfg.parallel.device:
        device = torch.device(cfg.parallel.device)
        return torch.device("cuda", local_rank) if device.type == "cuda" and device.index is None else device
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def is_sharded_run(cfg: ParallelOptions) -> bool:
    """Whether the transformers get FSDP-sharded: ``--enable_fsdp`` on several processes."""
    return cfg.parallel.enable_fsdp and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


@dataclass
class ModelBundle:
    transformer_version: str  # --pretrained_transformer_version
    neg_prompt: Optional[str]  # --neg_prompt: the unconditional branch's prompt
    device: torch.device
    policy: torch.nn.Module
    reference: Optional[torch.nn.Module]  # None without KL; with LoRA the policy module itself (see module doc)
    vae: torch.nn.Module
    encoder: PromptEncoder
    placement: Placement  # decided by the memory plan (sage_grpo.plan.memory.placement_of), handed in by the caller
    lora: Optional[LoraTraining] = None
    weights_folder: Optional[Path] = None  # set while the transformers are on the meta device (see materialize)
    images: Optional[ImageConditionEncoder] = None  # image-to-video versions only
    base: Optional[torch.nn.Module] = None  # the drift proxy's frozen base copy, where it needs one (module doc)

    def materialize(self) -> None:
        """Read the weights into transformers built on the meta device (after they were sharded): each rank
        allocates and reads only its own shards (an offloaded reference's in CPU memory). No-op when they were
        loaded whole."""
        if self.weights_folder is None:
            return
        load_sharded_weights(self.policy, self.weights_folder, self.device)
        for frozen in (self.separate_reference, self.base):
            if frozen is not None:
                load_sharded_weights(frozen, self.weights_folder,
                                     "cpu" if self.placement.reference_on_cpu else self.device)
        self.weights_folder = None

    # ------------------------------------------------------------------ sampling
    def encode(self, prompts: Sequence[str], image_paths: Optional[Sequence[str]] = None,
               size: Optional[Tuple[int, int]] = None) -> PromptEmbeds:
        """The prompts' embeddings on the device; with ``image_paths`` (one per prompt) the image condition of
        those reference images at video size ``size`` (H, W) too."""
        embeds = self.encoder.encode(list(prompts), negative_prompt=self.neg_prompt).to(self.device)
        if not image_paths:
            return embeds
        if self.images is None:
            raise ValueError(f"transformer version {self.transformer_version!r} has no image encoder "
                             "for image-to-video prompts")
        return embeds.with_image(self.images.encode(image_paths, *size).to(self.device))

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """(B, C, T, h, w) final latents -> (B, 3, F, H, W) videos in [0, 1] on the CPU (sampling itself is the
        :class:`~sage_grpo.pipeline.sampler.Sampler`'s, on ``policy`` and ``vae``)."""
        _, frames, height, width = self.video_shape(latents)
        return decode_latents(self.vae, latents, tiling=self.placement.tile(frames, height, width))

    def video_shape(self, latents: torch.Tensor) -> Tuple[int, int, int, int]:
        """(3, F, H, W) of one decoded video of ``latents`` (B, C, T, h, w)."""
        config = self.vae.config
        scale = config.spatial_compression_ratio
        return (3, (latents.shape[2] - 1) * config.temporal_compression_ratio + 1, latents.shape[-2] * scale,
                latents.shape[-1] * scale)

    # ------------------------------------------------------------------ reference / anchor
    @property
    def separate_reference(self) -> Optional[torch.nn.Module]:
        """The reference transformer when it is a module of its own (full fine-tune with KL), else None.

        Wrappers (FSDP, offloading) apply to this one; with LoRA ``reference`` is the policy and is never wrapped
        twice.
        """
        return self.reference if self.lora is None else None

    @contextlib.contextmanager
    def reference_on_device(self) -> Iterator[torch.nn.Module]:
        """The reference model ready for its passes, for the duration of the block. The one place that knows where
        the reference lives:

        * FSDP-sharded (several processes): the module itself; FSDP gathers each block's shards (from CPU memory
          with ``--reference_mode_offload``) for its forward;
        * a plain module: moved whole to the compute device and back with ``--reference_mode_offload``;
        * LoRA: the policy module switched to the reference (the base model, or the anchor adapter once the moving
          anchor has been refreshed), back to the trained policy when the block exits.
        """
        if self.lora is not None:
            with self.lora.reference_mode() as reference:
                yield reference
            return
        with self._frozen_on_device(self.reference) as reference:
            yield reference

    @contextlib.contextmanager
    def base_on_device(self) -> Iterator[torch.nn.Module]:
        """The frozen base model (the drift proxy's) for the duration of the block: with LoRA the policy with its
        adapters disabled; the frozen copy ``base`` where the run has one; else the reference, an anchor that never
        moves."""
        if self.lora is not None:
            with reference_pass(self.policy, None) as base:
                yield base
            return
        with self._frozen_on_device(self.base if self.base is not None else self.reference) as base:
            yield base

    @contextlib.contextmanager
    def _frozen_on_device(self, module: torch.nn.Module) -> Iterator[torch.nn.Module]:
        """A frozen transformer of its own (the reference, the base copy) on the device: FSDP gathers a sharded one
        itself; a plain one offloaded to the CPU moves there and back."""
        if isinstance(module, FSDPModule) or not self.placement.reference_on_cpu:
            yield module
            return
        module.to(self.device)
        try:
            yield module
        finally:
            module.to("cpu")

    @torch.no_grad()
    def copy_policy_to_reference(self) -> None:
        """Moving anchor: overwrite the reference weights with the policy's (LoRA: the anchor adapter's)."""
        if self.lora is not None:
            self.lora.refresh_anchor()
            return
        self.reference.load_state_dict(self.policy.state_dict(), strict=True)

    def reference_state(self) -> Dict[str, torch.Tensor]:
        return self.lora.anchor_state() if self.lora is not None else self.reference.state_dict()

    def load_reference_state(self, state: Dict[str, torch.Tensor]) -> None:
        if self.lora is not None:
            self.lora.load_anchor_state(state)
        else:
            self.reference.load_state_dict(state, strict=True)

    # ------------------------------------------------------------------ trainable weights
    def trainable_named_parameters(self) -> List[Tuple[str, torch.nn.Parameter]]:
        return [(n, p) for n, p in self.policy.named_parameters() if p.requires_grad]

    def trainable_state_dict(self) -> Dict[str, torch.Tensor]:
        if self.lora is not None:
            return self.lora.policy_state()
        return {n: p.detach() for n, p in self.trainable_named_parameters()}

    @torch.no_grad()
    def load_trainable_state_dict(self, state: Dict[str, torch.Tensor]) -> None:
        if self.lora is not None:
            self.lora.load_policy_state(state)
            return
        params = dict(self.trainable_named_parameters())
        missing, unexpected = sorted(set(params) - set(state)), sorted(set(state) - set(params))
        if missing or unexpected:
            raise KeyError(f"checkpoint weights do not match the model: missing {missing[:5]}, "
                           f"unexpected {unexpected[:5]}")
        for name, param in params.items():
            param.copy_(state[name])

    def save_extras(self, checkpoint_dir: Path) -> None:
        """What a checkpoint holds beyond the trainable weights: with LoRA the peft adapter folder ``lora/``.

        Call on the main process once the checkpoint directory exists. The folder repeats
        ``transformer/model.safetensors`` in peft's format with its exact config; a checkpoint without it still
        exports and generates (the config then comes from its config.yaml).
        """
        if self.lora is not None:
            self.lora.save_folder(Path(checkpoint_dir) / LORA_DIR)


def build_lora(cfg: LoraOptions, kl_mode: KLMode, policy: torch.nn.Module, master_dtype: torch.dtype) -> LoraTraining:
    """``policy`` frozen with the run's adapters (``--lora_*``; the ``anchor`` too for the moving anchor), in place;
    also what ``python -m sage_grpo.plan --simulate`` builds its LoRA policy with."""
    return LoraTraining.create(
        policy, r=cfg.lora.lora_r, alpha=cfg.lora.lora_alpha, dropout=cfg.lora.lora_dropout, target_modules=cfg.lora.lora_target_modules,
        pretrained_path=cfg.lora.pretrained_lora_path, with_anchor=kl_mode.moving_anchor, seed=cfg.data.seed, dtype=master_dtype)


def build_models(cfg: ModelOptions, kl_mode: KLMode, placement: Placement) -> ModelBundle:
    """The policy, the reference when ``kl_mode`` uses one (see the module docstring), the drift proxy's frozen base
    copy where the run's :class:`~sage_grpo.rl.drift_guard.DriftWatch` needs one, the VAE and the encoder, laid out as
    ``placement`` says (the memory plan's decision: :func:`sage_grpo.plan.memory.placement_of`)."""
    if cfg.lora.use_lora:  # a bad adapter path or target regex fails before the weights load
        check_lora_settings(cfg.lora.lora_r, cfg.lora.lora_alpha, cfg.lora.lora_dropout, cfg.lora.lora_target_modules,
                            cfg.lora.pretrained_lora_path)
    device = resolve_device(cfg)
    load_dtype, master_dtype = DTYPES[cfg.model.dtype], DTYPES[cfg.model.master_weight_type]
    offload_encoders = cfg.parallel.offload_text_encoders and device.type != "cpu"
    # A sharded full fine-tune builds its transformers on the meta device; parallelize_models shards them and
    # ModelBundle.materialize reads each rank's rows (sharded_load.py): no GPU ever holds a whole copy.
    on_meta = is_sharded_run(cfg) and not cfg.lora.use_lora
    components = load_components(cfg.model.pretrained_model_root, cfg.model.pretrained_transformer_version, dtype=load_dtype,
                                 device=device, text_encoder_device="cpu" if offload_encoders else None,
                                 load_transformer=not on_meta,
                                 load_image_encoder=version_task(cfg.model.pretrained_transformer_version) == "i2v")
    folder = Path(cfg.model.pretrained_model_root) / transformer_layout(cfg.model.pretrained_transformer_version).subdir
    policy = transformer_on_meta(folder, master_dtype) if on_meta else components.transformer
    # --mixed_length_attention decided for the training device, for every transformer (a CPU-kept reference too)
    install_joint_attention(policy, cfg.model.attention_backend, split_rows_of(cfg.throughput.mixed_length_attention, device))
    lora = None
    if cfg.lora.use_lora:  # base frozen in --dtype, adapters in the master dtype; no second transformer
        lora = build_lora(cfg, kl_mode, policy, master_dtype)
        reference = policy if kl_mode.uses_reference else None
    else:
        if policy.dtype != master_dtype:
            policy.to(master_dtype)
        policy.requires_grad_(True)
        reference = frozen_transformer(cfg, folder, placement, device, on_meta) if kl_mode.uses_reference else None
    policy.train()
    if cfg.parallel.enable_gradient_checkpointing:
        policy.enable_gradient_checkpointing()
    settings = TextEncoderSettings(max_length=cfg.model.text_max_length or TextEncoderSettings.max_length,
                                   max_length_2=cfg.model.byt5_max_length)
    encoder = PromptEncoder.from_components(components, settings, cache=True,
                                            compute_device=device if offload_encoders else None)
    images = (ImageConditionEncoder(components.image_encoder, components.feature_extractor, components.vae,
                                    compute_device=device if offload_encoders else None,
                                    max_cache_bytes=int(cfg.parallel.image_cache_gb * 2 ** 30))
              if components.image_encoder is not None else None)
    base_copy = drift_watch_of(cfg.drift, cfg.validation.validation_interval, cfg.lora.use_lora, kl_mode).base_copy
    base = frozen_transformer(cfg, folder, placement, device, on_meta) if base_copy else None
    return ModelBundle(cfg.model.pretrained_transformer_version, cfg.rollout.neg_prompt, device, policy, reference,
                       components.vae, encoder, placement, lora,
                       weights_folder=folder if on_meta else None, images=images, base=base)


def frozen_transformer(cfg: FrozenTransformerOptions, folder: Path, placement: Placement, device: torch.device,
                       on_meta: bool) -> torch.nn.Module:
    """A frozen base transformer in ``--dtype`` (the KL reference, the drift proxy's base copy): on the meta device
    for a sharded run (``materialize`` reads its shards), else loaded where ``placement`` keeps the reference."""
    if on_meta:
        model = transformer_on_meta(folder, DTYPES[cfg.model.dtype])
    else:
        model = load_transformer(cfg.model.pretrained_model_root, cfg.model.pretrained_transformer_version, DTYPES[cfg.model.dtype],
                                 "cpu" if placement.reference_on_cpu else device)
    install_joint_attention(model, cfg.model.attention_backend, split_rows_of(cfg.throughput.mixed_length_attention, device))
    model.requires_grad_(False)
    return model.eval()
