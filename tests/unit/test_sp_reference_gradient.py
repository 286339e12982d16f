"""What docs/differences.md says of the reference's gradient under sequence parallelism, checked on the tiny model with
the one-process emulation of benchmarks/sp_reference_gradient.py: its all-gathers' backward keeps each rank's own
slice, so its gradient is 1/sp of the full one in norm, and in direction everywhere except the text branch."""

import pytest

from benchmarks.sp_reference_gradient import measure


def _is_text_query(name: str, last_block: int) -> bool:
    """The text queries (``add_q_proj``, ``norm_added_q``) of every dual-stream block but the last."""
    return (name.startswith("transformer_blocks.") and int(name.split(".")[1]) < last_block
            and (".attn.add_q_proj." in name or ".attn.norm_added_q." in name))


def _is_past_every_text_output(name: str, last_block: int) -> bool:
    """Tensors whose gradient passes through no block's text attention output: the last block and the output."""
    return name.startswith((f"transformer_blocks.{last_block}.", "norm_out.", "proj_out."))


@pytest.mark.parametrize("sp, heads, layers", [(4, 4, 2), (2, 2, 3)])
def test_reference_gradient_is_one_over_sp_in_norm_not_in_direction(sp, heads, layers):
    report = measure(sp, heads, layers)
    # the emulation itself: with the exact adjoint, the ranks' mean is the full gradient (float rounding)
    assert report["exact_max_diff"] < 1e-6 * report["full_max_abs"] * 100
    # the whole gradient: 1/sp in norm, the same direction to 1e-6
    assert report["norm_ratio"] == pytest.approx(1 / sp, rel=1e-4)
    assert report["cosine"] > 1 - 1e-6
    tensors, last = report["tensors"], layers - 1
    queries = {name: value for name, value in tensors.items() if _is_text_query(name, last)}
    assert len(queries) == 3 * last  # weight, bias and norm of each block's text query
    assert all(cosine < 0.95 for cosine, _ in queries.values()), queries  # measured 0.55-0.91
    rest = {name: value for name, value in tensors.items() if name not in queries}
    assert all(cosine > 0.999 for cosine, _ in rest.values()), {n: c for n, (c, _) in rest.items() if c <= 0.999}
    untouched = {name: value for name, value in rest.items() if _is_past_every_text_output(name, last)}
    assert len(untouched) > 20
    for name, (cosine, ratio) in untouched.items():
        assert cosine > 1 - 1e-9 and ratio == pytest.approx(1 / sp, rel=1e-6), name


def test_script_refuses_a_degree_that_does_not_divide_the_heads():
    from benchmarks.sp_reference_gradient import main

    with pytest.raises(SystemExit, match=r"--sp 3 with --heads 2: need sp >= 2 dividing the heads \(e.g. --sp 2"):
        main(["--sp", "3"])
