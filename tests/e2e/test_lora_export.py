"""LoRA training, KL references, exact resume, and export for diffusers / peft, on the tiny checkpoint.

Two real training runs of post_train.py (LoRA, and a full fine-tune) feed every test; a third run resumes the LoRA
run from its first checkpoint. Videos are compared in fp32 with deterministic (ODE) sampling from seeded initial
latents: generate.py's own code path (VideoGenerator) against diffusers' HunyuanVideo15Pipeline.
"""

import json
from pathlib import Path

import pytest
import torch
from model_fixtures import TINY_IMAGE_TOKENS, TINY_TEXT
from safetensors.torch import load_file

import post_train
from sage_grpo.models import lora, lora_folder
from sage_grpo.config.train import TrainConfig
from sage_grpo.config.generate import GenerateConfig
from sage_grpo.config.schema import from_dict, load_yaml
from sage_grpo.export.weights import export_checkpoint, read_trained_weights
from sage_grpo.models import load_components, load_transformer
from sage_grpo.pipeline.generation import GenerationItem, VideoGenerator, plan_generation
from sage_grpo.pipeline.rollout import VideoSize, draw_initial_noise, latent_shape, rollout, sample_generators
from sage_grpo.pipeline.sampler import Sampler
from sage_grpo.tracking.run_dir import TIMING_METRICS, read_metrics
from sage_grpo.models.bundle import build_models, resolve_device
from sage_grpo.plan.memory import placement_of
from sage_grpo.rl import kl_mode_of


REPO_ROOT = Path(__file__).resolve().parents[2]
PROMPT, SEED = 'A cat holds a sign that says "hi"', 11
VIDEO = dict(num_frames=5, height=16, width=16)
NUM_STEPS, GUIDANCE = 3, 6.0
TIMING_KEYS = set(TIMING_METRICS)
LORA_FLAGS = ["--use_lora", "true", "--lora_r", "4", "--lora_alpha", "8", "--update_ref_model_step", "1"]
NUM_BLOCK_LINEARS = 14  # LoRA-adapted linears per dual-stream block


def train_args(root, out_dir, *extra):
    return [
        "--pretrained_model_root", str(root), "--output_dir", str(out_dir), "--dtype", "fp32", "--device", "cpu",
        "--sp_size", "1", "--batch_size", "2", "--num_generations", "2", "--grpo_sampling_steps", "2",
        "--sample_n_frames", "5", "--rollout_height", "16", "--rollout_width", "16",
        "--text_max_length", str(TINY_TEXT.max_length), "--byt5_max_length", str(TINY_TEXT.max_length_2),
        "--vision_num_semantic_tokens", str(TINY_IMAGE_TOKENS), "--reward_model", "target_color",
        "--reward_weights", '{"target_color": 1.0}', "--learning_rate", "3e-2", "--validation_interval", "0",
        "--save_interval", "1", "--save_rollout_videos", "false", "--enable_gradient_checkpointing", "false",
        "--kl_weight", "1e-3", "--kl_coef", "1e-4", "--max_steps", "2", *extra,
    ]


@pytest.fixture(scope="module")
def runs(tiny_root, tmp_path_factory):
    """LoRA run (2 steps, checkpoint each step), its resume from checkpoint-1, and a full fine-tune (2 steps)."""
    base = tmp_path_factory.mktemp("runs")
    post_train.main(train_args(tiny_root, base / "lora", *LORA_FLAGS))
    post_train.main(train_args(tiny_root, base / "resumed", *LORA_FLAGS, "--resume_from_checkpoint",
                               str(base / "lora" / "checkpoint-1")))
    post_train.main(train_args(tiny_root, base / "full", "--kl_weight", "0"))
    return base


def generate_config(root, **overrides) -> GenerateConfig:
    values = dict(model_path=str(root), prompt=PROMPT, seed=SEED, dtype="fp32", device="cpu", offloading=False,
                  fixed_size=f"{VIDEO['height']}x{VIDEO['width']}", video_length=VIDEO["num_frames"],
                  num_inference_steps=NUM_STEPS, guidance_scale=GUIDANCE, text_max_length=TINY_TEXT.max_length,
                  byt5_max_length=TINY_TEXT.max_length_2, vision_num_semantic_tokens=TINY_IMAGE_TOKENS)
    values.update(overrides)
    return GenerateConfig(**values)


def generate_video(root, **overrides) -> torch.Tensor:
    """(3, F, H, W) in [0, 1]: exactly what generate.py writes (before uint8 encoding)."""
    config = generate_config(root, **overrides)
    return VideoGenerator(config, plan_generation(config)).render(GenerationItem(PROMPT, SEED))


def diffusers_video(root, transformer) -> torch.Tensor:
    """The same video from diffusers' HunyuanVideo15Pipeline, started from the same seeded latents."""
    from diffusers import ClassifierFreeGuidance, FlowMatchEulerDiscreteScheduler, HunyuanVideo15Pipeline

    c = load_components(root, dtype=torch.float32, load_transformer=False)
    pipe = HunyuanVideo15Pipeline(c.text_encoder, c.tokenizer, transformer, c.vae,
                                  FlowMatchEulerDiscreteScheduler.from_config(c.scheduler_config), c.text_encoder_2,
                                  c.tokenizer_2, ClassifierFreeGuidance(guidance_scale=GUIDANCE))
    pipe.set_progress_bar_config(disable=True)
    pipe.tokenizer_max_length, pipe.tokenizer_2_max_length = TINY_TEXT.max_length, TINY_TEXT.max_length_2
    from sage_grpo.models import PromptEncoder

    pipe.prompt_template_encode_start_idx = PromptEncoder.from_components(c, TINY_TEXT).crop_start
    pipe.vision_num_semantic_tokens = TINY_IMAGE_TOKENS
    latents = draw_initial_noise(sample_generators([SEED]), latent_shape(c.vae.config, **VIDEO))
    frames = pipe(prompt=[PROMPT], negative_prompt=None, latents=latents, num_inference_steps=NUM_STEPS,
                  output_type="pt", **VIDEO).frames  # (1, F, 3, H, W)
    return frames[0].permute(1, 0, 2, 3)


def assert_same_video(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-5)


# ------------------------------------------------------------------ targets


def test_lora_target_modules(tiny_root):
    transformer = load_transformer(tiny_root, dtype=torch.float32)
    default = lora.resolve_target_modules(transformer, None)
    assert default == lora.resolve_target_modules(transformer, ["all-linear"])
    transformer.add_adapter(lora.make_lora_config(2, 2, 0.0, default))
    adapted = {name.rsplit(".lora_A", 1)[0] for name, _ in transformer.named_parameters() if ".lora_A." in name}
    num_blocks = len(transformer.transformer_blocks)
    assert len(adapted) == NUM_BLOCK_LINEARS * num_blocks and all(m.startswith("transformer_blocks.") for m in adapted)
    assert lora.resolve_target_modules(transformer, ["to_q", "to_k"]) == ["to_q", "to_k"]
    regex = r"transformer_blocks\.\d+\.attn\.to_q"
    assert lora.resolve_target_modules(transformer, [regex]) == regex
    with pytest.raises(ValueError, match="not a valid regex"):
        lora.resolve_target_modules(transformer, ["to_q(("])
    with pytest.raises(ValueError, match="cannot be combined"):
        lora.resolve_target_modules(transformer, ["all-linear", "to_q"])


# ------------------------------------------------------------------ training checkpoints


def test_lora_checkpoint_holds_adapter_weights_and_a_peft_folder(runs, tiny_root):
    checkpoint = runs / "lora" / "checkpoint-2"
    state = load_file(str(checkpoint / "transformer" / "model.safetensors"))
    num_blocks = len(load_transformer(tiny_root, dtype=torch.float32).transformer_blocks)
    assert len(state) == 2 * NUM_BLOCK_LINEARS * num_blocks
    assert all(k.startswith("transformer_blocks.") and k.endswith(("lora_A.weight", "lora_B.weight")) for k in state)
    assert max(float(v.abs().max()) for k, v in state.items() if "lora_B" in k) > 0  # B starts at 0: it trained
    # the anchor adapter, refreshed right after every update (--update_ref_model_step 1): the policy's after update 2
    anchor = load_file(str(checkpoint / "anchor" / "model.safetensors"))
    assert set(anchor) == set(state) and all(torch.equal(anchor[k], state[k]) for k in state)


def test_trainer_checkpoint_has_the_peft_adapter_folder(runs):
    """checkpoint-N/lora/ is written by ModelBundle.save_extras, which CheckpointManager.save calls before the
    checkpoint is renamed into place."""
    checkpoint = runs / "lora" / "checkpoint-2"
    state = load_file(str(checkpoint / "transformer" / "model.safetensors"))
    folder = checkpoint / "lora"
    assert lora_folder.is_adapter_folder(folder), "CheckpointManager.save must call models.save_extras"
    config = json.loads((folder / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 8, "LORA")
    adapter = load_file(str(folder / "adapter_model.safetensors"))
    assert adapter.keys() == {lora_folder.PEFT_PREFIX + k for k in state}
    assert all(torch.equal(adapter[lora_folder.PEFT_PREFIX + k], v) for k, v in state.items())


def test_lora_resume_gives_identical_adapter_weights(runs):
    straight, resumed = runs / "lora" / "checkpoint-2", runs / "resumed" / "checkpoint-2"
    for part in ("transformer", "anchor"):
        a = load_file(str(straight / part / "model.safetensors"))
        b = load_file(str(resumed / part / "model.safetensors"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), part
    rows_straight, rows_resumed = read_metrics(runs / "lora"), read_metrics(runs / "resumed")
    assert [r["step"] for r in rows_resumed] == [2]
    assert {k: v for k, v in rows_resumed[0].items() if k not in TIMING_KEYS} == \
        {k: v for k, v in rows_straight[1].items() if k not in TIMING_KEYS}


# ------------------------------------------------------------------ KL references


def test_lora_references_need_no_second_model(runs, tiny_root, tmp_path):
    """Adapters disabled = the base model exactly; after a refresh the anchor adapter = the policy exactly."""
    adapter = export_checkpoint(runs / "lora" / "checkpoint-2", tiny_root, tmp_path / "adapter", export_format="lora")
    values = load_yaml(str(runs / "lora" / "run_config.yaml"))
    values.update(pretrained_lora_path=str(adapter), output_dir=str(tmp_path / "unused"))
    cfg = from_dict(TrainConfig, values)
    bundle = build_models(cfg, kl_mode_of(cfg.trust_region), placement_of(cfg, resolve_device(cfg)))
    assert bundle.reference is bundle.policy and bundle.lora is not None and not bundle.lora.anchor_ready
    trained = load_file(str(runs / "lora" / "checkpoint-2" / "transformer" / "model.safetensors"))
    assert all(torch.equal(bundle.trainable_state_dict()[k], v) for k, v in trained.items())  # pretrained_lora_path
    trainable = [n for n, _ in bundle.trainable_named_parameters()]
    assert len(trainable) == len(trained) and all(".lora_" in n and ".default." in n for n in trainable)

    components = load_components(tiny_root, dtype=torch.float32, load_transformer=False)
    embeds = bundle.encode([PROMPT])

    def sample(transformer):
        sampler = Sampler.euler(NUM_STEPS, 5.0, GUIDANCE, num_image_tokens=TINY_IMAGE_TOKENS)
        return rollout(sampler, transformer, components.vae, embeds, [SEED], VideoSize(**VIDEO), deterministic=True,
                       decode=False).latents

    base = sample(load_transformer(tiny_root, dtype=torch.float32))
    with torch.no_grad():
        policy = sample(bundle.policy)
        with bundle.reference_on_device() as reference:
            fixed = sample(reference)
        bundle.copy_policy_to_reference()
        with bundle.reference_on_device() as reference:
            anchored = sample(reference)
    assert torch.equal(fixed, base) and not torch.equal(policy, base)
    assert torch.equal(anchored, policy)
    assert [n for n, _ in bundle.trainable_named_parameters()] == trainable and bundle.policy.training


# ------------------------------------------------------------------ export


def test_lora_export_reproduces_generate(runs, tiny_root, tmp_path):
    checkpoint = runs / "lora" / "checkpoint-2"
    ours = generate_video(tiny_root, checkpoint_path=str(checkpoint))
    base = generate_video(tiny_root)
    assert float((ours - base).abs().max()) > 1e-3  # the adapter changes the video

    merged = export_checkpoint(checkpoint, tiny_root, tmp_path / "transformer", export_format="transformer")
    from diffusers import HunyuanVideo15Transformer3DModel

    exported = HunyuanVideo15Transformer3DModel.from_pretrained(merged, torch_dtype=torch.float32)
    assert_same_video(diffusers_video(tiny_root, exported), ours)

    adapter = export_checkpoint(checkpoint, tiny_root, tmp_path / "adapter", export_format="lora")
    with_adapter = load_transformer(tiny_root, dtype=torch.float32)
    with_adapter.load_lora_adapter(str(adapter), weight_name=lora_folder.ADAPTER_WEIGHTS_FILE,
                                   prefix="base_model.model", adapter_name="default")
    assert with_adapter.peft_config["default"].lora_alpha == 8
    assert_same_video(diffusers_video(tiny_root, with_adapter), ours)
    # generate.py with the adapter folder on the base model is the same merged model, so the same video exactly
    assert torch.equal(generate_video(tiny_root, lora_path=str(adapter)), ours)


def test_peft_loads_the_adapter_folder(runs, tiny_root, tmp_path):
    from peft import PeftModel

    folder = export_checkpoint(runs / "lora" / "checkpoint-2", tiny_root, tmp_path / "adapter", export_format="lora")
    peft_model = PeftModel.from_pretrained(load_transformer(tiny_root, dtype=torch.float32), str(folder))
    merged = read_trained_weights(runs / "lora" / "checkpoint-2")
    expected = {lora_folder.PEFT_PREFIX + k for k in merged.state}
    loaded = {k.replace(".default.", ".") for k, _ in peft_model.named_parameters() if ".lora_" in k}
    assert loaded == expected
    for name, param in peft_model.named_parameters():
        if ".lora_" in name:
            assert torch.equal(param, merged.state[name.replace(".default.", ".")[len(lora_folder.PEFT_PREFIX):]])


def test_full_finetune_export_round_trips(runs, tiny_root, tmp_path):
    checkpoint = runs / "full" / "checkpoint-2"
    trained = load_file(str(checkpoint / "transformer" / "model.safetensors"))
    folder = export_checkpoint(checkpoint, tiny_root, tmp_path / "exported")
    exported = load_file(str(folder / "diffusion_pytorch_model.safetensors"))
    assert exported.keys() == trained.keys() and all(torch.equal(exported[k], trained[k]) for k in trained)

    from diffusers import HunyuanVideo15Transformer3DModel

    ours = generate_video(tiny_root, checkpoint_path=str(checkpoint))
    assert float((ours - generate_video(tiny_root)).abs().max()) > 1e-3
    transformer = HunyuanVideo15Transformer3DModel.from_pretrained(folder, torch_dtype=torch.float32)
    assert_same_video(diffusers_video(tiny_root, transformer), ours)
    assert torch.equal(generate_video(tiny_root, checkpoint_path=str(folder)), ours)  # the export itself


def test_export_refuses_bad_requests(runs, tiny_root, tmp_path, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("export_checkpoint", REPO_ROOT / "scripts" / "export_checkpoint.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    common = ["--checkpoint", str(runs / "full" / "checkpoint-2"), "--model_root", str(tiny_root)]
    assert script.main([*common, "--output", str(tmp_path / "a"), "--format", "lora"]) == 2
    assert "holds full weights, not a LoRA adapter" in capsys.readouterr().err
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x").write_text("")
    assert script.main([*common, "--output", str(tmp_path / "b")]) == 2
    assert "not empty" in capsys.readouterr().err
    assert script.main(["--checkpoint", str(tmp_path / "none"), "--model_root", str(tiny_root),
                        "--output", str(tmp_path / "c")]) == 2
    assert "no such file or directory" in capsys.readouterr().err


def test_adapter_weights_are_read_from_every_saved_form(runs, tmp_path):
    """peft keys (single process), an injected model's parameter names (gathered sharded weights) and a full DCP
    state dict with the frozen base_layer tensors all give the same adapter and config."""
    import shutil

    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file

    source = runs / "lora" / "checkpoint-2"
    expected = read_trained_weights(source)
    named = {k.replace(".lora_A.", ".lora_A.default.").replace(".lora_B.", ".lora_B.default."): v
             for k, v in expected.state.items()}
    anchor = {k.replace(".default.", ".anchor."): torch.zeros_like(v) for k, v in named.items()}
    frozen = {k.split(".lora_")[0] + ".base_layer.weight": torch.ones(2) for k in named}
    gathered, sharded = tmp_path / "gathered" / "checkpoint-2", tmp_path / "sharded" / "checkpoint-2"
    for checkpoint in (gathered, sharded):
        checkpoint.mkdir(parents=True)
        shutil.copy(source / "config.yaml", checkpoint / "config.yaml")  # no lora/ folder: config from the run
    (gathered / "transformer").mkdir()
    save_file(named, str(gathered / "transformer" / "model.safetensors"))
    dcp.save({"model": {**named, **anchor, **frozen}}, checkpoint_id=str(sharded / "transformer_dcp"))
    for checkpoint in (gathered, sharded):
        weights = read_trained_weights(checkpoint)
        assert weights.is_lora and weights.state.keys() == expected.state.keys()
        assert all(torch.equal(weights.state[k], v) for k, v in expected.state.items())
        config = weights.lora_config
        assert (config.r, config.lora_alpha) == (4, 8) and len(config.target_modules) == len(expected.state) // 2


def test_exports_carry_a_model_card_and_push_only_when_asked(runs, tiny_root, tmp_path, capsys, monkeypatch):
    import importlib.util

    import yaml

    spec = importlib.util.spec_from_file_location("export_checkpoint", REPO_ROOT / "scripts" / "export_checkpoint.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    for run, export_format, what in (("lora", "lora", "A LoRA adapter"), ("lora", "transformer", "LoRA adapter merged"),
                                     ("full", "transformer", "fully fine-tuned")):
        output = tmp_path / f"{run}-{export_format}"
        assert script.main(["--checkpoint", str(runs / run / "checkpoint-2"), "--model_root", str(tiny_root),
                            "--output", str(output), "--format", export_format]) == 0
        card = (output / "README.md").read_text()
        header = yaml.safe_load(card.split("---")[1])
        assert "base_model" not in header and "sage-grpo" in header["tags"]  # trained from the tiny root ...
        assert "not from the released `tencent/HunyuanVideo-1.5`: its transformer has 2 blocks of width 16" in card
        assert what in card and "Exported from `checkpoint-2` (step 2)" in card
        assert "| `--reward_model` | `target_color` |" in card and "| `--sde_type` | `sage_grpo` |" in card
        assert "- steps logged: 2" in card  # the run's metrics.jsonl, up to the checkpoint's step
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    capsys.readouterr()
    output = tmp_path / "pushed"
    assert script.main(["--checkpoint", str(runs / "full" / "checkpoint-2"), "--model_root", str(tiny_root),
                        "--output", str(output), "--push_to_hub", "--hub_model_id", "someone/model"]) == 2
    err = capsys.readouterr().err
    assert "offline mode is on (HF_HUB_OFFLINE=1), nothing was uploaded" in err and (output / "README.md").is_file()
    with pytest.raises(SystemExit):
        script.main(["--checkpoint", "x", "--output", str(tmp_path / "y"), "--push_to_hub"])  # no --hub_model_id
