"""The reference-checkpoint converter (sage_grpo/models/convert.py): the key tables, complete-or-refuse checks, and a
tiny checkpoint written in the reference's layout and converted back, whose models compute what the original's do."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from model_fixtures import TINY_IMAGE_TOKENS, TINY_TEXT
from reference_layout import GLYPH_COLORS, GLYPH_FONTS, write_reference_layout
from sage_grpo.cli.convert import main as convert_main
from sage_grpo.models import layout
from sage_grpo.models.convert import ConversionError, check_complete
from sage_grpo.models.convert_keys import TRANSFORMER_KEYS, VAE_KEYS, to_diffusers_keys, to_reference_keys

PROMPTS = ['A girl holding a paper with words "Hello, world!"', "A cat walks on the grass, realistic."]


def _tiny_weights(tiny_root, component):
    return load_file(str(tiny_root / component / "diffusion_pytorch_model.safetensors"))


@pytest.fixture(scope="module")
def converted(tiny_root, tmp_path_factory):
    base = tmp_path_factory.mktemp("convert")
    reference = write_reference_layout(tiny_root, base / "reference")
    output = base / "converted"
    assert convert_main(["--reference_root", str(reference), "--output", str(output)]) == 0
    return reference, output


def test_transformer_table_names_the_reference_modules(tiny_root):
    """A few keys spelled as in Tencent's HunyuanVideo_1_5_DiffusionTransformer, and the two value changes."""
    diffusers_state = _tiny_weights(tiny_root, "transformer/480p_t2v")
    reference, unmapped = to_reference_keys(diffusers_state, TRANSFORMER_KEYS)
    assert not unmapped
    for key in ("double_blocks.1.img_attn_q.weight", "double_blocks.0.txt_attn_k_norm.weight", "img_in.proj.weight",
                "txt_in.individual_token_refiner.blocks.0.adaLN_modulation.1.bias", "byt5_in.fc3.weight",
                "vision_in.proj.4.bias", "cond_type_embedding.weight", "final_layer.linear.weight"):
        assert key in reference, key
    prefix = "context_embedder.token_refiner.refiner_blocks.0.attn."
    qkv = reference["txt_in.individual_token_refiner.blocks.0.self_attn_qkv.weight"]  # rows: q, then k, then v
    assert torch.equal(qkv, torch.cat([diffusers_state[prefix + f"to_{p}.weight"] for p in "qkv"]))
    shift_scale = reference["final_layer.adaLN_modulation.1.weight"]  # (shift, scale); diffusers: (scale, shift)
    scale, shift = diffusers_state["norm_out.linear.weight"].chunk(2)
    assert torch.equal(shift_scale, torch.cat([shift, scale]))
    assert len(reference) == len(diffusers_state) - 2 * 2  # per refiner block, three q/k/v tensors fused into one


def test_a_meanflow_transformer_converts_its_second_time_embedder():
    """480p_i2v_step_distilled (use_meanflow): Tencent's time_r_in is diffusers' time_embed.timestep_embedder_r."""
    from diffusers import HunyuanVideo15Transformer3DModel

    from sage_grpo.models.tiny import TINY_TRANSFORMER_CONFIG

    state = HunyuanVideo15Transformer3DModel(**dict(TINY_TRANSFORMER_CONFIG, use_meanflow=True)).state_dict()
    reference, unmapped = to_reference_keys(state, TRANSFORMER_KEYS)
    assert not unmapped
    for n, linear in ((0, 1), (2, 2)):
        assert torch.equal(reference[f"time_r_in.mlp.{n}.weight"],
                           state[f"time_embed.timestep_embedder_r.linear_{linear}.weight"])
    back, unmapped = to_diffusers_keys(reference, TRANSFORMER_KEYS)
    assert not unmapped and back.keys() == state.keys()


@pytest.mark.parametrize("component, rules", [("transformer/480p_t2v", TRANSFORMER_KEYS), ("vae", VAE_KEYS)])
def test_tables_round_trip_every_tensor(tiny_root, component, rules):
    state = _tiny_weights(tiny_root, component)
    reference, unmapped = to_reference_keys(state, rules)
    assert not unmapped and reference.keys() != state.keys()
    back, unmapped = to_diffusers_keys(reference, rules)
    assert not unmapped and back.keys() == state.keys()
    assert all(torch.equal(back[k], v) for k, v in state.items())


def test_incomplete_conversions_list_every_problem(tiny_components):
    model = tiny_components.vae
    state = dict(model.state_dict())
    state.pop("decoder.conv_out.conv.bias")
    state["encoder.conv_in.conv.weight"] = torch.zeros(1)
    state["decoder.extra.weight"] = torch.zeros(1)
    with pytest.raises(ConversionError) as err:
        check_complete("vae x", state, model, unmapped=["encoder.mystery.weight"])
    message = str(err.value)
    for expected in ("reference keys no rule maps (1)", "encoder.mystery.weight", "model keys not produced (1)",
                     "decoder.conv_out.conv.bias", "keys the model does not have (1)", "decoder.extra.weight",
                     "shape mismatches (1)", "encoder.conv_in.conv.weight: converted (1,)"):
        assert expected in message, expected


def test_converted_checkpoint_computes_what_the_original_does(converted, tiny_root, tiny_components, tiny_encoder):
    from sage_grpo.models import PromptEncoder, load_components
    from sage_grpo.cli.verify import main as verify_main
    from sage_grpo.pipeline.rollout import decode_latents
    from sage_grpo.pipeline.velocity import cfg_velocity

    _, output = converted
    assert verify_main(["--model_root", str(output)]) == 0
    ours = load_components(output, dtype=torch.float32)
    embeds = PromptEncoder.from_components(ours, TINY_TEXT).encode(PROMPTS)
    expected_embeds = tiny_encoder.encode(PROMPTS)
    for mine, theirs in zip(embeds.positive() + embeds.negative(), expected_embeds.positive() +
                            expected_embeds.negative()):
        assert torch.equal(mine, theirs)
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(len(PROMPTS), 4, 2, 2, 2, generator=generator)
    timesteps = torch.tensor([900.0, 250.0])
    with torch.no_grad():
        velocity = cfg_velocity(ours.transformer, latents, timesteps, embeds, 6.0, num_image_tokens=TINY_IMAGE_TOKENS)
        expected = cfg_velocity(tiny_components.transformer, latents, timesteps, expected_embeds, 6.0,
                                num_image_tokens=TINY_IMAGE_TOKENS)
        assert velocity.abs().max() > 0 and torch.equal(velocity, expected)
        assert torch.equal(decode_latents(ours.vae, latents), decode_latents(tiny_components.vae, latents))
    shift = json.loads((output / "scheduler" / "scheduler_config.json").read_text())["shift"]
    assert shift == 5.0  # the 480p version's flow shift


def test_glyph_tokens_are_added_with_their_embedding_rows(converted, tiny_components):
    from sage_grpo.models import load_components

    reference, output = converted
    ours = load_components(output, dtype=torch.float32, load_transformer=False, load_vae=False)
    base_vocab = len(tiny_components.tokenizer_2)
    tokens = ["<color-0>", "<color-1>", "<en-font-0>", "<zh-font-1>"]
    assert len(tokens) == len(GLYPH_COLORS) + len(GLYPH_FONTS)
    assert ours.tokenizer_2.convert_tokens_to_ids(tokens) == list(range(base_vocab, base_vocab + len(tokens)))
    glyph = torch.load(reference / "text_encoder/Glyph-SDXL-v2/checkpoints/byt5_model.pt", weights_only=True)
    rows = glyph["state_dict"]["module.text_tower.encoder.embed_tokens.weight"]
    assert torch.equal(ours.text_encoder_2.get_input_embeddings().weight, rows.float())
    assert ours.tokenizer.padding_side == "right"  # the reference folder's tokenizer pads on the left
    head = load_file(str(output / "text_encoder" / "model.safetensors"))
    assert not any(k.startswith(("visual.", "lm_head.", "model.")) for k in head)  # language model only


def test_existing_output_folders_are_kept_unless_overwrite(converted, tmp_path, capsys):
    reference, output = converted
    before = (output / "vae" / "diffusion_pytorch_model.safetensors").stat().st_mtime_ns
    assert convert_main(["--reference_root", str(reference), "--output", str(output), "--components", "vae"]) == 2
    err = capsys.readouterr().err
    assert "already holds ['vae']" in err and "--overwrite" in err
    assert (output / "vae" / "diffusion_pytorch_model.safetensors").stat().st_mtime_ns == before
    fresh = tmp_path / "out"
    (fresh / "VideoReward").mkdir(parents=True)  # other folders of the output are left alone
    assert convert_main(["--reference_root", str(reference), "--output", str(fresh), "--components", "vae"]) == 0
    assert convert_main(["--reference_root", str(reference), "--output", str(fresh), "--components", "vae",
                         "--overwrite"]) == 0
    assert sorted(p.name for p in fresh.iterdir()) == ["VideoReward", "vae"]
    snapshot = tmp_path / "snapshot_vae"  # download_weights.sh's folders are links into .hf/ snapshots
    snapshot.mkdir()
    (snapshot / "kept").write_text("")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "vae").symlink_to(snapshot)
    assert convert_main(["--reference_root", str(reference), "--output", str(linked), "--components", "vae",
                         "--overwrite"]) == 0
    assert not (linked / "vae").is_symlink() and (linked / "vae" / "config.json").is_file()
    assert (snapshot / "kept").is_file()  # the link is replaced, not what it points to
    assert convert_main(["--reference_root", str(reference), "--output", str(reference), "--overwrite"]) == 2
    assert "is the reference root" in capsys.readouterr().err


def test_bad_reference_folders_fail_before_writing(converted, tmp_path, capsys):
    reference, _ = converted
    broken = tmp_path / "broken"
    (broken / "transformer" / "480p_t2v").mkdir(parents=True)
    (broken / "transformer" / "480p_t2v" / "config.json").write_text("{}")
    torch.save({"x": torch.zeros(1)}, broken / "transformer" / "480p_t2v" / "model.pt")
    output = tmp_path / "out"
    assert convert_main(["--reference_root", str(broken), "--output", str(output), "--components", "transformer"]) == 2
    assert "no diffusion_pytorch_model*.safetensors" in capsys.readouterr().err and not output.exists()
    assert convert_main(["--reference_root", str(reference), "--output", str(output), "--versions", "540p_t2v"]) == 2
    assert "'540p_t2v'" in capsys.readouterr().err
    # an extra tensor in the reference's transformer (e.g. a guidance embedder) is named, and nothing is written
    extra = tmp_path / "extra"
    folder = extra / "transformer" / "480p_t2v"
    folder.mkdir(parents=True)
    state = load_file(str(reference / "transformer" / "480p_t2v" / "diffusion_pytorch_model.safetensors"))
    state["guidance_in.mlp.0.weight"] = torch.zeros(2)
    save_file(state, str(folder / "diffusion_pytorch_model.safetensors"))
    (folder / "config.json").write_text((reference / "transformer" / "480p_t2v" / "config.json").read_text())
    assert convert_main(["--reference_root", str(extra), "--output", str(output), "--components", "transformer"]) == 2
    assert "guidance_in.mlp.0.weight" in capsys.readouterr().err
    assert not (output / layout.transformer_layout("480p_t2v").subdir).exists()
