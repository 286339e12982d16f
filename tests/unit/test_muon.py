"""Muon (sage_grpo/optim/muon.py): torch's math on plain tensors, Newton-Schulz precision by device, fp32 vs bf16
agreement.

The sharded (FSDP2) behaviour is checked on 2 and 4 processes in tests/distributed/scripts/{two,four}_ranks.py.
"""

import copy

import pytest
import torch

from sage_grpo.optim.muon import Muon, newton_schulz_dtype, newton_schulz_orthogonalize

NS = dict(coefficients=(3.4445, -4.7750, 2.0315), steps=5, eps=1e-7)
HYPER = dict(lr=2e-2, weight_decay=0.1, momentum=0.95, nesterov=True, adjust_lr_fn="match_rms_adamw")
# Measured worst relative Frobenius difference between the bf16 and the fp32 iteration on Gaussian matrices of these
# shapes: 0.015-0.025 (bf16 keeps 8 mantissa bits, ~0.4% per element, and 5 iterations compound it). 0.04 leaves room.
PRECISION_RTOL = 0.04


def _mlp():
    torch.manual_seed(0)  # tall (40x12), wide (7x40) and square (7x7) matrices
    return torch.nn.Sequential(torch.nn.Linear(12, 40), torch.nn.GELU(), torch.nn.Linear(40, 7), torch.nn.Linear(7, 7))


def _train(model, opt, steps=3):
    for step in range(steps):
        x = torch.randn(5, 12, generator=torch.Generator().manual_seed(step))
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()


def _matrices(model):
    return [p for p in model.parameters() if p.ndim == 2]


def test_bf16_newton_schulz_is_torch_muon_bit_for_bit():
    """With the reference's bf16 iteration, the same math op for op as torch.optim.Muon (tall, wide, square)."""
    ref = _mlp()
    model = copy.deepcopy(ref)
    opt = Muon(_matrices(model), ns_dtype=torch.bfloat16, **HYPER)
    ref_opt = torch.optim.Muon(_matrices(ref), **HYPER)
    _train(model, opt)
    _train(ref, ref_opt)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p, q)
    assert opt.state_dict()["state"].keys() == ref_opt.state_dict()["state"].keys()


def test_newton_schulz_precision_follows_the_device():
    assert newton_schulz_dtype(torch.device("cpu")) == torch.float32  # no fast bf16 matmul on AVX2-only CPUs
    assert newton_schulz_dtype(torch.device("cuda", 0)) == torch.bfloat16  # the reference's precision on GPUs
    assert newton_schulz_dtype("cpu") == torch.float32


@pytest.mark.parametrize("shape", [(8, 4), (40, 12), (7, 7), (64, 48), (48, 200)])
def test_fp32_and_bf16_newton_schulz_agree(shape):
    generator = torch.Generator().manual_seed(sum(shape))
    for _ in range(3):
        matrix = torch.randn(*shape, generator=generator)
        high = newton_schulz_orthogonalize(matrix, dtype=torch.float32, **NS)
        low = newton_schulz_orthogonalize(matrix, dtype=torch.bfloat16, **NS)
        assert high.dtype == torch.float32 and low.dtype == torch.bfloat16
        assert ((high - low.float()).norm() / high.norm()).item() < PRECISION_RTOL
        # Both are the quintic's approximate orthogonalisation: singular values in its band around 1, not exactly 1.
        for ortho in (high, low.float()):
            singular = torch.linalg.svdvals(ortho)
            assert 0.6 < singular.min().item() and singular.max().item() < 1.2


def test_newton_schulz_leaves_its_input_alone():
    update = torch.randn(6, 4, dtype=torch.bfloat16)  # a bf16 update (bf16 master weights) must not be scaled in place
    before = update.clone()
    newton_schulz_orthogonalize(update, dtype=torch.bfloat16, **NS)
    assert torch.equal(update, before)


def _step_with_gaussian_gradients(model, opt):
    generator = torch.Generator().manual_seed(1)
    for param in _matrices(model):
        param.grad = torch.randn(param.shape, generator=generator)
    opt.step()


def test_cpu_muon_steps_in_fp32_and_stays_close_to_the_bf16_reference():
    """One step from the same well-conditioned gradients: fp32 (the CPU default) vs bf16 within PRECISION_RTOL.

    Well-conditioned matters: Newton-Schulz maps small singular values up by ~3.4 per iteration (~480x over 5), so on
    a low-rank or ill-conditioned gradient bf16's rounding noise in the near-null space is amplified into the update
    (measured on this MLP's real gradients: 0.14 relative difference at batch 64, 0.39 at batch 5, where the gradient
    has rank 5); fp32 is the more exact of the two there.
    """
    fp32_model, bf16_model = _mlp(), _mlp()
    start = [p.detach().clone() for p in _matrices(fp32_model)]
    default = Muon(_matrices(fp32_model), **HYPER)  # ns_dtype None: picked from the (CPU) device
    assert default.ns_dtype is None
    _step_with_gaussian_gradients(fp32_model, default)
    _step_with_gaussian_gradients(bf16_model, Muon(_matrices(bf16_model), ns_dtype=torch.bfloat16, **HYPER))
    for p0, p, q in zip(start, _matrices(fp32_model), _matrices(bf16_model)):
        step_fp32, step_bf16 = p.detach() - p0, q.detach() - p0
        assert step_fp32.norm() > 0
        assert ((step_fp32 - step_bf16).norm() / step_fp32.norm()).item() < PRECISION_RTOL
    reference = _mlp()
    _step_with_gaussian_gradients(reference, torch.optim.Muon(_matrices(reference), **HYPER))
    for p, q in zip(_matrices(bf16_model), _matrices(reference)):
        assert torch.equal(p, q)  # the bf16 arm above is torch's step
    # fp32 on the CPU is a departure from torch's bf16 iteration, so it must not be bit-identical to it.
    assert not all(torch.equal(p, q) for p, q in zip(_matrices(fp32_model), _matrices(reference)))
