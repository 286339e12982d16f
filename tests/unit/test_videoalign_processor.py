"""VideoAlign compatibility: the tiny checkpoint's config is one VideoAlign's own code loads, and our frames match
transformers' own ``Qwen2VLVideoProcessor``: the reference hands the processor the
frames qwen-vl-utils resized, and the processor resizes them again to its own pixel budget (its ``min_pixels`` /
``max_pixels``). The processor runs in a subprocess on the torchvision stand-in (tests/torchvision_stub.py: only
torchvision's tensor kernels, which are torch's own); everything else (reading the budget from the checkpoint's
processor config, the size decision, rescale, normalisation, patch layout) is transformers' code."""
import json
import os
import sys

import pytest
import torch
from procs import run_group
from torchvision_stub import write_torchvision_stub

from sage_grpo.rewards.tiny import BASE_DIRNAME
from sage_grpo.rewards.video_preprocess import VIDEO_MIN_PIXELS, resize_frames, sample_frame_indices, smart_resize
from sage_grpo.rewards.videoalign import processor_pixel_budget
from sage_grpo.rewards.videoalign_inputs import FrameSampler, VideoAlignInputBuilder, VideoInputSpec

PROCESSOR = """
import sys
import torch
from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor
base, inputs, output = sys.argv[1:4]
processor = Qwen2VLVideoProcessor.from_pretrained(base, local_files_only=True)
results = []
for frames in torch.load(inputs):
    batch = processor(videos=[frames], do_sample_frames=False, cap_pixels_per_frame=False, do_rescale=True,
                      return_tensors="pt")
    results.append((batch["pixel_values_videos"], batch["video_grid_thw"]))
torch.save({"budget": [processor.size.shortest_edge, processor.size.longest_edge], "results": results}, output)
"""


def _first_resize(spec: VideoInputSpec, picked: torch.Tensor, quantize: bool) -> torch.Tensor:
    """What qwen-vl-utils hands the processor: the sampled frames at the checkpoint's budget (float)."""
    size = smart_resize(*picked.shape[-2:], factor=28, min_pixels=spec.min_pixels, max_pixels=spec.max_pixels)
    return resize_frames(picked, size, quantize=quantize)


def test_the_processors_second_resize_is_reproduced(tiny_reward_root, tmp_path):
    base = tiny_reward_root / "VideoReward" / BASE_DIRNAME
    budget = processor_pixel_budget(base)
    assert budget == (56 * 56, 28 * 28 * 1280)  # the tiny base's preprocessor_config.json
    gen = torch.Generator().manual_seed(0)
    # 1. a file at a budget below the processor's minimum: qwen-vl-utils shrinks 64x96 to 28x28 (784 px), the
    #    processor enlarges it to 56x56 (3136 px); 2. a rollout tensor whose frames already fit (112x168 -> 56x84):
    #    the processor leaves them as they are
    small = VideoInputSpec(max_pixels=28 * 56, processor_min_pixels=budget[0], processor_max_pixels=budget[1])
    fits = VideoInputSpec(max_pixels=56 * 84, processor_min_pixels=budget[0], processor_max_pixels=budget[1])
    file_frames = torch.randint(0, 256, (9, 64, 96, 3), dtype=torch.uint8, generator=gen)
    rollout = torch.rand(3, 9, 112, 168, generator=gen)
    indices = sample_frame_indices(9, 4)  # 9 frames at 24 fps, 2 fps -> 4
    handed = [_first_resize(small, file_frames[indices].permute(0, 3, 1, 2).float(), quantize=True),
              _first_resize(fits, rollout[:, indices].permute(1, 0, 2, 3) * 255.0, quantize=False)]
    assert [tuple(f.shape[-2:]) for f in handed] == [(28, 28), (56, 84)]
    ours = [FrameSampler(small).frames_from_uint8(file_frames, 24.0),
            FrameSampler(fits).frames_from_tensor(rollout, 24.0)]

    torch.save(handed, tmp_path / "inputs.pt")
    stub = write_torchvision_stub(tmp_path / "stub")
    proc = run_group([sys.executable, "-c", PROCESSOR, str(base), str(tmp_path / "inputs.pt"), str(tmp_path / "out.pt")],
                     timeout=120, env=dict(os.environ, PYTHONPATH=str(stub), HF_HUB_OFFLINE="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    reference = torch.load(tmp_path / "out.pt")
    assert tuple(reference["budget"]) == budget  # transformers reads the same budget from the same file
    builder = VideoAlignInputBuilder.__new__(VideoAlignInputBuilder)  # the video half only: no tokenizer needed
    for spec, frames, (pixels, grid) in zip((small, fits), ours, reference["results"]):
        builder.spec = spec
        patches, our_grid = builder.patchify(frames)
        assert list(our_grid) == grid[0].tolist()
        torch.testing.assert_close(patches, pixels, atol=2e-5, rtol=0)
    assert [g[0].tolist() for _, g in reference["results"]] == [[2, 4, 4], [2, 4, 6]]


@pytest.mark.parametrize("files, expected", [
    ({}, (128 * 28 * 28, 28 * 28 * 768)),  # no config: the processor class's defaults
    ({"preprocessor_config.json": '{"min_pixels": 3136, "max_pixels": 12845056}'}, (3136, 12845056)),
    ({"preprocessor_config.json": '{"size": {"shortest_edge": 1000, "longest_edge": 5000}}'}, (1000, 5000)),
    ({"video_preprocessor_config.json": '{"size": {"shortest_edge": 784, "longest_edge": 9000}}',
      "preprocessor_config.json": '{"min_pixels": 3136, "max_pixels": 12845056}'}, (784, 9000)),
])
def test_processor_budget_is_read_as_transformers_reads_it(tmp_path, files, expected):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert processor_pixel_budget(tmp_path) == expected
    assert VIDEO_MIN_PIXELS == 128 * 28 * 28


# The fields of VideoAlign's config dataclasses (KwaiVGI/VideoAlign: data.py DataConfig, utils.py ModelConfig and
# PEFTLoraConfig). Its inference.py deletes data_config's meta_data and data_dir, then builds the three dataclasses
# from the sections: a key beyond these fields is a TypeError there.
VIDEOALIGN_DATA_FIELDS = {"meta_data_test", "max_frame_pixels", "num_frames", "fps", "p_shuffle_frames",
                          "p_color_jitter", "eval_dim", "prompt_template_type", "add_noise", "sample_type",
                          "use_tied_data"}
VIDEOALIGN_MODEL_FIELDS = {"model_name_or_path", "model_revision", "output_dim", "use_special_tokens",
                           "freeze_vision_tower", "freeze_llm", "tune_merger", "torch_dtype", "trust_remote_code",
                           "attn_implementation", "load_in_8bit", "load_in_4bit", "bnb_4bit_quant_type",
                           "use_bnb_nested_quant", "reward_token", "loss_type"}
VIDEOALIGN_LORA_FIELDS = {"lora_enable", "vision_lora", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules",
                          "lora_namespan_exclude", "lora_modules_to_save", "lora_task_type", "use_rslora",
                          "num_lora_modules"}


def test_tiny_config_holds_only_keys_videoaligns_own_code_accepts(tiny_reward_root):
    config = json.loads((tiny_reward_root / "VideoReward" / "model_config.json").read_text())
    assert {"meta_data", "data_dir"} <= set(config["data_config"])
    assert set(config["data_config"]) - {"meta_data", "data_dir"} <= VIDEOALIGN_DATA_FIELDS
    assert set(config["model_config"]) <= VIDEOALIGN_MODEL_FIELDS
    assert set(config["peft_lora_config"]) <= VIDEOALIGN_LORA_FIELDS
