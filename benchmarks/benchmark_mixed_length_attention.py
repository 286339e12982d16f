"""The attention call of a CFG pair whose rows have different valid text lengths, four ways: one call under a
key-padding mask (``--mixed_length_attention mask``), one mask-free call per row over its own keys (``split``),
torch's nested-tensor (jagged) SDPA, and flex attention with a key-length ``score_mod``.

    python benchmarks/benchmark_mixed_length_attention.py [--sizes toy,real876,real2466] [--repeats 5] [--backward]

Each size is (heads, head dim, video tokens, positive text tokens, negative text tokens): ``tiny`` and ``toy`` the
benchmark geometries' trimmed joint sequences, ``real876`` and ``real2466`` one real-width block's at 9x176x320 and
33x256x448 (16 heads of 128, 216 positive and 8 negative text tokens). The four run alternately, ``--repeats`` times
after a warm-up, and each prints the median process CPU time of its call (steadier than the wall clock on a shared
machine), its ratio to the masked call and its largest difference to the masked call's output. ``--backward`` times
the forward and the backward of a scalar of the output (flex attention has no backward on the CPU in torch 2.13: it
says so and is left out). Flex attention runs eagerly (``torch.compile`` is what makes it fast, and compiling is a
run's own choice): it materializes the scores. On a GPU the same comparison is
``benchmark_attention.py``'s masked and split lines, on every backend.
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

# name -> (heads, head dim, video tokens, positive text tokens, negative text tokens)
SIZES = {"tiny": (2, 8, 8, 12, 3), "toy": (4, 16, 48, 9, 3), "real876": (16, 128, 660, 216, 8),
         "real2466": (16, 128, 2250, 216, 8)}


def masked(q, k, v, keys):
    valid = torch.arange(q.shape[2])[None, :] < torch.tensor(keys)[:, None]  # (2, S) key validity
    return F.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :])


def split(q, k, v, keys):
    return torch.cat([F.scaled_dot_product_attention(q[i:i + 1], k[i:i + 1, :, :n], v[i:i + 1, :, :n])
                      for i, n in enumerate(keys)])


def nested(q, k, v, keys):
    def jagged(t, lengths):
        return torch.nested.as_nested_tensor([t[i, :, :n].transpose(0, 1) for i, n in enumerate(lengths)],
                                             layout=torch.jagged).transpose(1, 2)

    full = [q.shape[2]] * len(keys)
    out = F.scaled_dot_product_attention(jagged(q, full), jagged(k, keys), jagged(v, keys))
    return torch.stack(list(out.transpose(1, 2).unbind())).transpose(1, 2)


def flex(q, k, v, keys):
    from torch.nn.attention.flex_attention import flex_attention

    limit = torch.tensor(keys)
    return flex_attention(q, k, v, score_mod=lambda score, b, h, q_idx, kv_idx: torch.where(
        kv_idx < limit[b], score, -float("inf")))


CALLS = {"masked": masked, "split": split, "nested": nested, "flex": flex}


def run(call, inputs, keys, backward: bool) -> torch.Tensor:
    out = call(*inputs, keys)
    if backward:
        out.square().mean().backward()
    return out.detach()


def main(argv=None) -> None:
    import warnings

    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--sizes", default="tiny,toy,real876", help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--backward", action="store_true", help="time forward + backward")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
    warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors is in prototype stage.*")
    for name in args.sizes.split(","):
        heads, dim, video, positive, negative = SIZES[name]
        generator = torch.Generator().manual_seed(0)
        inputs = [torch.randn(2, heads, video + positive, dim, generator=generator).requires_grad_(args.backward)
                  for _ in range(3)]
        keys = (video + negative, video + positive)  # the negative row's valid keys, the positive row's
        outputs, seconds, failed = {}, {call: [] for call in CALLS}, {}
        for repeat in range(args.warmup + args.repeats):
            for call_name, call in CALLS.items():
                if call_name in failed:
                    continue
                start = time.process_time()
                try:
                    outputs[call_name] = run(call, inputs, keys, args.backward)
                except (NotImplementedError, RuntimeError) as err:  # flex attention has no CPU backward
                    failed[call_name] = str(err).splitlines()[0]
                    continue
                if repeat >= args.warmup:
                    seconds[call_name].append(time.process_time() - start)
        print(f"{name}: 2 rows, {heads} heads x {dim}, {video + positive} tokens, keys {keys[0]} / {keys[1]}, "
              f"{'forward + backward' if args.backward else 'forward'}, medians of {args.repeats}")
        baseline = statistics.median(seconds["masked"])
        for call_name in CALLS:
            if call_name in failed:
                print(f"  {call_name}: not run ({failed[call_name]})")
                continue
            value = statistics.median(seconds[call_name])
            difference = (outputs[call_name] - outputs["masked"]).abs().max().item()
            print(f"  {call_name}: {1e3 * value:.3f} ms process CPU, ratio to masked {value / baseline:.2f}, "
                  f"max |difference to masked| {difference:.1e}")


if __name__ == "__main__":
    main()
