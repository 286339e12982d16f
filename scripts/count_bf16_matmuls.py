"""Count the matrix multiplies (and convolutions, attention) a training run performs in bf16 and in other dtypes.

    python scripts/count_bf16_matmuls.py --config configs/toy_cpu.yaml --max_steps 2 [post_train.py flags]

On a CPU without AVX-512-BF16/AMX a bf16 matmul takes torch's generic path (about 100x slower than fp32; see
docs/testing.md, "CPU speed"), so CPU runs should perform none, or only tiny ones. Every argument except --top is a post_train.py
flag; the run goes to its --output_dir as usual. Prints the counts per operator and dtype and the bf16 share of the
multiply-accumulates.
"""

import argparse
import math
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

MATMUL_OPS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "convolution", "addmv", "mv", "dot",
              "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
              "_scaled_dot_product_flash_attention"}


class MatmulCounter(TorchDispatchMode):
    """Counts calls and multiply-accumulates (for mm-like ops) per (operator, dtype)."""

    def __init__(self):
        super().__init__()
        self.calls, self.macs = Counter(), Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in MATMUL_OPS:
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            dtype = str(tensors[0].dtype).replace("torch.", "") if tensors else "?"
            self.calls[(name, dtype)] += 1
            if name in ("mm", "addmm", "bmm", "baddbmm") and len(tensors) >= 2:
                a, b = tensors[-2], tensors[-1]
                self.macs[dtype] += math.prod(a.shape) * b.shape[-1]
        return func(*args, **(kwargs or {}))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=20, help="operator/dtype rows to print")
    args, train_flags = parser.parse_known_args(argv)
    from sage_grpo.config.train import TrainConfig
    from sage_grpo.config.schema import parse_cli
    from sage_grpo.trainer import run_training

    cfg = parse_cli(TrainConfig, train_flags)
    counter = MatmulCounter()
    with counter:
        run_training(cfg)
    for (name, dtype), count in counter.calls.most_common(args.top):
        print(f"{name:48s} {dtype:10s} {count:8d} calls")
    total = sum(counter.macs.values())
    bf16_calls = sum(c for (_, d), c in counter.calls.items() if d == "bfloat16")
    share = counter.macs["bfloat16"] / total if total else 0.0
    print(f"bf16: {bf16_calls} of {sum(counter.calls.values())} calls; {share:.2%} of the mm-like "
          f"multiply-accumulates ({counter.macs['bfloat16']:.3g} of {total:.3g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
