"""Time one training pass of the transformer (forward + backward, as the policy update's replay calls it) with
activation checkpointing off and on, and report the achieved TFLOP/s and the MFU against the device's bf16 peak
(issue 13, item 8).

    python scripts/benchmark_transformer.py [--geometry toy] [--batch 1] [--checkpointing both|on|off]
    python scripts/benchmark_transformer.py --geometry real --device cuda --dtype bf16     # GPU, real width

One pass is ``cfg_velocity`` on ``--batch`` samples with CFG (a 2B-row forward: negative and positive prompts) and the
backward of a scalar of the velocity, on synthetic prompt embeddings of the geometry's shapes, through our joint
attention (text trimmed to the longest valid length). The weights are the ``--dtype`` (bf16 on a GPU) with gradients.

FLOPs are counted analytically from the configuration (``sage_grpo.bench.transformer_flops``: per block
2·(N + L)·(4 + 2r)·d² for the matmuls plus 4·S²·d for attention, plus the embedders; forward + backward = 3x the
forward; tests/test_bench.py checks the count against ``torch.utils.flop_counter.FlopCounterMode``). The recompute
of checkpointing is not counted (model FLOPs, as MFU is usually quoted). MFU uses ``--peak_tflops`` or the known
peak of the GPU (H100 SXM / H200 989, H100 PCIe 756, A100 312 dense bf16 TFLOP/s); on the CPU only TFLOP/s is printed.
A setting that runs out of GPU memory prints ``out of memory`` and the others still run.
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sage_grpo import bench  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    bench.add_model_args(parser, geometry="toy")
    parser.add_argument("--batch", type=int, default=1, help="samples per pass (2x rows with CFG)")
    parser.add_argument("--checkpointing", choices=("both", "off", "on"), default="both",
                        help="activation checkpointing of the dual-stream blocks")
    parser.add_argument("--peak_tflops", type=float, default=None,
                        help="the device's dense bf16 peak in TFLOP/s (default: known GPUs' datasheet value)")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    setup = bench.setup_from_args(args)
    transformer, vae = bench.build_models(setup)
    call = bench.VelocityCall.build(setup, transformer, vae, args.batch)
    transformer.train()
    flops = call.flops(setup)
    peak = bench.peak_tflops(setup.device, args.peak_tflops)
    params = sum(p.numel() for p in transformer.parameters())
    print(setup.describe())
    print(f"{params / 1e9:.3f}B parameters, {args.batch} sample(s) x CFG = {2 * args.batch} rows, "
          f"best of {setup.repeats}")
    print(f"model FLOPs per pass (forward + backward, analytic): {flops / 1e12:.4g} TFLOP")
    modes = ("off", "on") if args.checkpointing == "both" else (args.checkpointing,)
    seconds = {}
    for mode in modes:
        if mode == "on":
            transformer.enable_gradient_checkpointing()
        else:
            transformer.disable_gradient_checkpointing()
        if setup.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(setup.device)
        try:
            seconds[mode] = bench.best_time(call.training_pass, setup)
        except torch.OutOfMemoryError:
            transformer.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            print(f"checkpointing {mode}: out of memory")
            continue
        achieved = flops / seconds[mode] / 1e12
        line = f"checkpointing {mode}: {seconds[mode]:.4f} s, {achieved:.4g} TFLOP/s"
        if peak is not None:
            line += f", MFU {100 * achieved / peak:.2f}% of {peak:.0f} TFLOP/s"
        memory = bench.peak_memory_gb(setup.device)
        if memory is not None:
            line += f", peak memory {memory:.2f} GB"
        print(line)
    if len(seconds) == 2:
        print(f"ratio checkpointing on / off: {seconds['on'] / seconds['off']:.2f}")
    if peak is None and setup.device.type == "cuda":
        print("MFU: unknown peak for this GPU; pass --peak_tflops")


if __name__ == "__main__":
    main()
