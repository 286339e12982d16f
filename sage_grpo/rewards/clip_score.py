"""CLIPScore of a video against its prompt: the CLIP image-text cosine of every frame, averaged over the frames.

For a video with frames ``x_1..x_F`` and prompt ``c``, with ``E_I`` / ``E_T`` CLIP's projected image / text
embeddings::

    cos_f         = <E_I(x_f), E_T(c)> / (|E_I(x_f)| |E_T(c)|)
    clip_cosine   = mean_f cos_f
    clipscore     = mean_f 2.5 * max(cos_f, 0)                 (Hessel et al. 2021, "CLIPScore", w = 2.5, per frame)
    clip_flowgrpo = mean_f exp(logit_scale) * cos_f / 30       (Flow-GRPO's CLIP scorer: CLIPModel's logit / 30)

``logit_scale`` is the model's learnt temperature (ln 100 for ViT-L/14, so ``clip_flowgrpo`` = 3.33 cos there); the
logit is not clamped at 0. Flow-GRPO scores images; a video here is scored per frame and averaged, as CLIPScore is.

The paper (Table 2) reports a CLIPScore without naming its CLIP; the default here is the public ViT-L/14
(``openai/clip-vit-large-patch14``), any CLIP checkpoint folder works (``--clip_model``). Frames are handed to the
model's own ``CLIPProcessor`` as 8-bit RGB images (the values a saved video holds: ``round(255 x)``), so the
processor's resize, centre crop and normalisation are exactly the released ones.

Models load with transformers' ``CLIPModel`` / ``CLIPProcessor`` from a local folder only (``local_files_only``,
``use_safetensors``: never a pickle). :class:`ClipFrameScorer` is shared with PickScore
(:mod:`sage_grpo.rewards.pick_score`), which differs only in the checkpoint, the processor folder and the scale.
"""

from __future__ import annotations

from pathlib import Path

import torch

CLIPSCORE_WEIGHT = 2.5  # w of CLIPScore = w * max(cos, 0)
FLOW_GRPO_CLIP_DIVISOR = 30.0  # Flow-GRPO's CLIP scorer: exp(logit_scale) * cos / 30
FRAMES_PER_FORWARD = 64  # frames per image-encoder call: a 121-frame 480p video in two calls


def resolve_model_folder(name: str, model_root: str | Path, flag: str) -> Path:
    """A local model folder from a flag: an existing folder as given, else ``<model_root>/<name after its last '/'>``
    (how ``download_weights.sh --eval_scorers`` lays out hub repos). Raises FileNotFoundError naming both places."""
    given = Path(name)
    if given.is_dir():
        return given
    under_root = Path(model_root) / name.rstrip("/").split("/")[-1]
    if under_root.is_dir():
        return under_root
    raise FileNotFoundError(f"{flag} {name}: neither a folder nor found as {under_root}; fetch it with "
                            "`bash download_weights.sh --eval_scorers` or pass a local CLIP folder")


def frames_as_images(videos: torch.Tensor) -> list:
    """``videos (B, 3, F, H, W)`` in [0, 1] -> B*F PIL RGB images, video-major (8-bit, as a saved video)."""
    from PIL import Image

    if videos.ndim != 5 or videos.shape[1] != 3:
        raise ValueError(f"videos must be (B, 3, F, H, W), got {tuple(videos.shape)}")
    pixels = (videos.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)  # (B, 3, F, H, W)
    pixels = pixels.permute(0, 2, 3, 4, 1).reshape(-1, videos.shape[3], videos.shape[4], 3).cpu().numpy()
    return [Image.fromarray(frame) for frame in pixels]


def _embedding(output) -> torch.Tensor:
    """transformers 5 returns the projected embedding as ``pooler_output`` of a model output, 4.x a tensor."""
    return output if isinstance(output, torch.Tensor) else output.pooler_output


class ClipFrameScorer:
    """A CLIP model and its processor, loaded once; :meth:`frame_cosines` gives ``cos_f`` per video and frame."""

    def __init__(self, model_dir: str | Path, processor_dir: str | Path | None = None,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
        from transformers import CLIPModel, CLIPProcessor

        self.device = torch.device(device)
        self.model = CLIPModel.from_pretrained(str(model_dir), local_files_only=True, use_safetensors=True,
                                               dtype=dtype).to(self.device).eval()
        self.processor = CLIPProcessor.from_pretrained(str(processor_dir or model_dir), local_files_only=True)

    @torch.no_grad()
    def frame_cosines(self, videos: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        """``(B, F)`` float32 cosines between each frame and its video's prompt."""
        num_videos, num_frames = videos.shape[0], videos.shape[2]
        if len(prompts) != num_videos:
            raise ValueError(f"{num_videos} videos but {len(prompts)} prompts")
        dtype = self.model.dtype
        text = self.processor(text=list(prompts), return_tensors="pt", padding=True, truncation=True,
                              max_length=self.model.config.text_config.max_position_embeddings)
        text_embeds = _embedding(self.model.get_text_features(
            input_ids=text["input_ids"].to(self.device), attention_mask=text["attention_mask"].to(self.device)))
        images = frames_as_images(videos)
        image_embeds = []
        for start in range(0, len(images), FRAMES_PER_FORWARD):
            pixels = self.processor(images=images[start:start + FRAMES_PER_FORWARD], return_tensors="pt")
            image_embeds.append(_embedding(self.model.get_image_features(
                pixel_values=pixels["pixel_values"].to(self.device, dtype))))
        image = torch.nn.functional.normalize(torch.cat(image_embeds).float(), dim=-1)
        image = image.reshape(num_videos, num_frames, -1)  # (B, F, D)
        text = torch.nn.functional.normalize(text_embeds.float(), dim=-1)  # (B, D)
        return torch.einsum("bfd,bd->bf", image, text).cpu()


class ClipScore:
    """Reward callable: ``{"clipscore": mean_f 2.5 max(cos_f, 0), "clip_flowgrpo": mean_f exp(logit_scale) cos_f / 30,
    "clip_cosine": mean_f cos_f}``, each ``(B,)`` (module docstring)."""

    metric_names = ("clipscore", "clip_flowgrpo", "clip_cosine")

    def __init__(self, model_dir: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
        self.scorer = ClipFrameScorer(model_dir, device=device, dtype=dtype)
        self.scale = float(self.scorer.model.logit_scale.detach().float().exp())

    def __call__(self, videos: torch.Tensor, prompts: list[str]) -> dict[str, torch.Tensor]:
        cosines = self.scorer.frame_cosines(videos, prompts)  # (B, F)
        return {"clipscore": (CLIPSCORE_WEIGHT * cosines.clamp(min=0)).mean(dim=1),
                "clip_flowgrpo": (self.scale * cosines / FLOW_GRPO_CLIP_DIVISOR).mean(dim=1),
                "clip_cosine": cosines.mean(dim=1)}
