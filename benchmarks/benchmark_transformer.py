"""Time one training pass of the transformer (forward + backward, as the policy update's replay calls it) with
activation checkpointing off and on, optionally compiled and as one sequence-parallel rank, report the achieved
TFLOP/s and the MFU against the device's bf16 peak, and what each dual-stream block saves for its backward next to
the memory planner's estimate.

    python benchmarks/benchmark_transformer.py [--geometry toy] [--batch 1] [--checkpointing both|on|off]
    python benchmarks/benchmark_transformer.py --geometry real --blocks 4 --device cuda --compile both --sp 2   # GPU

One pass is ``cfg_velocity`` on ``--batch`` samples with CFG (a 2B-row forward: negative and positive prompts) and the
backward of a scalar of the velocity, on synthetic prompt embeddings of the geometry's shapes, through our joint
attention (text trimmed to the longest valid length). The weights are the ``--dtype`` (bf16 on a GPU) with gradients.

FLOPs are counted analytically from the configuration (``benchmarks.common.transformer_flops``: per block
2·(n + L)·(4 + 2r)·d² for the matmuls plus 4·S²·d/sp for attention, plus the embedders; forward + backward = 3x the
forward; tests/unit/test_bench.py checks the count against ``torch.utils.flop_counter.FlopCounterMode``). The recompute
of checkpointing is not counted (model FLOPs, as MFU is usually quoted). MFU uses ``--peak_tflops`` or the known
peak of the GPU (H100 SXM / H200 989, H100 PCIe 756, A100 312 dense bf16 TFLOP/s); on the CPU only TFLOP/s is printed.
A setting that runs out of GPU memory prints ``out of memory`` and the others still run.

``--compile on`` compiles each repeated block (``compile_repeated_blocks``, as ``generate.py --enable_torch_compile``
does: diffusers' regional compilation). The 54 dual-stream blocks share one code path, so one compile serves them
all; the forward around them has a text length that depends on the prompt batch (the trimmed text), which would
recompile a whole-model graph per batch; and checkpointing wraps each block call from
outside the compiled region, so the same compiled block serves the forward and the recompute. The first compiled
pass (compilation included) is printed apart from the timed ones.

Memory (eager passes): the bytes of the tensors autograd saves in one forward, block by block
(``benchmarks.memory``, a saved-tensor hook: every device), against the planner's per-block formula
(``block_saved_elements`` without checkpointing, ``checkpointed_block_elements`` with it); on CUDA also the
allocator's bytes kept by the forward and its peak through the backward.
"""

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common as bench, memory as bench_memory  # noqa: E402
from benchmarks.sp_emulation import emulate_sp_rank  # noqa: E402
from sage_grpo.config import ConfigError  # noqa: E402

MIB = 2 ** 20


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    bench.add_model_args(parser, geometry="toy")
    parser.add_argument("--batch", type=int, default=1, help="samples per pass (2x rows with CFG)")
    parser.add_argument("--checkpointing", choices=("both", "off", "on"), default="both",
                        help="activation checkpointing of the dual-stream blocks")
    parser.add_argument("--compile", choices=("off", "on", "both"), default="off",
                        help="torch.compile of each repeated block (regional compilation); both: eager, then compiled")
    parser.add_argument("--compile_backend", default="inductor", help=argparse.SUPPRESS)  # tests: aot_eager
    parser.add_argument("--sp", type=int, default=1,
                        help="time one rank of an Ulysses group of N on this device, as the planner models it: the "
                             "streams on N_video/sp image tokens plus all text tokens, attention over the whole "
                             "sequence with heads/sp heads (the reference launch, --sp 2: 9,009 of 18,018 tokens); "
                             "the all-to-alls are local copies of the same shapes, their time is not measured")
    parser.add_argument("--peak_tflops", type=float, default=None,
                        help="the device's dense bf16 peak in TFLOP/s (default: known GPUs' datasheet value)")
    return parser.parse_args(argv)


def set_checkpointing(transformer, mode: str) -> None:
    if mode == "on":
        transformer.enable_gradient_checkpointing()
    else:
        transformer.disable_gradient_checkpointing()


def time_pass(call, setup, flops: float, peak, label: str, compiled: bool):
    """Print one setting's line (and the compile time of its first pass); its best seconds, or None on OOM."""
    transformer = call.transformer
    if setup.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(setup.device)
    try:
        if compiled:  # the first pass compiles (or recompiles for this checkpointing mode)
            bench.synchronize(setup.device)
            start = time.perf_counter()
            call.training_pass()
            bench.synchronize(setup.device)
            print(f"compile + first pass ({label}): {time.perf_counter() - start:.4f} s")
        seconds = bench.best_time(call.training_pass, setup)
    except torch.OutOfMemoryError:
        transformer.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        print(f"{label}: out of memory")
        return None
    achieved = flops / seconds / 1e12
    line = f"{label}: {seconds:.4f} s, {achieved:.4g} TFLOP/s"
    if peak is not None:
        line += f", MFU {100 * achieved / peak:.2f}% of {peak:.0f} TFLOP/s"
    memory = bench.peak_memory_gb(setup.device)
    if memory is not None:
        line += f", peak memory {memory:.2f} GB"
    print(line)
    return seconds


def report_block_memory(call, setup, mode: str, sp: int) -> None:
    """Per-block saved bytes (measured, planned) of one forward with checkpointing ``mode``; the allocator's on CUDA."""
    geometry, checkpointing = setup.geometry, mode == "on"
    video = bench.image_tokens(geometry, setup.video)
    text = bench.text_tokens(geometry, max(geometry.prompt_valid, geometry.negative_valid, key=sum), trimmed=True)
    planned = bench_memory.planned_block_bytes(geometry.transformer_config, video, text, sp, call.rows,
                                               setup.dtype.itemsize, checkpointing)
    try:
        measured = bench_memory.measure_saved_bytes(call.transformer, call.forward, checkpointing)
        print(f"saved per block, checkpointing {mode}: measured {measured.per_block / MIB:.4f} MiB, planner "
              f"{planned / MIB:.4f} MiB, ratio planner / measured {planned / measured.per_block:.3f} (first block "
              f"{measured.blocks[0] / MIB:.4f} MiB, outside the blocks {measured.outside / MIB:.4f} MiB)")
        if setup.device.type == "cuda":
            set_checkpointing(call.transformer, mode)
            call.transformer.zero_grad(set_to_none=True)  # the peak then includes the gradients' allocation
            cuda = bench_memory.measure_cuda_memory(setup.device, call.forward)
            call.transformer.zero_grad(set_to_none=True)
            blocks = geometry.num_layers
            print(f"allocator, checkpointing {mode}: forward keeps {cuda.forward_kept / MIB:.1f} MiB "
                  f"({cuda.forward_kept / blocks / MIB:.1f} MiB per block, outside included), planner's blocks "
                  f"{blocks * planned / MIB:.1f} MiB; peak above the weights {cuda.peak / MIB:.1f} MiB "
                  f"(gradients included)")
    except torch.OutOfMemoryError:
        call.transformer.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        print(f"memory per block, checkpointing {mode}: out of memory")


def main(argv=None) -> None:
    args = parse_args(argv)
    setup = bench.setup_from_args(args)
    transformer, vae = bench.build_models(setup)
    try:
        emulate_sp_rank(transformer, args.sp, setup.attention_backend)
    except ConfigError as err:
        raise SystemExit(f"error: {err}") from None
    call = bench.VelocityCall.build(setup, transformer, vae, args.batch)
    transformer.train()
    flops = call.flops(setup, sp=args.sp)
    peak = bench.peak_tflops(setup.device, args.peak_tflops)
    params = sum(p.numel() for p in transformer.parameters())
    print(setup.describe())
    if args.sp > 1:
        heads = setup.geometry.transformer_config["num_attention_heads"]
        print(f"one rank of sp {args.sp}: {bench.image_tokens(setup.geometry, setup.video) // args.sp} video tokens "
              f"per rank, attention over all tokens with {heads // args.sp} of {heads} heads (emulated on one device)")
    print(f"{params / 1e9:.3f}B parameters, {args.batch} sample(s) x CFG = {2 * args.batch} rows, "
          f"best of {setup.repeats}")
    print(f"model FLOPs per pass (forward + backward, analytic): {flops / 1e12:.4g} TFLOP")
    modes = ("off", "on") if args.checkpointing == "both" else (args.checkpointing,)
    seconds = {}  # (compiled, checkpointing mode) -> best seconds
    for compiled in {"off": (False,), "on": (True,), "both": (False, True)}[args.compile]:
        if compiled:
            transformer.compile_repeated_blocks(fullgraph=False, backend=args.compile_backend)
        suffix = ", compiled" if compiled else ""
        for mode in modes:
            set_checkpointing(transformer, mode)
            seconds[compiled, mode] = time_pass(call, setup, flops, peak, f"checkpointing {mode}{suffix}", compiled)
            if not compiled:
                report_block_memory(call, setup, mode, args.sp)
        if seconds.get((compiled, "on")) and seconds.get((compiled, "off")):
            print(f"ratio checkpointing on / off{suffix}: {seconds[compiled, 'on'] / seconds[compiled, 'off']:.2f}")
    for mode in modes:
        if seconds.get((False, mode)) and seconds.get((True, mode)):
            print(f"speed-up of compile, checkpointing {mode}: {seconds[False, mode] / seconds[True, mode]:.2f}")
    if peak is None and setup.device.type == "cuda":
        print("MFU: unknown peak for this GPU; pass --peak_tflops")


if __name__ == "__main__":
    main()
