"""CLIPScore (Hessel's 2.5·max(cos, 0) and Flow-GRPO's logit / 30) and PickScore (sage_grpo/rewards/clip_score.py,
pick_score.py) on the tiny random-weight CLIP models: equal to transformers' own CLIPModel forward (its
logits_per_image = exp(logit_scale) * cosine) on the same frames."""

import pytest
import torch

from sage_grpo.rewards.clip_score import ClipScore, frames_as_images, resolve_model_folder
from sage_grpo.rewards.pick_score import PickScore
from sage_grpo.rewards.tiny import PICKSCORE_LOGIT_SCALE, write_tiny_clip_scorers

PROMPTS = ["a red ball bounces", "a cat walks on the grass"]


@pytest.fixture(scope="module")
def scorer_root(tmp_path_factory):
    return write_tiny_clip_scorers(tmp_path_factory.mktemp("scorers"), seed=0)


@pytest.fixture(scope="module")
def videos():
    generator = torch.Generator().manual_seed(0)
    return torch.rand(2, 3, 3, 20, 24, generator=generator)  # (B, 3, F, H, W): 2 videos of 3 frames


def direct_logits(model_dir, processor_dir, videos, prompts):
    """(B, F) exp(logit_scale) * cosine straight from CLIPModel.forward, one video at a time."""
    from transformers import CLIPModel, CLIPProcessor

    model = CLIPModel.from_pretrained(model_dir, local_files_only=True, use_safetensors=True).eval()
    processor = CLIPProcessor.from_pretrained(processor_dir, local_files_only=True)
    rows = []
    for b, prompt in enumerate(prompts):
        inputs = processor(text=[prompt], images=frames_as_images(videos[b:b + 1]), return_tensors="pt",
                           padding=True)
        with torch.no_grad():
            rows.append(model(**inputs).logits_per_image[:, 0])  # (F,)
    return torch.stack(rows), float(model.logit_scale.detach().exp())


def test_clipscore_equals_a_direct_clipmodel_computation(scorer_root, videos):
    folder = scorer_root / "clip-vit-large-patch14"
    logits, scale = direct_logits(folder, folder, videos, PROMPTS)
    cosines = logits / scale  # (B, F)
    scores = ClipScore(folder)(videos, PROMPTS)
    torch.testing.assert_close(scores["clip_cosine"], cosines.mean(dim=1), atol=1e-6, rtol=0)
    torch.testing.assert_close(scores["clipscore"], (2.5 * cosines.clamp(min=0)).mean(dim=1), atol=1e-6, rtol=0)
    # Flow-GRPO's CLIP scorer: CLIPModel's logits_per_image / 30, with the model's own temperature (the tiny model
    # keeps CLIP's initial exp(2.6592) = 14.3, not ViT-L/14's 100), not clamped at 0; per frame, then averaged
    assert scale == pytest.approx(14.2857, rel=1e-4)
    torch.testing.assert_close(scores["clip_flowgrpo"], (logits / 30).mean(dim=1), atol=1e-6, rtol=0)
    assert list(scores) == ["clipscore", "clip_flowgrpo", "clip_cosine"]
    assert scores["clip_cosine"].shape == (2,) and not torch.equal(scores["clip_cosine"][0], scores["clip_cosine"][1])


def test_pickscore_equals_the_model_cards_logit(scorer_root, videos):
    model_dir, processor_dir = scorer_root / "PickScore_v1", scorer_root / "CLIP-ViT-H-14-laion2B-s32B-b79K"
    logits, scale = direct_logits(model_dir, processor_dir, videos, PROMPTS)
    assert scale == pytest.approx(100.0, rel=1e-4)  # the tiny model carries PickScore's temperature, ln 100
    scores = PickScore(model_dir, processor_dir)(videos, PROMPTS)
    torch.testing.assert_close(scores["pickscore"], logits.mean(dim=1), atol=1e-6 * scale, rtol=0)
    torch.testing.assert_close(scores["pickscore_cosine"], (logits / scale).mean(dim=1), atol=1e-6, rtol=0)
    assert PICKSCORE_LOGIT_SCALE == pytest.approx(torch.log(torch.tensor(100.0)).item(), abs=1e-4)


def test_scores_depend_on_the_prompt(scorer_root, videos):
    scorer = ClipScore(scorer_root / "clip-vit-large-patch14")
    swapped = scorer(videos, PROMPTS[::-1])["clip_cosine"]
    assert not torch.allclose(scorer(videos, PROMPTS)["clip_cosine"], swapped)


def test_model_folder_is_a_folder_or_the_repo_name_under_the_root(scorer_root, tmp_path):
    assert resolve_model_folder("openai/clip-vit-large-patch14", scorer_root, "--clip_model") == \
        scorer_root / "clip-vit-large-patch14"
    given = scorer_root / "PickScore_v1"
    assert resolve_model_folder(str(given), tmp_path, "--pickscore_model") == given
    with pytest.raises(FileNotFoundError, match="--clip_model openai/nope.*download_weights.sh --eval_scorers"):
        resolve_model_folder("openai/nope", scorer_root, "--clip_model")
