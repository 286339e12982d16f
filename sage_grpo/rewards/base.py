"""The reward contract and the failure policy shared by every reward model.

A reward callable maps ``videos`` ``(B, 3, F, H, W)`` in [0, 1] and ``prompts`` (B strings) to a dict of
metric name -> tensor ``(B,)``. It may declare ``metric_names`` (a tuple) so that callers know its metrics
before the first call (needed to validate ``sub_reward`` weights and to fill NaNs when every call fails). A reward
that sets ``accepts_uint8 = True`` also takes uint8 videos in [0, 255] and scores them exactly as the same videos
divided by 255 in float; the reward server then hands it the request's frames as they arrived (a view of the body)
instead of a float32 copy 4x their size (:mod:`sage_grpo.rewards.serving`).

``score_with_fallback`` applies the policy of the reference (``rewards.py``: a failed sample scores NaN,
the others keep their scores) to batched calls:

* the batch is scored in chunks of ``batch_size`` (all at once by default);
* if a chunk raises, each of its samples is retried alone, so only the samples that fail on their own become
  NaN;
* a sample with any non-finite metric becomes NaN in all metrics of that reward model;
* a sample whose video is not finite (NaN or inf pixels, e.g. sampled with weights holding NaN) is NaN without
  being scored: a reward may well score it (a remote or mp4 reward turns NaN pixels into 0), and a finite reward
  of a broken video would train on it and hide the failure from the failed-reward count.

Each NaN comes with a ``RuntimeWarning`` naming the reward model, the prompt and the cause. Returning a
mapping of the wrong shape is a programming error and raises instead.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class RewardFn(Protocol):
    """``fn(videos (B, 3, F, H, W) in [0, 1], prompts) -> {metric: tensor (B,)}``."""

    def __call__(self, videos: torch.Tensor, prompts: list[str]) -> Mapping[str, torch.Tensor]: ...


def accepts_uint8(fn: Callable) -> bool:
    """Whether a reward callable declares that it takes uint8 videos in [0, 255] (``accepts_uint8 = True``)."""
    return getattr(fn, "accepts_uint8", False) is True


def metric_names_of(fn: Callable) -> tuple[str, ...] | None:
    """The metrics a reward callable declares, or None."""
    names = getattr(fn, "metric_names", None)
    return tuple(names) if names is not None else None


def _as_rows(output, expected: int, name: str) -> list[dict[str, float]]:
    """Check a reward output against the contract and split it into one dict per sample."""
    if not isinstance(output, Mapping) or not output:
        raise TypeError(f"reward {name!r} must return a non-empty dict of metric -> (B,) tensor, got {type(output)}")
    columns = {}
    for metric, values in output.items():
        values = torch.as_tensor(values).detach()
        if values.shape != (expected,):
            raise ValueError(
                f"reward {name!r} returned shape {tuple(values.shape)} for metric {metric!r}; expected ({expected},)"
            )
        columns[str(metric)] = values.double().cpu().tolist()
    return [{metric: col[i] for metric, col in columns.items()} for i in range(expected)]


def _warn(name: str, prompt: str, cause: str) -> None:
    warnings.warn(f"reward {name!r} gave NaN for prompt {prompt!r}: {cause}", RuntimeWarning, stacklevel=3)


def _score_chunk(fn: Callable, videos: torch.Tensor, prompts: Sequence[str], name: str) -> list[dict | None]:
    try:
        output = fn(videos, list(prompts))
    except Exception as exc:  # noqa: BLE001 - any failure of the reward model is a scoring failure
        if len(prompts) == 1:
            _warn(name, prompts[0], f"{type(exc).__name__}: {exc}")
            return [None]
        warnings.warn(
            f"reward {name!r} failed on a batch of {len(prompts)} ({type(exc).__name__}: {exc}); "
            "retrying sample by sample",
            RuntimeWarning,
            stacklevel=3,
        )
        return [row for i in range(len(prompts)) for row in _score_chunk(fn, videos[i:i + 1], prompts[i:i + 1], name)]
    return _as_rows(output, len(prompts), name)


def _finite_videos(videos: torch.Tensor) -> torch.Tensor:
    """(B,) whether each video's pixels are all finite (integer videos always are)."""
    if not videos.is_floating_point():
        return torch.ones(videos.shape[0], dtype=torch.bool)
    return torch.isfinite(videos.reshape(videos.shape[0], -1)).all(dim=1).cpu()


def score_with_fallback(
    fn: Callable,
    videos: torch.Tensor,
    prompts: Sequence[str],
    *,
    name: str,
    batch_size: int | None = None,
    metric_names: Sequence[str] | None = None,
) -> dict[str, torch.Tensor]:
    """Call ``fn`` under the failure policy; returns metric -> float32 CPU tensor ``(B,)`` (NaN where failed)."""
    total = len(prompts)
    if videos.shape[0] != total:
        raise ValueError(f"{videos.shape[0]} videos but {total} prompts")
    step = batch_size or max(total, 1)
    finite = _finite_videos(videos)
    if finite.all():
        rows: list[dict | None] = []
        for start in range(0, total, step):
            rows += _score_chunk(fn, videos[start:start + step], prompts[start:start + step], name)
    else:  # the finite videos scored, in chunks of ``step``; the others failed
        rows = [None] * total
        scored = finite.nonzero().flatten().tolist()
        for start in range(0, len(scored), step):
            chunk = scored[start:start + step]
            for i, row in zip(chunk, _score_chunk(fn, videos[chunk], [prompts[i] for i in chunk], name)):
                rows[i] = row
        for i in (~finite).nonzero().flatten().tolist():
            _warn(name, prompts[i], "its video is not finite (NaN or inf pixels), so it is not scored")

    metrics = list(metric_names or ())
    for row in rows:
        metrics += [m for m in (row or {}) if m not in metrics]
    scores = {m: torch.full((total,), math.nan, dtype=torch.float32) for m in metrics}
    for i, row in enumerate(rows):
        if row is None:
            continue
        bad = {m: v for m, v in row.items() if not math.isfinite(v)}
        if bad:
            _warn(name, prompts[i], f"non-finite scores {bad}")
            continue
        for m, v in row.items():
            scores[m][i] = v
    return scores
