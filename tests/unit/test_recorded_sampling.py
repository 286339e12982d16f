"""generate.py samples a checkpoint with the settings its run recorded (token lengths, version, guidance) unless a
flag overrides one, which one note names."""

import pytest
import yaml

from sage_grpo.config.generate import GenerateConfig
from sage_grpo.config.schema import parse_cli
from sage_grpo.pipeline.generation import VideoGenerator, plan_generation

RUN = {"pretrained_transformer_version": "480p_t2v", "text_max_length": 32, "byt5_max_length": 16,
       "vision_num_semantic_tokens": 4, "cfg_scale": 4.5, "learning_rate": 1e-5}


@pytest.fixture
def checkpoint(tmp_path):
    folder = tmp_path / "run" / "checkpoint-2"
    (folder / "transformer").mkdir(parents=True)
    (folder / "transformer" / "model.safetensors").touch()  # planning checks the weights exist, reads no tensor
    (folder / "config.yaml").write_text(yaml.safe_dump(RUN))
    return folder


def plan_of(root, *flags):
    return plan_generation(parse_cli(GenerateConfig, ["--prompt", "A cat", "--model_path", str(root), *flags]))


def test_a_checkpoint_is_sampled_at_its_recorded_settings(tiny_root, checkpoint):
    for weights in (checkpoint, checkpoint / "transformer"):  # the checkpoint dir or its weights folder
        plan = plan_of(tiny_root, "--checkpoint_path", str(weights))
        config = plan.config
        assert (config.text_max_length, config.byt5_max_length, config.vision_num_semantic_tokens) == (32, 16, 4)
        assert (plan.transformer_version, plan.guidance_scale) == ("480p_t2v", 4.5)
        recorded = [note for note in plan.notes if note.startswith("sampling settings from")]
        assert recorded == [f"sampling settings from {checkpoint / 'config.yaml'}: --text_max_length 32, "
                            "--byt5_max_length 16, --vision_num_semantic_tokens 4, --model_version 480p_t2v, "
                            "--guidance_scale 4.5, --resolution 480p"]
        assert not any(note.startswith("flags override") for note in plan.notes)
    # without a checkpoint: the pipeline's lengths and the variant's guidance
    plain = plan_of(tiny_root)
    assert (plain.config.text_max_length, plain.config.byt5_max_length, plain.guidance_scale) == (None, 256, 6.0)


def test_a_flag_overrides_a_recorded_setting_in_one_note(tiny_root, checkpoint):
    plan = plan_of(tiny_root, "--checkpoint_path", str(checkpoint), "--text_max_length", "64",
                   "--guidance_scale", "4.5", "--resolution", "480p")
    assert (plan.config.text_max_length, plan.config.byt5_max_length, plan.guidance_scale) == (64, 16, 4.5)
    overrides = [note for note in plan.notes if note.startswith("flags override")]
    assert overrides == [f"flags override what {checkpoint / 'config.yaml'} records: --text_max_length 64 (the "
                         "checkpoint's 32)"]  # equal values (guidance, version) are no override


def test_the_generator_encodes_at_the_recorded_lengths(tiny_root, checkpoint):
    from safetensors.torch import save_file

    from sage_grpo.models.loading import load_transformer

    state = load_transformer(tiny_root, "480p_t2v").state_dict()
    save_file({k: v.contiguous() for k, v in state.items()}, str(checkpoint / "transformer" / "model.safetensors"))
    config = GenerateConfig(prompt="A cat", model_path=str(tiny_root), checkpoint_path=str(checkpoint),
                            dtype="fp32", device="cpu", offloading=False, fixed_size="16x16", video_length=5)
    generator = VideoGenerator(config, plan_generation(config))
    assert (generator.encoder.settings.max_length, generator.encoder.settings.max_length_2) == (32, 16)
    embeds = generator.encoder.encode(["A cat"])
    assert embeds.embeds.shape[1] == 32 and embeds.embeds_2.shape[1] == 16
