"""PickScore of a video against its prompt: PickScore_v1 on every frame, averaged over the frames.

PickScore (Kirstain et al. 2023) is a CLIP-H model fine-tuned on human preferences (``yuvalkirstain/PickScore_v1``),
used with the processor of the CLIP-H it started from (``laion/CLIP-ViT-H-14-laion2B-s32B-b79K``). Its model card
scores an image as the CLIP logit::

    pickscore_f = exp(logit_scale) * cos_f             (logit_scale is the model's learnt temperature, ~ln 100)
    pickscore        = mean_f pickscore_f
    pickscore_cosine = mean_f cos_f

with ``cos_f`` as in :mod:`sage_grpo.rewards.clip_score` (same frame handling, same local-only loading). The paper
(Table 2) names no variant; these are the public ones.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .clip_score import ClipFrameScorer



class PickScore:
    """Reward callable: ``{"pickscore": mean_f exp(logit_scale) cos_f, "pickscore_cosine": mean_f cos_f}``."""

    metric_names = ("pickscore", "pickscore_cosine")

    def __init__(self, model_dir: str | Path, processor_dir: str | Path, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32):
        self.scorer = ClipFrameScorer(model_dir, processor_dir, device=device, dtype=dtype)
        self.scale = float(self.scorer.model.logit_scale.detach().float().exp())

    def __call__(self, videos: torch.Tensor, prompts: list[str]) -> dict[str, torch.Tensor]:
        cosines = self.scorer.frame_cosines(videos, prompts)  # (B, F)
        return {"pickscore": (self.scale * cosines).mean(dim=1), "pickscore_cosine": cosines.mean(dim=1)}
