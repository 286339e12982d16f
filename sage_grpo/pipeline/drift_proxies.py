"""The drift-proxy table: name -> the function that measures how far validation samples have moved off the base
model's data manifold, from what a real run has (the frozen base model, the samples, the prompts; no ground truth).

A proxy is ``"package.module:function"`` with the signature of
:func:`~sage_grpo.pipeline.drift.base_denoising_errors`::

    proxy(base, sampler, latents, embeds, seeds, sigmas) -> Tensor (B, ...)

``base``: the frozen base transformer (on the device); ``sampler``: the validation :class:`~.sampler.Sampler`;
``latents``: the final latents (B, C, T, h, w); ``embeds``: their prompts' embeddings; ``seeds``: their validation
seeds (B ints, for any fixed noise the proxy draws); ``sigmas``: ``--drift_proxy_sigmas``. Larger is further off the
manifold; the validation metric ``Validation/drift_proxy`` (:class:`~.drift.DriftProxyMetric`) and the drift guard's
ratio take the mean of the values. The run measures :data:`DEFAULT_DRIFT_PROXY`; ``scripts/drift_proxy_study.py``
measures every entry against the toy world's true manifold error, as the denoising error was chosen
(docs/toy_study.md, "Drift proxy"). Adding a proxy is one function in a new module and one line here.
"""

import importlib
from typing import Callable, Dict

DRIFT_PROXIES: Dict[str, str] = {
    "denoising_error": "sage_grpo.pipeline.drift:base_denoising_errors",  # the base model's x0 reconstruction error
}
DEFAULT_DRIFT_PROXY = "denoising_error"


def drift_proxy(name: str) -> Callable:
    """The proxy function of table entry ``name`` (its module imported now); ValueError naming the entries otherwise."""
    if name not in DRIFT_PROXIES:
        raise ValueError(f"unknown drift proxy {name!r}; the table holds: {', '.join(DRIFT_PROXIES)}")
    module, _, function = DRIFT_PROXIES[name].partition(":")
    return getattr(importlib.import_module(module), function)
