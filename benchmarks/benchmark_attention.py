"""Time the transformer's forward + backward with our joint attention (text trimmed to the longest valid length, a
key-padding mask or none; ``sage_grpo/models/attention.py``) on each attention backend, against diffusers' own
processor with its dense (B, 1, S, S) mask over the padded joint sequence.

    python benchmarks/benchmark_attention.py [--geometry toy] [--blocks N] [--backends native,_native_math]
    python benchmarks/benchmark_attention.py --geometry real --blocks 4 --device cuda --dtype bf16        # GPU
    python benchmarks/benchmark_attention.py --geometry real --blocks 4 --device cuda --key_mask both --skip _native_math

One pass is the policy update's: ``cfg_velocity`` on ``--batch`` samples with CFG (negative and positive prompts in
one 2B-row forward, of different valid lengths, so a key mask remains; ``--guidance_scale 1`` runs the positive rows
alone and needs no mask) and the backward of a scalar of the velocity. ``--key_mask off`` times the same CFG pair
without the mask: the negative rows get the positive prompt's valid lengths, so no row has padding left after the
trim and the batch runs unmasked (the same rows and FLOPs; on a GPU the mask can keep SDPA off its flash kernel);
``both`` times each backend both ways and prints the ratio. The prompts are synthetic embeddings with the
geometry's valid lengths (``real``: 200 of 1000 MLLM and 16 of 256 byT5 slots positive, 8 and 0 negative; the 729
t2v image slots are never valid). ``--blocks`` sets the depth (1: about one block's cost).

Backends: by default those of diffusers' dispatcher that are usable here (the CPU: ``native``, ``_native_math``; a
GPU adds the native flash / efficient / cuDNN kernels and ``flash``, ``flash_varlen``, ``_flash_3``, ``sage``,
``xformers`` where their packages import), less those named by ``--skip`` (``_native_math`` at the real width: it
materializes the S x S scores, 21 GB per block call); the unusable ones are listed with the reason. A backend that
takes no mask runs a masked batch on its varlen sibling or native SDPA (``attention.py``). Prints each time, the ratio
dense / ours, the largest velocity difference to diffusers' processor on the same inputs, and the dense mask each
block call no longer allocates: B x S x S bytes (bool). With CFG and the key mask on, each backend is timed a second
time with the rows split (``--mixed_length_attention split``: one mask-free call per row of its own valid
length, the same rows and lengths), printed with the ratio masked / split and the largest velocity difference to the
masked call: the mask question on the device at hand, as the trainer would run it; on the CPU also the process CPU
time of the two, alternated.
"""

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common as bench  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    bench.add_model_args(parser, geometry="toy")
    parser.add_argument("--batch", type=int, default=1, help="samples per pass")
    parser.add_argument("--guidance_scale", type=float, default=6.0, help="> 1: CFG (2B rows, a key mask)")
    parser.add_argument("--backends", default=None,
                        help="comma-separated backends to time (default: every usable one of the device)")
    parser.add_argument("--skip", default="", help="comma-separated backends to leave out of the default list")
    parser.add_argument("--key_mask", choices=("on", "off", "both"), default="on",
                        help="on: the CFG pair's prompts keep their valid lengths (a key mask remains); off: the "
                             "negative rows get the positive's lengths (no mask); both: each backend both ways")
    parser.add_argument("--gradient_checkpointing", action="store_true", help="checkpoint the dual-stream blocks")
    return parser.parse_args(argv)


def timed(label: str, call: bench.VelocityCall, setup: bench.BenchSetup):
    """(seconds, velocity) of the pass, or None after printing why it could not run."""
    try:
        with torch.no_grad():
            velocity = call.forward()
        return bench.best_time(call.training_pass, setup), velocity
    except (RuntimeError, ValueError) as err:  # torch.OutOfMemoryError is a RuntimeError
        call.transformer.zero_grad(set_to_none=True)
        if setup.device.type == "cuda":
            torch.cuda.empty_cache()
        reason = "out of memory" if isinstance(err, torch.OutOfMemoryError) else str(err).splitlines()[0][:160]
        print(f"{label}: failed ({reason})")
        return None


def dense_velocity(call: bench.VelocityCall, backend: str) -> torch.Tensor:
    """The velocity of diffusers' own processor (dense mask over the padded text) on ``call``'s inputs, untimed."""
    from sage_grpo.models.attention import install_joint_attention, remove_joint_attention

    remove_joint_attention(call.transformer)
    try:
        with torch.no_grad():
            return call.forward()
    finally:
        install_joint_attention(call.transformer, backend)


def main(argv=None) -> None:
    from sage_grpo.models.attention import install_joint_attention, remove_joint_attention

    args = parse_args(argv)
    setup = bench.setup_from_args(args)
    backends, skipped = bench.usable_backends(args.backends, setup.device)
    backends = [name for name in backends if name not in args.skip.split(",")]
    transformer, vae = bench.build_models(setup)
    if args.gradient_checkpointing:
        transformer.enable_gradient_checkpointing()
    transformer.train()
    call = bench.VelocityCall.build(setup, transformer, vae, args.batch, args.guidance_scale)
    geometry = setup.geometry
    dense_tokens = bench.image_tokens(geometry, setup.video) + bench.text_tokens(geometry, (0, 0), trimmed=False)
    valid = [geometry.prompt_valid] + ([geometry.negative_valid] if args.guidance_scale > 1.0 else [])
    trimmed_tokens = bench.image_tokens(geometry, setup.video) + max(sum(v) for v in valid)
    mask_bytes = call.rows * dense_tokens ** 2
    print(setup.describe())
    print(f"{call.rows} rows per forward; joint sequence {dense_tokens} tokens padded (diffusers), {trimmed_tokens} "
          f"trimmed (ours); best of {setup.repeats}" + (", checkpointing" if args.gradient_checkpointing else ""))
    print(f"dense mask avoided: {call.rows} x {dense_tokens} x {dense_tokens} bool = {mask_bytes / 2 ** 20:.1f} MiB "
          f"per block call, {geometry.num_layers} block calls per forward")
    for name, reason in skipped.items():
        print(f"not usable here: {name} ({reason})")

    remove_joint_attention(transformer)
    baseline = timed("dense mask (diffusers' processor)", call, setup)
    install_joint_attention(transformer, setup.attention_backend)
    dense_s, dense_v = baseline or (None, None)  # without it the backends are still timed, with no ratio
    if baseline is not None:
        print(f"dense mask (diffusers' processor): {dense_s:.4f} s")
    unmasked = None
    if args.key_mask != "on":  # the same rows, the negative prompts as long as the positive: no padding left
        equal = dataclasses.replace(setup, geometry=dataclasses.replace(geometry, negative_valid=geometry.prompt_valid))
        unmasked = bench.VelocityCall.build(equal, transformer, vae, args.batch, args.guidance_scale)
        print(f"without a key mask: the negative rows get the positive's valid lengths {geometry.prompt_valid}")
        unmasked_dense_v = dense_velocity(unmasked, setup.attention_backend) if baseline is not None else None
    for backend in backends:
        install_joint_attention(transformer, backend)
        masked_s = None
        if args.key_mask != "off":
            result = timed(f"joint attention, {backend}", call, setup)
            if result is not None:
                masked_s = result[0]
                print(f"joint attention, {backend}: {masked_s:.4f} s{against_dense(result, dense_s, dense_v)}")
                if args.guidance_scale > 1.0:
                    time_split(transformer, call, setup, backend, *result)
        if unmasked is not None:
            result = timed(f"joint attention, {backend}, no key mask", unmasked, setup)
            if result is not None:
                ratio = f", ratio with / without the key mask {masked_s / result[0]:.2f}" if masked_s else ""
                print(f"joint attention, {backend}, no key mask: {result[0]:.4f} s"
                      f"{against_dense(result, dense_s, unmasked_dense_v, ratio)}")
    install_joint_attention(transformer, setup.attention_backend)


def time_split(transformer, call: bench.VelocityCall, setup: bench.BenchSetup, backend: str, masked_s: float,
               masked_v: torch.Tensor) -> None:
    """The same pass with the CFG rows split into mask-free calls, against the masked one just timed."""
    from sage_grpo.models.attention import install_joint_attention

    install_joint_attention(transformer, backend, split_rows=True)
    result = timed(f"joint attention, {backend}, split rows", call, setup)
    install_joint_attention(transformer, backend)
    if result is None:
        return
    seconds, velocity = result
    difference = (velocity.float() - masked_v.float()).abs().max().item()
    print(f"joint attention, {backend}, split rows: {seconds:.4f} s, ratio masked / split "
          f"{masked_s / seconds:.2f}, max |velocity difference to the masked call| {difference:.2e}")
    if setup.device.type == "cpu":
        masked_cpu, split_cpu = interleaved_cpu_seconds(transformer, call, setup, backend)
        print(f"joint attention, {backend}, process CPU (masked and split alternated, medians of {setup.repeats}): "
              f"masked {masked_cpu:.4f} s, split {split_cpu:.4f} s, ratio masked / split {masked_cpu / split_cpu:.2f}")


def interleaved_cpu_seconds(transformer, call: bench.VelocityCall, setup: bench.BenchSetup, backend: str):
    """Median process CPU seconds of the masked and the split pass, run alternately (after the warm-up): on a machine
    shared with other jobs the CPU time is steadier than the wall clock, and alternating gives both the same load."""
    import statistics
    import time

    from sage_grpo.models.attention import install_joint_attention

    seconds = {False: [], True: []}
    for repeat in range(setup.warmup + setup.repeats):
        for split_rows in (False, True):
            install_joint_attention(transformer, backend, split_rows=split_rows)
            start = time.process_time()
            call.training_pass()
            if repeat >= setup.warmup:
                seconds[split_rows].append(time.process_time() - start)
    install_joint_attention(transformer, backend)
    return statistics.median(seconds[False]), statistics.median(seconds[True])


def against_dense(result, dense_s, dense_v, extra: str = "") -> str:
    """``, ratio dense / ours R<extra>, max |velocity difference| D`` against the dense-mask run (none: its failure)."""
    seconds, velocity = result
    if dense_s is None:
        return f"{extra} (no dense-mask run to compare with)"
    difference = (velocity.float() - dense_v.float()).abs().max().item()
    return f", ratio dense / ours {dense_s / seconds:.2f}{extra}, max |velocity difference| {difference:.2e}"


if __name__ == "__main__":
    main()
