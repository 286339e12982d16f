"""Start-up without a full copy of the transformer on any GPU: build it on the meta device, shard it, then read each
rank's own rows of every weight from the safetensors files.

``from_pretrained`` on every rank materialises the whole model on its GPU (16.6 GB in bf16 for the 8.3B transformer),
and the fp32 master cast doubles it (33 GB), before FSDP2 shards anything; with the KL reference that is ~50 GB per
GPU at start-up. Here (FSDP full fine-tune, several processes):

1. :func:`transformer_on_meta` builds the model from its ``config.json`` on the meta device (no memory), in the
   dtype it will be kept in;
2. the caller applies sequence parallelism and ``fully_shard`` (parameters become meta DTensor shards);
3. :func:`load_sharded_weights` allocates only the local shards (``to_empty``) and copies into each the rows this rank
   owns, read through safetensors' lazy slices (``get_slice``: only those rows are read from disk) and cast to the
   shard's dtype.

Every parameter must be found in the files with the model's shape (one error lists all that are not); the result is
exactly what ``from_pretrained`` followed by sharding gives (tested on 2 processes).
"""

from pathlib import Path
from typing import Dict, List, Union

import torch
from torch.distributed.tensor import DTensor

from sage_grpo.safe_io import CheckpointError, read_weight_map

INDEX_FILE = "diffusion_pytorch_model.safetensors.index.json"
SINGLE_FILE = "diffusion_pytorch_model.safetensors"


def weight_files(folder: Union[str, Path]) -> Dict[str, Path]:
    """Tensor name -> safetensors file of a diffusers model folder (single file or sharded with an index)."""
    from safetensors import safe_open

    folder = Path(folder)
    index = folder / INDEX_FILE
    if index.is_file():
        return {name: folder / file for name, file in read_weight_map(index).items()}
    single = folder / SINGLE_FILE
    if not single.is_file():
        raise CheckpointError(f"{folder}: neither {SINGLE_FILE} nor {INDEX_FILE}")
    with safe_open(str(single), framework="pt", device="cpu") as handle:
        return {name: single for name in handle.keys()}


def transformer_on_meta(folder: Union[str, Path], dtype: torch.dtype):
    """The HunyuanVideo-1.5 transformer of ``folder``'s ``config.json`` on the meta device, in ``dtype``, with this
    project's joint attention installed (as :func:`~sage_grpo.models.loading.load_transformer` gives it)."""
    from diffusers import HunyuanVideo15Transformer3DModel

    from sage_grpo.models.attention import install_joint_attention

    config = HunyuanVideo15Transformer3DModel.load_config(str(folder), local_files_only=True)
    with torch.device("meta"):
        model = HunyuanVideo15Transformer3DModel.from_config(config).to(dtype)
    install_joint_attention(model)
    model.eval()
    return model


def _local_rows(param: torch.Tensor):
    """(local tensor to fill, index of the full tensor it holds) of a parameter or DTensor shard."""
    if not isinstance(param, DTensor):
        return param, tuple(slice(0, n) for n in param.shape)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    return param.to_local(), tuple(slice(o, o + n) for o, n in zip(offset, shape))


@torch.no_grad()
def load_sharded_weights(model: torch.nn.Module, folder: Union[str, Path], device: Union[str, torch.device]) -> None:
    """Allocate ``model``'s (sharded) parameters on ``device`` and fill each with its rows of ``folder``'s weights."""
    from safetensors import safe_open

    files = weight_files(folder)
    params = dict(model.named_parameters())
    problems: List[str] = [f"{name}: not in the weight files" for name in params if name not in files]
    by_file: Dict[Path, List[str]] = {}
    for name in params:
        if name in files:
            by_file.setdefault(files[name], []).append(name)
    model.to_empty(device=device)
    params = dict(model.named_parameters())  # to_empty may replace the parameter objects
    for path, names in by_file.items():
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            for name in names:
                source = handle.get_slice(name)
                param = params[name]
                if tuple(source.get_shape()) != tuple(param.shape):
                    problems.append(f"{name}: {tuple(source.get_shape())} in {path.name}, {tuple(param.shape)} in "
                                    "the model")
                    continue
                local, index = _local_rows(param)
                if local.numel():
                    local.copy_(source[index].to(local.dtype))
    if problems:
        raise CheckpointError(f"{folder}: the weights do not fit the model: " + "; ".join(problems[:10])
                              + (f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""))
