"""``export --format pipeline`` on the tiny checkpoints: the folder loads with diffusers' ``from_pretrained`` as it is
and renders the frames generate.py renders from the same checkpoint; the i2v export loads as the i2v pipeline."""

import json
import os

import pytest
import torch
import yaml
from model_fixtures import TINY_IMAGE_TOKENS, TINY_TEXT
from safetensors.torch import save_file

from sage_grpo.config.generate import GenerateConfig
from sage_grpo.export.pipeline import SAMPLING_FILE, apply_sampling_settings
from sage_grpo.export.weights import export_checkpoint
from sage_grpo.models.loading import load_transformer
from sage_grpo.pipeline.generation import GenerationItem, VideoGenerator, plan_generation

PROMPT, SEED, NUM_STEPS = 'A cat holds a sign that says "hi"', 11, 3
VIDEO = dict(num_frames=5, height=16, width=16)
TINY_LENGTHS = {"text_max_length": TINY_TEXT.max_length, "byt5_max_length": TINY_TEXT.max_length_2,
                "vision_num_semantic_tokens": TINY_IMAGE_TOKENS}


def fake_checkpoint(root, version, folder):
    """A ``checkpoint-3/`` of a full fine-tune: every weight moved off the base, the run's config.yaml beside it."""
    transformer = load_transformer(root, version, dtype=torch.float32, device="cpu")
    generator = torch.Generator().manual_seed(0)
    state = {k: v + 0.02 * torch.randn(v.shape, generator=generator) for k, v in transformer.state_dict().items()}
    checkpoint = folder / "checkpoint-3"
    (checkpoint / "transformer").mkdir(parents=True)
    save_file(state, str(checkpoint / "transformer" / "model.safetensors"))
    config = {"pretrained_transformer_version": version, "seed": 7, **TINY_LENGTHS}
    (checkpoint / "config.yaml").write_text(yaml.safe_dump(config))
    return checkpoint


@pytest.fixture(scope="module")
def t2v_export(tiny_root, tmp_path_factory):
    folder = tmp_path_factory.mktemp("pipeline_export")
    checkpoint = fake_checkpoint(tiny_root, "480p_t2v", folder)
    export_checkpoint(checkpoint, tiny_root, folder / "pipe", export_format="pipeline")
    return checkpoint, folder / "pipe"


def test_pipeline_folder_layout_and_card(t2v_export, tiny_root):
    _, output = t2v_export
    index = json.loads((output / "model_index.json").read_text())
    assert index["_class_name"] == "HunyuanVideo15Pipeline"
    assert index["tokenizer_2"] == ["transformers", "ByT5Tokenizer"] and index["vae"][0] == "diffusers"
    assert "image_encoder" not in index
    for name in ("vae", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2"):  # linked, not copied
        assert (output / name).is_symlink() and os.path.samefile(output / name, tiny_root / name)
    assert not (output / "transformer").is_symlink() and (output / "transformer" / "config.json").is_file()
    record = json.loads((output / SAMPLING_FILE).read_text())
    assert record["guidance_scale"] == 6.0 and record["flow_shift"] == 5.0
    attributes = record["pipeline_attributes"]
    assert (attributes["tokenizer_max_length"], attributes["tokenizer_2_max_length"],
            attributes["vision_num_semantic_tokens"]) == (16, 8, 4)
    card = (output / "README.md").read_text()
    assert 'pipe = HunyuanVideo15Pipeline.from_pretrained("<this folder>", dtype=torch.bfloat16)' in card
    assert "pipe.tokenizer_max_length = 16" in card and "pipe.vision_num_semantic_tokens = 4" in card
    assert "pipe.tokenizer_2_max_length = 8" in card


def test_loaded_pipeline_renders_generate_py_frames(t2v_export, tiny_root):
    from diffusers import HunyuanVideo15Pipeline

    checkpoint, output = t2v_export
    pipe = apply_sampling_settings(HunyuanVideo15Pipeline.from_pretrained(str(output), dtype=torch.float32),
                                   output)
    pipe.set_progress_bar_config(disable=True)
    frames = pipe(prompt=PROMPT, negative_prompt=None, num_inference_steps=NUM_STEPS, output_type="pt",
                  generator=torch.Generator().manual_seed(SEED), **VIDEO).frames  # (1, F, 3, H, W)
    config = GenerateConfig(model_path=str(tiny_root), checkpoint_path=str(checkpoint), prompt=PROMPT, seed=SEED,
                            dtype="fp32", device="cpu", offloading=False, video_length=VIDEO["num_frames"],
                            fixed_size=f"{VIDEO['height']}x{VIDEO['width']}", num_inference_steps=NUM_STEPS)
    # the token lengths: the checkpoint's recorded ones (generate.py's defaults for it), which the export recorded too
    ours = VideoGenerator(config, plan_generation(config)).render(GenerationItem(PROMPT, SEED))  # (3, F, H, W)
    assert ours.std() > 0
    difference = (frames[0].permute(1, 0, 2, 3) - ours).abs().max().item()
    print(f"max |pipeline - generate.py| = {difference:.3g}")
    assert difference <= 1e-5, difference
    base = GenerateConfig(**{**config.__dict__, "checkpoint_path": None})  # the export carries the trained weights
    base_video = VideoGenerator(base, plan_generation(base)).render(GenerationItem(PROMPT, SEED))
    assert (base_video - ours).abs().max() > 1e-3


def test_i2v_export_loads_as_the_image_to_video_pipeline(tiny_i2v_root, tmp_path):
    from diffusers import HunyuanVideo15ImageToVideoPipeline

    checkpoint = fake_checkpoint(tiny_i2v_root, "480p_i2v", tmp_path)
    output = export_checkpoint(checkpoint, tiny_i2v_root, tmp_path / "pipe", export_format="pipeline",
                               link_components="copy")
    index = json.loads((output / "model_index.json").read_text())
    assert index["_class_name"] == "HunyuanVideo15ImageToVideoPipeline"
    assert index["image_encoder"] == ["transformers", "SiglipVisionModel"]
    assert not (output / "image_encoder").is_symlink() and (output / "image_encoder" / "config.json").is_file()
    pipe = HunyuanVideo15ImageToVideoPipeline.from_pretrained(str(output), dtype=torch.float32)
    trained = load_transformer(tiny_i2v_root, "480p_i2v", dtype=torch.float32, device="cpu")
    assert not torch.equal(pipe.transformer.proj_out.weight, trained.proj_out.weight)  # the trained weights
    assert "from diffusers import HunyuanVideo15ImageToVideoPipeline" in (output / "README.md").read_text()
