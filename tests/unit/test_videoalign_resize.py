"""VideoAlign's two frame resizes: qwen-vl-utils' ``smart_resize`` (VideoAlign's copy) and then the Qwen2-VL video
processor's own, which differ in where a side is kept at least one 28-pixel factor. Extreme aspect ratios are where
the two differ; the processor's sizes are checked against transformers' function itself."""

import re
from pathlib import Path

import pytest
import torch
import transformers.models.qwen2_vl as qwen2_vl
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as transformers_smart_resize

from sage_grpo.rewards.video_preprocess import processor_smart_resize, smart_resize
from sage_grpo.rewards.videoalign_inputs import FrameSampler, VideoInputSpec

# (height, width) from square to the 200:1 limit, both orientations, below and above the budgets used below
SIDES = [(28, 5600), (5600, 28), (30, 5999), (33, 3000), (14, 2800), (56, 11200), (100, 19000), (480, 848),
         (29, 5000), (7, 1400), (1, 200), (27, 41), (2000, 3)]
BUDGETS = [(56 * 56, 28 * 28 * 100), (128 * 28 * 28, 448 * 448), (56 * 56, 28 * 28 * 1280), (784, 784)]


def _smart_resize_text(module: str) -> str:
    text = (Path(qwen2_vl.__file__).parent / f"{module}.py").read_text()
    return re.search(r"^def smart_resize\(.*?^    return h_bar, w_bar$", text, re.S | re.M).group(0)


def test_the_video_processors_smart_resize_is_the_one_compared():
    # the video processor module imports torchvision (unusable here); its function is the PIL module's, verbatim
    assert _smart_resize_text("video_processing_qwen2_vl") == _smart_resize_text("image_processing_pil_qwen2_vl")


@pytest.mark.parametrize("budget", BUDGETS)
def test_the_processors_smart_resize_equals_transformers(budget):
    for height, width in SIDES:
        if max(height, width) / min(height, width) > 200:
            continue
        expected = transformers_smart_resize(height, width, factor=28, min_pixels=budget[0], max_pixels=budget[1])
        assert processor_smart_resize(height, width, factor=28, min_pixels=budget[0],
                                      max_pixels=budget[1]) == expected, (height, width, budget)


def test_an_extreme_aspect_ratio_keeps_one_factor_in_the_processors_shrink():
    # 28x5600 over a 78400-pixel budget: beta = sqrt(156800 / 78400) = 1.414; 28 / beta = 19.8 floors to 0, which
    # the processor lifts to 28 (5600 / beta = 3959.8 -> 3948). qwen-vl-utils' copy has no such floor.
    assert transformers_smart_resize(28, 5600, factor=28, min_pixels=3136, max_pixels=78400) == (28, 3948)
    assert processor_smart_resize(28, 5600, factor=28, min_pixels=3136, max_pixels=78400) == (28, 3948)
    assert smart_resize(28, 5600, factor=28, min_pixels=3136, max_pixels=78400) == (0, 3948)


def test_the_frame_sampler_resizes_an_extreme_frame_as_the_processor():
    # qwen-vl-utils keeps 28x5600 (inside its budget), the processor then shrinks it to its own 78400 pixels
    spec = VideoInputSpec(max_pixels=28 * 5600, min_pixels=784, processor_min_pixels=3136,
                          processor_max_pixels=78400)
    frames = torch.rand(2, 3, 28, 5600) * 255.0
    assert tuple(FrameSampler(spec).resize(frames, quantize=False).shape) == (2, 3, 28, 3948)
    wide = VideoInputSpec(max_pixels=78400, min_pixels=784)  # qwen-vl-utils' own shrink floors 19.8 rows to 0
    with pytest.raises(ValueError, match=r"a 28x5600 video shrinks to 0x3948 under the pixel budget 78400"):
        FrameSampler(wide).resize(frames, quantize=False)
