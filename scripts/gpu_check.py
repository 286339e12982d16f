"""First check on a new machine (the GPU runbook's ``check`` part): the environment, every module, one tiny pass.

1. prints python, torch (and its CUDA), diffusers, transformers, peft, accelerate and where each was imported from
   (a carried wheel lands in ``/tmp/site``), the device's name, capability and memory, and whether bf16 and the
   flash / memory-efficient / cuDNN SDPA kernels are enabled;
2. imports every module of ``sage_grpo`` and names each one that fails with its error;
3. runs one forward + backward of the tiny HunyuanVideo-1.5 transformer (the real diffusers class, 2 blocks,
   random weights) through ``cfg_velocity`` with CFG, in bf16 on a GPU and fp32 on the CPU, and checks that the
   velocity and the gradients are finite and that the backward reached the input embedding.

Exit status 0 when all three pass, 1 otherwise. ``--device cpu`` runs the same on the CPU (the runner's own test)::

    python scripts/gpu_check.py --device cuda
"""

import argparse
import importlib
import pkgutil
import platform
import sys
import traceback
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

# the input, first block and output: a backward that reaches these crossed the whole network
MUST_GET_GRADIENT = ("x_embedder.proj.weight", "transformer_blocks.0.attn.to_q.weight", "proj_out.weight")
PACKAGES = ("diffusers", "transformers", "peft", "accelerate", "huggingface_hub", "safetensors", "imageio")


def describe_environment(device: torch.device) -> None:
    print(f"python {platform.python_version()} ({sys.executable})")
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}) from {Path(torch.__file__).parent}")
    for name in PACKAGES:
        try:
            module = importlib.import_module(name)
        except ImportError as err:
            print(f"{name}: NOT IMPORTABLE ({err})")
            continue
        print(f"{name} {getattr(module, '__version__', '?')} from {Path(module.__file__).parent}")
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        print(f"device {props.name}: capability {props.major}.{props.minor}, {props.multi_processor_count} SMs, "
              f"{props.total_memory / 2 ** 30:.1f} GiB; bf16 supported {torch.cuda.is_bf16_supported()}")
        print(f"SDPA kernels enabled: flash {torch.backends.cuda.flash_sdp_enabled()}, memory-efficient "
              f"{torch.backends.cuda.mem_efficient_sdp_enabled()}, cuDNN {torch.backends.cuda.cudnn_sdp_enabled()}")
    else:
        print(f"device cpu: {torch.get_num_threads()} threads, capability {torch.backends.cpu.get_cpu_capability()}")


def import_every_module() -> list:
    """Imports each module of sage_grpo; returns the (name, error) of each failure."""
    import sage_grpo

    failures = []
    names = [info.name for info in pkgutil.walk_packages(sage_grpo.__path__, prefix="sage_grpo.")]
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as err:  # report every broken module, not only the first
            failures.append((name, f"{type(err).__name__}: {err}"))
            traceback.print_exc()
    print(f"imported {len(names) - len(failures)} of {len(names)} sage_grpo modules")
    return failures


def tiny_pass(device: torch.device) -> list:
    """One CFG forward + backward of the tiny transformer; returns what went wrong (empty when all is well)."""
    from benchmarks.common import GEOMETRIES, BenchSetup, VelocityCall, build_models, peak_memory_gb

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    geometry = GEOMETRIES["tiny"]
    setup = BenchSetup(geometry, device, dtype, geometry.video, "native", repeats=1, warmup=0, seed=0)
    transformer, vae = build_models(setup)
    call = VelocityCall.build(setup, transformer, vae, batch=2)
    velocity = call.forward()
    call.training_pass()
    grads = {name: p.grad for name, p in transformer.named_parameters() if p.grad is not None}
    # the last block's text-stream output feeds nothing (diffusers drops it), so not every parameter gets one
    no_grad = [name for name in MUST_GET_GRADIENT if name not in grads or not grads[name].abs().sum() > 0]
    bad_grad = [name for name, grad in grads.items() if not torch.isfinite(grad).all()]
    problems = []
    if velocity.shape != call.latents.shape:
        problems.append(f"velocity shape {tuple(velocity.shape)} != latents {tuple(call.latents.shape)}")
    if not torch.isfinite(velocity).all():
        problems.append("the velocity holds non-finite values")
    if no_grad:
        problems.append(f"no non-zero gradient reached {no_grad}")
    if bad_grad:
        problems.append(f"non-finite gradients in {bad_grad[:3]}")
    memory = peak_memory_gb(device)
    print(f"tiny pass on {device} {velocity.dtype}: velocity {tuple(velocity.shape)}, |v| max "
          f"{velocity.float().abs().max().item():.4g}, {len(grads)} parameters with gradients"
          + (f", peak {memory:.3f} GiB" if memory is not None else ""))
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"error: --device {device}: torch {torch.__version__} sees no CUDA device; use --device cpu")
        return 1
    describe_environment(device)
    failures = import_every_module()
    for name, error in failures:
        print(f"IMPORT FAILED {name}: {error}")
    problems = tiny_pass(device)
    for problem in problems:
        print(f"TINY PASS FAILED: {problem}")
    ok = not failures and not problems
    print("check: OK" if ok else "check: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
