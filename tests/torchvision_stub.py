"""A stand-in ``torchvision`` package, so transformers' ``Qwen2VLVideoProcessor`` (which imports torchvision) can run
on this machine, where the torchvision wheel cannot be imported.

It provides only what the processor's import chain names and its tensor path calls: ``resize`` is what torchvision's
v2 ``resize`` does to a tensor (``torch.nn.functional.interpolate`` with ``antialias``; a uint8 tensor computed in
float, rounded and clamped back), ``normalize`` the per-channel ``(x - mean) / std`` and ``grayscale_to_rgb`` the
channel repeat. Everything else the import chain names raises when called, so a test that reached an unexpected
torchvision path fails instead of passing on a stub. Use it in a subprocess only (``PYTHONPATH``): transformers
caches whether torchvision is available, and the test process must keep seeing the truth.
"""

from pathlib import Path

_FUNCTIONAL = '''
import enum

import torch


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


def resize(image, size, interpolation=InterpolationMode.BILINEAR, max_size=None, antialias=True):
    frames = image.reshape(-1, *image.shape[-3:])
    out = torch.nn.functional.interpolate(frames.float(), size=list(size), mode=interpolation.value,
                                          align_corners=False, antialias=antialias)
    if image.dtype == torch.uint8:
        out = out.round_().clamp_(0, 255).to(torch.uint8)
    return out.reshape(*image.shape[:-2], *out.shape[-2:])


def normalize(image, mean, std, inplace=False):
    mean = torch.as_tensor(mean, dtype=image.dtype, device=image.device).view(-1, 1, 1)
    std = torch.as_tensor(std, dtype=image.dtype, device=image.device).view(-1, 1, 1)
    return (image - mean) / std


def grayscale_to_rgb(image):
    return image if image.shape[-3] == 3 else image.expand(*image.shape[:-3], 3, *image.shape[-2:])
'''

_FILES = {
    "torchvision-0.28.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: torchvision\nVersion: 0.28.0\n",
    "torchvision-0.28.0.dist-info/top_level.txt": "torchvision\n",
    "torchvision/__init__.py": '__version__ = "0.28.0"\nfrom . import io, transforms\n',
    "torchvision/io.py": "",
    "torchvision/transforms/__init__.py": "from . import functional, v2\nfrom .v2.functional import InterpolationMode\n",
    "torchvision/transforms/functional.py": ("def pil_to_tensor(*args, **kwargs):\n"
                                             "    raise NotImplementedError('not part of the torchvision stub')\n"),
    "torchvision/transforms/v2/__init__.py": "from . import functional\n",
    "torchvision/transforms/v2/functional.py": _FUNCTIONAL,
}


def write_torchvision_stub(folder: Path) -> Path:
    """Write the stub package under ``folder`` (put ``folder`` on ``PYTHONPATH``) and return ``folder``."""
    for name, text in _FILES.items():
        path = Path(folder) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return Path(folder)
