"""Whether the weights alone can fit the machine, asked before any model is built: the memory planner counts every
model's parameters on the meta device (:func:`sage_grpo.plan.sizes.read_model_sizes`, from the model root's configs)
and a launch whose weights cannot fit is refused in one line naming the config file, its size fields and the figure.

Conservative: only what cannot fit is refused (the memory plan, ``python -m sage_grpo.plan``, judges the rest on
GPUs). Each model counts once, in the dtype it loads in (``--dtype``; the KL reference's copy, gradients, optimizer
state and activations are not counted), against:

* **RAM** (every command, every device): a model is read into host memory when it loads (``from_pretrained``), so no
  single model may exceed the machine's RAM, and on a CPU device, where every model stays in host memory, nor may
  their sum. RAM is the physical memory (``os.sysconf``), or the process's cgroup limit when that is lower; swap is
  not counted; per process (several processes of a CPU launch each hold their own models).
* **GPU memory** (the trainer on CUDA): the trained transformer lives on the GPUs, sharded by FSDP over the world
  (``world size / --dp_replicate`` shards; one GPU holds it whole without FSDP or on one process), so its weights
  over the shards may not exceed one GPU (``--gpu_memory_gb``, else the device's). ``--ignore_memory_plan`` does not
  pass this check: no placement makes such weights fit.
"""

from pathlib import Path
from typing import List, Optional, Tuple

from sage_grpo.config import ConfigError
from sage_grpo.dtypes import DTYPES
from sage_grpo.plan.breakdown import GIB
from sage_grpo.plan.options import PlanOptions
from sage_grpo.plan.sizes import ModelSizes, read_model_sizes

# The fields each model's size grows with, named in the message (dotted: inside a section).
SIZE_FIELDS = {
    "transformer": ("num_layers", "num_attention_heads", "attention_head_dim", "mlp_ratio"),
    "vae": ("block_out_channels", "layers_per_block"),
    "text_encoder": ("num_hidden_layers", "hidden_size", "intermediate_size", "vocab_size"),
    "text_encoder_2": ("num_layers", "d_model", "d_ff", "vocab_size"),
    "reward": ("num_hidden_layers", "hidden_size", "intermediate_size", "text_config.num_hidden_layers",
               "text_config.hidden_size", "vision_config.depth", "vision_config.embed_dim"),
}
FIX = "use the model's released config.json (bash download_weights.sh), or a machine with more memory"


def host_memory_bytes() -> int:
    """The machine's RAM: physical memory, or this process's cgroup limit (v2, else v1) when lower."""
    import os

    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def model_weights(sizes: ModelSizes) -> List[Tuple[str, int]]:
    """(component, parameters) of every model ``sizes`` counts from a config of the model root, largest first (a
    component the root lacks is the layout check's to report, not counted at its released size here)."""
    models = [("transformer", sizes.transformer.num_params), ("vae", sizes.vae_params),
              ("text_encoder", sizes.text_encoder_params), ("text_encoder_2", sizes.byt5_params),
              ("reward", sizes.reward_params)]
    return sorted(((name, params) for name, params in models
                   if params and Path(sizes.sources.get(name, "")).is_file()), key=lambda item: -item[1])


def describe(sizes: ModelSizes, component: str) -> str:
    """``<config file>: num_layers 54, ...`` of ``component`` (the released config when the root has none)."""
    from sage_grpo.models.config_fields import read_model_config

    source = sizes.sources.get(component, "released config")
    if component == "transformer":
        config = sizes.transformer.config
    elif component == "vae":
        config = sizes.vae_config
    else:
        config = read_model_config(source, "reward_base" if component == "reward" else component) \
            if Path(source).is_file() else {}
    shown = []
    for field in SIZE_FIELDS[component]:
        section, _, key = field.rpartition(".")
        value = (config.get(section) or {}).get(key) if section else config.get(key)
        if value is not None:
            shown.append(f"{field} {list(value) if isinstance(value, tuple) else value}")
    return f"{source}: {', '.join(shown)}" if shown else source


def check_weights_fit(sizes: ModelSizes, dtype_bytes: int, device_type: str, ram_bytes: int,
                      gpu_gib: Optional[float] = None, shards: int = 1) -> None:
    """The rules of the module docstring; a ``ConfigError`` line when the weights cannot fit."""
    name = {2: "bf16", 4: "fp32"}.get(dtype_bytes, f"{dtype_bytes}-byte")
    weights = model_weights(sizes)
    ram = ram_bytes / GIB
    for component, params in weights:
        if params * dtype_bytes > ram_bytes:
            _refuse(f"{describe(sizes, component)} give the {component} {params / 1e9:.2f}B parameters, "
                    f"{params * dtype_bytes / GIB:.1f} GB in {name}, more than this machine's {ram:.1f} GB of RAM, "
                    "which holds it while it loads")
    total = sum(params for _, params in weights) * dtype_bytes
    if device_type == "cpu" and total > ram_bytes:
        parts = ", ".join(f"{component} {params * dtype_bytes / GIB:.1f} GB" for component, params in weights)
        _refuse(f"the models of a CPU run stay in RAM: {parts} in {name}, {total / GIB:.1f} GB together, more than "
                f"this machine's {ram:.1f} GB; the largest: {describe(sizes, weights[0][0])}")
    transformer = sizes.transformer.num_params * dtype_bytes
    counted = any(component == "transformer" for component, _ in weights)
    if counted and device_type == "cuda" and gpu_gib is not None and transformer / shards > gpu_gib * GIB:
        _refuse(f"{describe(sizes, 'transformer')} give the transformer {sizes.transformer.num_params / 1e9:.2f}B "
                f"parameters, {transformer / GIB:.1f} GB in {name}, {transformer / shards / GIB:.1f} GB per GPU over "
                f"{shards} FSDP shard(s), more than the GPU's {gpu_gib:.1f} GB (--gpu_memory_gb or the device's); "
                "more processes shard it further (torchrun --nproc_per_node, --enable_fsdp true)")


def _refuse(message: str) -> None:
    raise ConfigError(f"[weights-fit] {message} (the memory planner's count: python -m sage_grpo.plan). Fix: {FIX}.")


def _root_sizes(root, version: str, with_reward: bool) -> Optional[ModelSizes]:
    """The planner's sizes of the models under ``root``; None when a video model's config is missing (the layout
    check names every missing file, and nothing is built at a released size meanwhile). The reward is counted when
    its folder is complete."""
    from sage_grpo.models import layout

    components = [layout.transformer_layout(version), layout.VAE, layout.TEXT_ENCODER, layout.TEXT_ENCODER_2]
    if not all((Path(root) / component.subdir / "config.json").is_file() for component in components):
        return None
    if with_reward:
        from sage_grpo.rewards.videoalign_checkpoint import resolve_checkpoint

        try:
            resolve_checkpoint(root)  # model_config.json and the base model's config, checked as they are read
        except FileNotFoundError:  # the reward's build names what is missing
            with_reward = False
        except ValueError as err:  # a bad model_config.json or base config: one line naming it
            raise ConfigError(str(err)) from None
    return read_model_sizes(str(root), version, with_reward)


def check_train_weights_fit(cfg: PlanOptions) -> None:
    """``post_train.py``'s check, before any model loads (its configs' fields are checked as they are read)."""
    from sage_grpo.models.bundle import resolve_device
    from sage_grpo.plan.memory import device_memory_gib, launch_world_size
    from sage_grpo.plan.scorers import needs_videoalign

    sizes = _root_sizes(cfg.model.pretrained_model_root, cfg.model.pretrained_transformer_version,
                        needs_videoalign(cfg))
    if sizes is None:
        return
    device = resolve_device(cfg).type
    world = launch_world_size()
    shards = world // cfg.parallel.dp_replicate if cfg.parallel.enable_fsdp and world > 1 else 1
    check_weights_fit(sizes, DTYPES[cfg.model.dtype].itemsize, device, host_memory_bytes(),
                      device_memory_gib(cfg) if device == "cuda" else None, shards)


def check_generate_weights_fit(model_path: str, transformer_version: str, dtype: str, device_type: str) -> None:
    """``generate.py``'s check: the transformer, the VAE and the text encoders against the RAM (with offloading, and
    group offloading of the transformer's blocks, no model has to fit the GPU whole)."""
    sizes = _root_sizes(model_path, transformer_version, False)
    if sizes is not None:
        check_weights_fit(sizes, DTYPES[dtype].itemsize, "cpu" if device_type == "cpu" else "host",
                          host_memory_bytes())
