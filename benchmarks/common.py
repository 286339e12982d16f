"""What the benchmarks (``benchmarks/benchmark_*.py``) share: models of the real classes at a chosen geometry, synthetic
conditioning of the real shapes, the analytic FLOP count of the transformer, device flags and timing.

Geometries (:data:`GEOMETRIES`):

* ``tiny``: the test checkpoint's configs (``sage_grpo.models.tiny``), 2 blocks of width 16;
* ``toy``: the toy world's (``sage_grpo.studies.pretrain``), 2 blocks of width 64;
* ``real``: HunyuanVideo-1.5's ``480p_t2v`` transformer (54 dual-stream blocks, hidden 2048 = 16 heads x 128, MLP
  ratio 4, 2 refiner layers, Qwen2.5-VL 3584-wide text, byT5 1472-wide glyphs, SigLIP 1152-wide image slots; 8.33B
  parameters) with 1000 MLLM + 256 byT5 + 729 image text slots, at the reference launch's 81 x 352 x 624 rollout
  (21 x 22 x 39 = 18,018 latent tokens).

``tiny`` and ``toy`` are written as a checkpoint with :func:`~sage_grpo.models.write_tiny_hunyuan` (random weights)
into a temporary directory and loaded as the trainer loads one. ``real`` is built directly on the device by
:func:`build_models` (8.33B parameters: only on a GPU; on the CPU it needs ``--blocks N`` to cut its depth), with a
stand-in VAE of the real class with the real latent channels and compression ratios but narrow layers (the transformer
benchmarks take only the latent shape from it). The scripts that run the trainer or ``generate.py`` write ``real`` as
a checkpoint with :func:`~sage_grpo.models.real_width.write_real_width_hunyuan` (``--vae real``: the released VAE
configuration, so decodes cost what they cost; ``--vae narrow``: the stand-in), or take one already written
(``--checkpoint_root``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional, Tuple

import torch

from sage_grpo.dtypes import DTYPES
from sage_grpo.models.real_width import NARROW_VAE_CONFIG, REAL_TRANSFORMER_CONFIG, VAE_CONFIGS
from sage_grpo.models.text_encoding import PromptEmbeds
from sage_grpo.models.tiny import TINY_TRANSFORMER_CONFIG, TINY_VAE_CONFIG
from sage_grpo.studies.pretrain import TOY_TRANSFORMER_CONFIG, TOY_VAE_CONFIG

# HunyuanVideo-1.5 480p_t2v's transformer; the real VAE's latent channels and ratios on narrow layers (a shape source)
REAL_SHAPE_VAE_CONFIG: Dict = NARROW_VAE_CONFIG
REFINER_MLP_RATIO = 4.0  # diffusers' token refiner blocks use a fixed MLP ratio, whatever mlp_ratio says
BYT5_HIDDEN = 2048  # the byT5 projection's hidden width, hard-coded in diffusers
TIMESTEP_CHANNELS = 256  # sinusoidal timestep features before the timestep MLPs


@dataclass(frozen=True)
class Geometry:
    """A model size and the conditioning and video it runs on."""

    name: str
    transformer_config: Dict
    vae_config: Dict
    text_slots: Tuple[int, int]  # (MLLM, byT5) padded lengths
    num_image_tokens: int  # zero SigLIP slots of a t2v call
    prompt_valid: Tuple[int, int]  # valid (MLLM, byT5) tokens of the positive prompt
    negative_valid: Tuple[int, int]  # ... of the negative prompt ("")
    video: Tuple[int, int, int]  # (frames, height, width)
    build_on_device: bool = False  # build_models creates it on the device instead of loading a written checkpoint

    def with_blocks(self, num_layers: Optional[int]) -> "Geometry":
        if num_layers is None:
            return self
        if num_layers < 1:
            raise ValueError(f"--blocks must be >= 1 (e.g. --blocks 1), got {num_layers}")
        return replace(self, transformer_config={**self.transformer_config, "num_layers": num_layers})

    @property
    def num_layers(self) -> int:
        return self.transformer_config["num_layers"]


GEOMETRIES: Dict[str, Geometry] = {
    "tiny": Geometry("tiny", TINY_TRANSFORMER_CONFIG, TINY_VAE_CONFIG, (16, 8), 4, (8, 4), (3, 0), (5, 16, 16)),
    "toy": Geometry("toy", TOY_TRANSFORMER_CONFIG, TOY_VAE_CONFIG, (16, 2), 4, (8, 1), (3, 0), (9, 16, 16)),
    "real": Geometry("real", REAL_TRANSFORMER_CONFIG, REAL_SHAPE_VAE_CONFIG, (1000, 256), 729, (200, 16), (8, 0),
                     (81, 352, 624), build_on_device=True),
}


# Our joint attention's backends worth timing on each device type (sage_grpo.models.attention checks each one).
CPU_BACKENDS = ("native", "_native_math")
GPU_BACKENDS = CPU_BACKENDS + ("_native_efficient", "_native_cudnn", "_native_flash", "flash", "flash_varlen",
                               "_flash_3", "_flash_varlen_3", "sage", "sage_varlen", "xformers")


def usable_backends(requested: Optional[str], device: torch.device) -> Tuple[list, Dict[str, str]]:
    """(usable, {skipped: why}) of the comma-separated ``requested`` backends, or of the device's candidates; a
    requested backend that is unusable is an error."""
    from sage_grpo.models.attention import check_attention_backend

    names = requested.split(",") if requested else (GPU_BACKENDS if device.type == "cuda" else CPU_BACKENDS)
    usable, skipped = [], {}
    for name in names:
        try:
            check_attention_backend(name)
            usable.append(name)
        except ValueError as err:
            if requested:
                raise SystemExit(f"error: --backends {name}: {err}") from None
            skipped[name] = str(err).splitlines()[0]
    return usable, skipped


# ---------------------------------------------------------------------------------------------------- flags
def add_model_args(parser: argparse.ArgumentParser, geometry: str = "tiny") -> None:
    """The flags every benchmark takes: geometry, depth, video size, device, dtype, backend, repeats, threads."""
    parser.add_argument("--geometry", choices=tuple(GEOMETRIES), default=geometry,
                        help="model size: tiny/toy checkpoints of the real classes, or real (GPU; CPU with --blocks)")
    parser.add_argument("--blocks", type=int, default=None, help="dual-stream blocks (default: the geometry's)")
    parser.add_argument("--frames", type=int, default=None, help="video frames (default: the geometry's)")
    parser.add_argument("--height", type=int, default=None, help="video height in pixels (default: the geometry's)")
    parser.add_argument("--width", type=int, default=None, help="video width in pixels (default: the geometry's)")
    parser.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: cuda when available)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default=None,
                        help="weights and compute dtype (default: bf16 on a GPU, fp32 on the CPU)")
    parser.add_argument("--attention_backend", default="native", help="our joint attention's backend")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs; the best is reported")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)


@dataclass(frozen=True)
class BenchSetup:
    """The parsed model flags."""

    geometry: Geometry
    device: torch.device
    dtype: torch.dtype
    video: Tuple[int, int, int]
    attention_backend: str
    repeats: int
    warmup: int
    seed: int

    def describe(self) -> str:
        config = self.geometry.transformer_config
        hidden = config["num_attention_heads"] * config["attention_head_dim"]
        frames, height, width = self.video
        return (f"geometry {self.geometry.name}: {self.geometry.num_layers} blocks, hidden {hidden}, "
                f"{image_tokens(self.geometry, self.video)} video tokens ({frames}x{height}x{width}), "
                f"{self.device} {dtype_name(self.dtype)}, {torch.get_num_threads()} CPU threads")


def dtype_name(dtype: torch.dtype) -> str:
    return next(name for name, value in DTYPES.items() if value == dtype)


def setup_from_args(args: argparse.Namespace) -> BenchSetup:
    """Checks the flags (``real`` on the CPU only with ``--blocks``) and resolves the defaults."""
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"error: --device {device}: no CUDA device is available here; use --device cpu")
    geometry = GEOMETRIES[args.geometry]
    written = getattr(args, "checkpoint_root", None)  # its configs, not --blocks, set the depth
    if geometry.name == "real" and device.type == "cpu" and args.blocks is None and not written:
        raise SystemExit("error: --geometry real on the CPU: the full 54-block, 8.33B-parameter transformer is built "
                         "on GPUs only; pass --blocks N (e.g. --blocks 1) to cut its depth, or use --geometry toy")
    if args.repeats < 1 or args.warmup < 0:
        raise SystemExit(f"error: --repeats must be >= 1 and --warmup >= 0, got {args.repeats} and {args.warmup}")
    try:
        geometry = geometry.with_blocks(args.blocks)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    video = tuple(given if given is not None else default
                  for given, default in zip((args.frames, args.height, args.width), geometry.video))
    dtype = DTYPES[args.dtype] if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    return BenchSetup(geometry, device, dtype, video, args.attention_backend, args.repeats, args.warmup, args.seed)


# ---------------------------------------------------------------------------------------------------- models
def add_checkpoint_args(parser: argparse.ArgumentParser) -> None:
    """The flags of the scripts that load a written checkpoint (the trainer, ``generate.py``)."""
    parser.add_argument("--vae", choices=tuple(VAE_CONFIGS), default="real",
                        help="VAE of the real geometry's checkpoint: the released configuration (real) or the narrow "
                             "stand-in with its latent shapes (narrow: CPU tests)")
    parser.add_argument("--checkpoint_root", default=None,
                        help="use this written checkpoint (e.g. scripts/make_tiny_checkpoint.py --real_width_blocks "
                             "N) instead of writing one; its configs replace the geometry's")


def checkpoint_geometry(geometry: Geometry, args: argparse.Namespace) -> Geometry:
    """``geometry`` with the VAE of ``--vae`` (real only) or, with ``--checkpoint_root``, the configs written there."""
    from sage_grpo.models import layout

    if args.checkpoint_root:
        root = Path(args.checkpoint_root)
        files = (root / layout.transformer_layout(layout.DEFAULT_TRANSFORMER_VERSION).subdir / "config.json",
                 root / layout.VAE.subdir / "config.json")
        missing = [str(path) for path in files if not path.is_file()]
        if missing:
            raise SystemExit(f"error: --checkpoint_root {root}: missing {', '.join(missing)}; write one with "
                             "scripts/make_tiny_checkpoint.py --real_width_blocks N --output DIR")
        transformer, vae = (json.loads(path.read_text()) for path in files)
        return replace(geometry, transformer_config=transformer, vae_config=vae)
    if geometry.name == "real":
        return replace(geometry, vae_config=VAE_CONFIGS[args.vae])
    return geometry


@contextlib.contextmanager
def checkpoint(geometry: Geometry, seed: int = 0, root: Optional[str] = None) -> Iterator[Path]:
    """``root`` when given, else a random-weight checkpoint of ``geometry`` in a temporary directory, deleted
    afterwards: tiny and toy with :func:`~sage_grpo.models.write_tiny_hunyuan` (fp32), real with
    :func:`~sage_grpo.models.real_width.write_real_width_hunyuan` (bf16, its VAE and depth, the tiny VideoReward)."""
    from sage_grpo.models import write_tiny_hunyuan
    from sage_grpo.models.real_width import write_real_width_hunyuan
    from sage_grpo.rewards.tiny import write_tiny_video_reward

    if root is not None:
        yield Path(root)
        return
    with tempfile.TemporaryDirectory(prefix=f"bench_{geometry.name}_") as tmp:
        if geometry.name == "real":
            root = write_real_width_hunyuan(Path(tmp) / "ckpt", num_layers=geometry.num_layers, seed=seed,
                                            transformer_config=geometry.transformer_config,
                                            vae_config=geometry.vae_config)
            write_tiny_video_reward(root, seed=seed)
            yield root
        else:
            yield write_tiny_hunyuan(Path(tmp) / "ckpt", seed=seed, dtype=torch.float32,
                                     transformer_config=geometry.transformer_config, vae_config=geometry.vae_config)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_models(setup: BenchSetup) -> Tuple[torch.nn.Module, torch.nn.Module]:
    """(transformer, vae) of the setup's geometry on its device and dtype, joint attention on ``attention_backend``.

    tiny/toy: written as a checkpoint and loaded with the trainer's loader; real: random weights created directly on
    the device in the target dtype (no full fp32 copy), and the shape-only VAE."""
    from diffusers import AutoencoderKLHunyuanVideo15, HunyuanVideo15Transformer3DModel

    from sage_grpo.models import load_components
    from sage_grpo.models.attention import install_joint_attention

    geometry = setup.geometry
    if not geometry.build_on_device:
        with checkpoint(geometry, setup.seed) as root:
            parts = load_components(root, dtype=setup.dtype, device=setup.device, load_text_encoders=False)
        transformer, vae = parts.transformer, parts.vae
    else:
        devices = [setup.device] if setup.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, device_type=setup.device.type), setup.device, \
                _default_dtype(setup.dtype):
            torch.manual_seed(setup.seed)
            transformer = HunyuanVideo15Transformer3DModel(**geometry.transformer_config)
            vae = AutoencoderKLHunyuanVideo15(**geometry.vae_config).eval().requires_grad_(False)
    install_joint_attention(transformer, setup.attention_backend)
    return transformer, vae


def synthetic_embeds(geometry: Geometry, batch: int, device, dtype: torch.dtype, seed: int = 0) -> PromptEmbeds:
    """Random prompt embeddings of the geometry's widths and slot counts with valid-first masks of its valid
    lengths (what the text encoders give, without them: the benchmarks time the transformer)."""
    config = geometry.transformer_config
    generator = torch.Generator().manual_seed(seed)
    (slots_1, slots_2), widths = geometry.text_slots, (config["text_embed_dim"], config["text_embed_2_dim"])

    def stream(slots: int, width: int, valid: int):
        embeds = torch.randn(batch, slots, width, generator=generator)
        mask = (torch.arange(slots) < valid).long().expand(batch, slots).clone()
        return embeds.to(device, dtype), mask.to(device)

    positive = [*stream(slots_1, widths[0], geometry.prompt_valid[0]),
                *stream(slots_2, widths[1], geometry.prompt_valid[1])]
    negative = [*stream(slots_1, widths[0], geometry.negative_valid[0]),
                *stream(slots_2, widths[1], geometry.negative_valid[1])]
    return PromptEmbeds(*positive, *negative)


def image_tokens(geometry: Geometry, video: Tuple[int, int, int]) -> int:
    from sage_grpo.models.geometry import video_tokens

    return video_tokens(geometry.vae_config, geometry.transformer_config, *video)


def text_tokens(geometry: Geometry, valid: Tuple[int, int], *, trimmed: bool) -> int:
    """Text tokens entering the dual-stream blocks: every slot (diffusers' processor), or the valid ones (ours)."""
    if trimmed:
        return sum(valid)  # t2v: the zero image slots are never valid
    return sum(geometry.text_slots) + geometry.num_image_tokens


# ---------------------------------------------------------------------------------------------------- FLOPs
def transformer_flops(config: Dict, num_image_tokens: int, text_slots: Tuple[int, int], num_siglip_slots: int,
                      block_text_tokens: int, sp: int = 1) -> int:
    """Forward FLOPs of one sample through ``HunyuanVideo15Transformer3DModel`` (a multiply-add counts 2), counted
    from the configuration: matmuls and attention only (norms, activations and RoPE are a few % at most).

    With d = hidden, r = mlp_ratio, N image tokens, L the text tokens in the blocks and S = N + L:

    * per dual-stream block: 2·(N + L)·(4 + 2r)·d² (QKV, output and the two-layer MLP of each stream) +
      4·S²·d (Q·Kᵀ and P·V over the joint sequence) + 2·2·6d² (the per-sample adaLN modulations);
    * the token refiner on the L1 MLLM slots: 2·L1·D1·d (input projection) and per refiner layer
      2·L1·(4 + 2·4)·d² + 4·L1²·d;
    * byT5 projection 2·L2·(D2·2048 + 2048² + 2048·d), image projection 2·L3·(Di² + Di·d), patch embedding
      2·N·c_in·d, output projection 2·N·d·c_out, and the per-sample timestep/pooled-text MLPs.

    A training step (forward + backward) is 3x the forward; activation checkpointing adds one block forward more,
    which :func:`model_flops` leaves out (the MFU convention counts the model's FLOPs, not the recompute).

    ``sp`` > 1: one rank of Ulysses sequence parallelism (``sage_grpo/distributed/sequence_parallel.py``), which
    holds N/sp image tokens in the streams and the output projection, and attends over the whole S with H/sp heads
    (4·S²·d/sp); the patch embedding runs on all N tokens before the split, the text side is replicated.
    """
    d = config["num_attention_heads"] * config["attention_head_dim"]
    r = config["mlp_ratio"]
    patch = config["patch_size_t"] * config["patch_size"] ** 2
    n, (l1, l2), l3 = num_image_tokens, text_slots, num_siglip_slots
    s, local = n + block_text_tokens, num_image_tokens // sp + block_text_tokens
    block = 2 * local * (4 + 2 * r) * d * d + 4 * s * s * d // sp + 24 * d * d
    refiner = 2 * l1 * (4 + 2 * REFINER_MLP_RATIO) * d * d + 4 * l1 * l1 * d + 2 * 2 * d * d
    embed = (2 * l1 * config["text_embed_dim"] * d
             + 2 * l2 * (config["text_embed_2_dim"] * BYT5_HIDDEN + BYT5_HIDDEN ** 2 + BYT5_HIDDEN * d)
             + 2 * l3 * (config["image_embed_dim"] ** 2 + config["image_embed_dim"] * d)
             + 2 * n * config["in_channels"] * patch * d
             + 2 * (n // sp) * d * config["out_channels"] * patch
             + 2 * 2 * (TIMESTEP_CHANNELS * d + d * d)  # timestep MLPs (block conditioning and refiner)
             + 2 * (config["text_embed_dim"] * d + d * d)  # pooled-text MLP
             + 2 * d * 2 * d)  # final adaLN
    return int(config["num_layers"] * block + config["num_refiner_layers"] * refiner + embed)


def model_flops(geometry: Geometry, video: Tuple[int, int, int], batch: int, *, trimmed: bool = True,
                backward: bool = True, sp: int = 1) -> int:
    """FLOPs of a (B,) forward (+ backward: x3) of the geometry's transformer on ``video`` with the synthetic
    prompts' valid lengths (B/2 positive, B/2 negative rows when B is even, as a CFG call), on one of ``sp`` SP
    ranks."""
    rows = [geometry.prompt_valid] * (batch - batch // 2) + [geometry.negative_valid] * (batch // 2)
    longest = max(rows, key=sum)
    total = sum(transformer_flops(geometry.transformer_config, image_tokens(geometry, video), geometry.text_slots,
                                  geometry.num_image_tokens, text_tokens(geometry, longest, trimmed=trimmed), sp)
                for _ in rows)
    return 3 * total if backward else total


# The dense bf16 tensor-core peaks of known accelerators (NVIDIA datasheets), matched against the device name.
PEAK_BF16_TFLOPS = (("H100 PCIe", 756.0), ("H100", 989.0), ("H200", 989.0), ("H800", 989.0), ("A100", 312.0),
                    ("A800", 312.0))


def peak_tflops(device: torch.device, override: Optional[float] = None) -> Optional[float]:
    """The device's dense bf16 peak: ``override`` when given, else the table's entry for a known GPU, else None
    (the CPU, an unknown GPU)."""
    if override is not None:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_TFLOPS if key in name), None)


# ---------------------------------------------------------------------------------------------------- timing
def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_time(fn: Callable[[], object], setup: BenchSetup) -> float:
    """Seconds of the fastest of ``repeats`` calls of ``fn`` after ``warmup`` untimed ones, the device synchronized
    around each."""
    for _ in range(setup.warmup):
        fn()
    best = float("inf")
    for _ in range(setup.repeats):
        synchronize(setup.device)
        start = time.perf_counter()
        fn()
        synchronize(setup.device)
        best = min(best, time.perf_counter() - start)
    return best


def peak_memory_gb(device: torch.device) -> Optional[float]:
    return torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else None


# ---------------------------------------------------------------------------------------------------- one pass
@dataclass
class VelocityCall:
    """The inputs of one ``cfg_velocity`` call on ``batch`` samples: seeded latents of the setup's video at
    timestep 700 and synthetic prompts; :meth:`forward` gives the velocity, :meth:`training_pass` adds the backward
    of a scalar of it (as a policy-update replay does)."""

    transformer: torch.nn.Module
    latents: torch.Tensor  # (B, C, T, h, w)
    timesteps: torch.Tensor  # (B,)
    embeds: PromptEmbeds
    guidance_scale: float
    num_image_tokens: int

    @classmethod
    def build(cls, setup: BenchSetup, transformer, vae, batch: int, guidance_scale: float = 6.0) -> "VelocityCall":
        from sage_grpo.pipeline import latent_shape

        generator = torch.Generator().manual_seed(setup.seed)
        latents = torch.randn(batch, *latent_shape(vae.config, *setup.video), generator=generator)
        return cls(transformer, latents.to(setup.device), torch.full((batch,), 700.0, device=setup.device),
                   synthetic_embeds(setup.geometry, batch, setup.device, setup.dtype, setup.seed), guidance_scale,
                   setup.geometry.num_image_tokens)

    @property
    def rows(self) -> int:
        """Rows of the transformer's batch: 2B with CFG (negative and positive prompts), else B."""
        return self.latents.shape[0] * (2 if self.guidance_scale > 1.0 else 1)

    def forward(self) -> torch.Tensor:
        from sage_grpo.pipeline import cfg_velocity

        return cfg_velocity(self.transformer, self.latents, self.timesteps, self.embeds, self.guidance_scale,
                            num_image_tokens=self.num_image_tokens)

    def training_pass(self) -> None:
        self.transformer.zero_grad(set_to_none=True)
        self.forward().square().mean().backward()

    def flops(self, setup: BenchSetup, *, trimmed: bool = True, sp: int = 1) -> int:
        """Model FLOPs of :meth:`training_pass` on one of ``sp`` SP ranks (analytic, see :func:`model_flops`)."""
        if self.guidance_scale > 1.0:
            return model_flops(setup.geometry, setup.video, self.rows, trimmed=trimmed, sp=sp)
        positive = replace(setup.geometry, negative_valid=setup.geometry.prompt_valid)
        return model_flops(positive, setup.video, self.rows, trimmed=trimmed, sp=sp)
