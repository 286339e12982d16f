"""The memory planner (sage_grpo/plan/): its estimates against bytes measured on the tiny model, its decisions, its
refusal and its command line.

Tolerances: parameters, optimizer state and gradients are exact (the same formulas count the same tensors);
activations, counted save by save, must agree within ACTIVATION_TOLERANCE (10%; measured: within 1% in fp32, 6.5% under
bf16 autocast) with the bytes of the tensors autograd saves in one forward, with and without gradient checkpointing;
the VAE decode's peak with the live bytes of a decode (exact)."""
import dataclasses
import re
import weakref
from types import SimpleNamespace
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from sage_grpo.config import ConfigError
from sage_grpo.config.train import TrainConfig
from sage_grpo.models.placement import Placement
from sage_grpo.plan import memory as planner, report as plan_report, sizes as plan_sizes
from sage_grpo.optim.optimizers import build_optimizer
from sage_grpo.pipeline.velocity import t2v_model_input

from model_fixtures import TINY_IMAGE_TOKENS, TINY_TEXT


REPO_ROOT = Path(__file__).resolve().parents[2]


ACTIVATION_TOLERANCE = 0.10
REFERENCE_FLAGS = [  # scripts/post_train/reference_flags.sh, checked against that file below
    "--pretrained_model_root", "./ckpts", "--learning_rate", "1e-5", "--batch_size", "2", "--num_generations", "4",
    "--max_steps", "10000", "--output_dir", "out", "--enable_fsdp", "--enable_gradient_checkpointing",
    "--sp_size", "2", "--reward_checkpoint_mode", "v3", "--validate_at_step0", "False", "--validate_video_length",
    "121", "--validation_timestep_shift", "5.0", "--use_grad_balancing", "True", "--enable_timestep_permutation",
    "True", "--sde_type", "sage_grpo", "--kl_weight", "1e-5", "--kl_coef", "1e-7", "--use_moving_KL", "True",
    "--update_ref_model_step", "10", "--use_dual_kl", "True", "--dual_kl_moving_weight", "1.0",
    "--dual_kl_step_weight", "0.1", "--reference_mode_offload", "True",
]


def tiny_cfg(root, **changes) -> TrainConfig:
    """One process, fp32 everywhere, the tiny text lengths and a latent of (3, 8, 8) = 192 tokens."""
    values = dict(pretrained_model_root=str(root), dtype="fp32", master_weight_type="fp32", sp_size=1,
                  batch_size=1, num_generations=1, text_max_length=TINY_TEXT.max_length,
                  byt5_max_length=TINY_TEXT.max_length_2, vision_num_semantic_tokens=TINY_IMAGE_TOKENS,
                  sample_n_frames=9, rollout_height=64, rollout_width=64, reward_model="target_color",
                  cfg_scale=1.0, validation_interval=0)
    values.update(changes)
    return TrainConfig.of(**values)


def tiny_inputs(cfg: TrainConfig, sizes, batch: int = 1):
    """Transformer inputs of ``batch`` samples at ``cfg``'s rollout size and text lengths."""
    t = sizes.transformer.config
    vae = sizes.vae_config
    frames = (cfg.rollout.sample_n_frames - 1) // vae["temporal_compression_ratio"] + 1
    scale = vae["spatial_compression_ratio"]
    h, w = cfg.rollout.rollout_height // scale, cfg.rollout.rollout_width // scale
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(batch, vae["latent_channels"], frames, h, w, generator=generator)
    return t2v_model_input(latents, torch.float32), dict(
        timestep=torch.full((batch,), 500.0),
        encoder_hidden_states=torch.randn(batch, cfg.model.text_max_length, t["text_embed_dim"], generator=generator),
        encoder_attention_mask=torch.ones(batch, cfg.model.text_max_length),
        encoder_hidden_states_2=torch.randn(batch, cfg.model.byt5_max_length, t["text_embed_2_dim"], generator=generator),
        encoder_attention_mask_2=torch.ones(batch, cfg.model.byt5_max_length),
        image_embeds=torch.zeros(batch, cfg.model.vision_num_semantic_tokens, t["image_embed_dim"]))


def saved_activation_bytes(model: torch.nn.Module, inputs, kwargs, weight_shapes=frozenset()):
    """(activation bytes, weight-cast bytes): the distinct storages autograd saves for backward in one forward,
    parameters left out; bf16 tensors shaped like a weight are autocast's casts of the weights, counted apart."""
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved, casts = {}, {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            cast = tensor.dtype == torch.bfloat16 and tuple(tensor.shape) in weight_shapes
            (casts if cast else saved)[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(inputs, **kwargs)
    return sum(saved.values()), sum(casts.values())


@pytest.fixture(scope="module")
def tiny_transformer(tiny_root):
    from sage_grpo.models.loading import load_transformer

    model = load_transformer(tiny_root, "480p_t2v", torch.float32, "cpu")
    model.requires_grad_(True)
    return model.train()


def _plan(cfg, world_size=1, gpu=80.0, per_backward=False, on_cpu=False):
    sizes = planner.sizes_of(cfg)
    placement = Placement(per_backward, on_cpu, cfg.parallel.vae_tiling)
    return planner.plan_memory(cfg, sizes, world_size, gpu, placement), sizes


def _component(plan, phase, prefix):
    phase = next(p for p in plan.phases if p.name == phase)
    return sum(c.bytes for c in phase.components if c.name.startswith(prefix))


def test_sizes_are_the_instantiated_models(tiny_root, tiny_transformer):
    sizes = planner.sizes_of(tiny_cfg(tiny_root))
    t = sizes.transformer
    assert t.num_params == sum(p.numel() for p in tiny_transformer.parameters())
    last = tiny_transformer.transformer_blocks[-1]  # its text-stream outputs are discarded: no gradient
    unused = [p for m in (last.attn.to_add_out, last.ff_context) for p in m.parameters()]
    assert t.unused_params == sum(p.numel() for p in unused)
    assert t.num_matrix_params == sum(p.numel() for p in tiny_transformer.parameters() if p.ndim == 2) - sum(
        p.numel() for p in unused if p.ndim == 2)
    assert t.block_params == sum(p.numel() for p in tiny_transformer.transformer_blocks[0].parameters())
    assert sizes.sources["transformer"].startswith(str(tiny_root))


def test_released_sizes_are_the_known_counts(tmp_path):
    """No configs under the root: the released models' exact sizes (8.33B, 1.26B, 7.07B, 0.22B, 2.21B)."""
    sizes = plan_sizes.read_model_sizes(str(tmp_path), "480p_t2v", True)
    t = sizes.transformer
    assert (t.config["num_layers"], t.hidden, t.num_params) == (54, 2048, 8_326_608_160)
    assert sizes.vae_params == 1_260_634_115
    assert sizes.text_encoder_params == 7_070_619_136
    assert round(sizes.byt5_params / 1e9, 2) == 0.22
    assert sizes.reward_params == 2_208_985_600
    assert set(sizes.sources.values()) == {"released config", "released config (Qwen2-VL-2B)"}


def test_weights_optimizer_and_gradient_bytes_are_exact(tiny_root, tiny_transformer, monkeypatch):
    """One backward and one Muon + AdamW step on the tiny transformer: the bytes of its parameters, gradients and
    optimizer state equal the plan's components (fp32, one process, so Z = 1)."""
    import sage_grpo.optim.muon

    # Newton-Schulz on the 2048x2048 byT5 projection takes seconds in fp32 on the CPU; the state it leaves is the same
    monkeypatch.setattr(sage_grpo.optim.muon, "newton_schulz_orthogonalize",
                        lambda matrix, *args, **kwargs: matrix.clone())
    cfg = tiny_cfg(tiny_root)
    plan, sizes = _plan(cfg)
    model = tiny_transformer
    optimizer = build_optimizer(model.named_parameters(), use_muon=True, lr=1e-6, weight_decay=0.0)
    inputs, kwargs = tiny_inputs(cfg, sizes)
    model(inputs, **kwargs).sample.square().mean().backward()
    optimizer.step()
    gradient_bytes = sum(p.grad.nbytes for p in model.parameters() if p.grad is not None)
    states = [s for opt in optimizer.optimizers.values() for s in opt.state.values()]
    momentum = sum(s["momentum_buffer"].nbytes for s in states if "momentum_buffer" in s)
    moments = sum(s[k].nbytes for s in states for k in ("exp_avg", "exp_avg_sq") if k in s)
    optimizer.zero_grad(set_to_none=True)

    assert _component(plan, "train", "policy weights") == sum(p.nbytes for p in model.parameters())
    assert _component(plan, "train", "gradients") == gradient_bytes
    assert _component(plan, "train", "optimizer: Muon") == momentum
    assert _component(plan, "train", "optimizer: AdamW") == moments


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_activation_estimate_matches_saved_tensors(tiny_root, tiny_transformer, checkpointing, autocast):
    """The per-sample formula of what a forward saves against the bytes autograd saves in one forward of two samples:
    fp32, and bf16 under autocast on the fp32 weights (the trainer's default), where the bf16 casts of the weights
    that autograd also saves are the plan's "autocast bf16 weight copies" (P·2) and are checked against it. (The plan
    adds, with checkpointing, one block's saves for its recompute in the backward: the block formula checked without
    checkpointing.)"""
    cfg = tiny_cfg(tiny_root, enable_gradient_checkpointing=checkpointing, dtype="bf16" if autocast else "fp32")
    sizes = planner.sizes_of(cfg)
    model = tiny_transformer
    weight_shapes = {tuple(p.shape) for p in model.parameters()}
    (model.enable_gradient_checkpointing if checkpointing else model.disable_gradient_checkpointing)()
    try:
        inputs, kwargs = tiny_inputs(cfg, sizes, batch=2)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            measured, weight_casts = saved_activation_bytes(model, inputs, kwargs, weight_shapes)
    finally:
        model.disable_gradient_checkpointing()
    tokens = plan_sizes.video_token_count(sizes, cfg.rollout.sample_n_frames, cfg.rollout.rollout_height, cfg.rollout.rollout_width)
    assert tokens == inputs[0, 0].numel()
    bytes_per_element = 2 * planner.AUTOCAST_ACTIVATION_FACTOR if autocast else 4
    kept, saved = plan_sizes.forward_saved_elements(sizes.transformer, tokens, cfg, 1, checkpointing)
    estimate = 2 * (kept * (2 if autocast else 4) + saved * bytes_per_element)
    print(f"activations, checkpointing {checkpointing}, autocast {autocast}: estimate {estimate:.0f} B, measured "
          f"{measured} B, ratio {estimate / measured:.3f}")
    assert abs(estimate / measured - 1) <= ACTIVATION_TOLERANCE, (estimate, measured)
    if autocast and not checkpointing:  # every weight is cast and (nearly every one) saved by its op
        copies = 2 * sizes.transformer.num_params
        print(f"autocast weight casts: estimate {copies} B, saved {weight_casts} B, ratio {copies / weight_casts:.3f}")
        assert abs(copies / weight_casts - 1) <= ACTIVATION_TOLERANCE


def test_reference_launch_fits_in_80_gb():
    """The memory plan's aim: the reference launch on 8 GPUs of 80 GB peaks at <= 70 GB with the defaults."""
    flags_file = (REPO_ROOT / "scripts/post_train/reference_flags.sh").read_text()
    for flag in REFERENCE_FLAGS[::2]:
        if flag not in ("--output_dir", "--enable_fsdp", "--enable_gradient_checkpointing"):
            assert flag in flags_file
    from sage_grpo.config import parse_cli

    cfg = parse_cli(TrainConfig, REFERENCE_FLAGS)
    plan = planner.plan_launch(cfg, world_size=8, gpu_memory_gib=80.0)
    assert plan.peak_gib <= 70.0
    # bf16 gathers and trimmed text leave room for the unsharded gradients: one reduction per update; then the
    # throughput levers: the reward beside the reference pass and 2 trained steps per policy forward (3 would leave less
    # than 10% of the GPU free: 57.3 GB with one step, +7.4 GB per step), and under that train peak the reference means
    # run all 40 of the rollout batch's 2 x 20 transitions per forward (with one step per forward: 32)
    assert plan.placement == Placement(reduce_per_backward=False, reference_on_cpu=False, vae_tiling="auto",
                                       reference_batch_size=40, replay_group_size=2, async_reward=True)
    one_step = planner.plan_launch(cfg.replace(replay_group_size=1), world_size=8, gpu_memory_gib=80.0)
    assert (one_step.placement.reference_batch_size, round(one_step.peak_gib, 2)) == (32, 57.30)
    assert round(plan.peak_gib, 2) == 64.71 and plan.peak.name == "train"
    train = next(p for p in plan.phases if p.name == "train")
    assert any(c.name.startswith("gradients (unsharded") for c in train.components)
    per_backward = planner.plan_memory(cfg, planner.sizes_of(cfg), 8, 80.0,
                                       Placement(True, False, "auto"))
    assert per_backward.peak_gib < plan.peak_gib - 20  # the fallback when a larger launch does not fit


def test_auto_decisions_follow_the_budget():
    """Held gradients when they fit; the reference offloaded only when it must and --reference_mode_offload allows;
    explicit flags win."""
    cfg = TrainConfig.of(sp_size=2, validation_interval=0)
    roomy = planner.plan_launch(cfg, 8, 200.0).placement
    assert (roomy.reduce_per_backward, roomy.reference_on_cpu) == (False, False)
    # a budget between the peaks with the reference offloaded and on the device (both reducing per backward)
    offloaded, _ = _plan(cfg, world_size=8, per_backward=True, on_cpu=True)
    on_device, _ = _plan(cfg, world_size=8, per_backward=True, on_cpu=False)
    assert offloaded.peak_gib < on_device.peak_gib
    budget = (offloaded.peak_gib + on_device.peak_gib) / 2 / (1 - planner.MARGIN)
    tight = planner.plan_launch(cfg.replace(reference_mode_offload=True), 8, budget)
    assert (tight.placement.reduce_per_backward, tight.placement.reference_on_cpu) == (True, True)
    assert tight.fits()
    no_offload = planner.plan_launch(cfg, 8, budget).placement
    assert no_offload.reference_on_cpu is False
    forced = planner.plan_launch(cfg.replace(gradient_reduction="per_update",
                                                     reference_placement="cpu"), 8, 200.0).placement
    assert (forced.reduce_per_backward, forced.reference_on_cpu) == (False, True)
    # without a GPU budget (CPU device): the rules that need no plan
    cpu = planner.resolve_placement(cfg, sharded=True, device_type="cpu")
    assert (cpu.reduce_per_backward, cpu.reference_on_cpu) == (True, False)


def test_held_gradients_cost_four_bytes_per_parameter():
    cfg = TrainConfig.of(sp_size=2, validation_interval=0)
    per_update, sizes = _plan(cfg, world_size=8, per_backward=False)
    per_backward, _ = _plan(cfg, world_size=8, per_backward=True)
    t = sizes.transformer
    p = t.num_params - t.unused_params
    # held: every trained parameter in fp32, plus at the peak the first reduced (last) block's fp32 shard
    assert _component(per_update, "train", "gradients") == 4 * p + 4 * (t.block_params - t.unused_params) / 8
    assert _component(per_backward, "train", "gradients (sharded)") == 4 * p / 8
    assert _component(per_update, "rollout", "gradients") == 0  # freed by the update before the next rollout
    # an update over 2 rollout batches keeps its gradients through the second rollout
    accumulating, _ = _plan(cfg.replace(gradient_accumulation_steps=2), world_size=8)
    assert _component(accumulating, "rollout", "gradients") == _component(accumulating, "train", "gradients") \
        == _component(per_update, "train", "gradients")


def test_tiling_and_offloading_lower_their_phases():
    cfg = TrainConfig.of(sp_size=2, validation_interval=0)
    tiled, _ = _plan(cfg.replace(vae_tiling="true"), world_size=8)
    untiled, _ = _plan(cfg.replace(vae_tiling="false"), world_size=8)
    assert _component(tiled, "decode + reward", "VAE decode") < _component(untiled, "decode + reward", "VAE decode") / 2
    offloaded = planner.plan_memory(cfg, planner.sizes_of(cfg), 8, 80.0, Placement(True, False))
    resident = planner.plan_memory(cfg.replace(offload_text_encoders=False), planner.sizes_of(cfg), 8,
                                   80.0, Placement(True, False))
    assert _component(offloaded, "train", "text encoders") == 0
    assert _component(resident, "train", "text encoders") == (7_070_619_136 + planner.sizes_of(cfg).byt5_params) * 2


def test_the_drift_proxys_base_copy_is_planned_where_the_run_holds_one():
    """A copy of the base transformer in --dtype, sharded and placed like the reference, where no model of the run is
    the base already; its forwards in a phase of their own."""
    cfg = TrainConfig.of(sp_size=2, drift_proxy=True)  # the reference's full fine-tune with the moving anchor
    plan, sizes = _plan(cfg, world_size=8)
    shards = sizes.transformer.num_params * 2 / 8  # P·c/Z in bf16
    assert _component(plan, "train", "frozen base (drift proxy) shards") == shards
    assert _component(plan, "drift proxy", "frozen base gathered units") > 0
    without, _ = _plan(cfg.replace(drift_proxy=False), world_size=8)
    assert plan.phase("train").bytes - without.phase("train").bytes == shards
    for free in (dict(use_moving_KL=False), dict(use_lora=True)):  # the reference is the base; LoRA disables adapters
        other, _ = _plan(cfg.replace(**free), world_size=8)
        assert _component(other, "train", "frozen base") == 0 and other.phase("drift proxy") is None
    offloaded, _ = _plan(cfg, world_size=8, on_cpu=True)  # with the reference: only its units visit the GPU
    assert _component(offloaded, "train", "frozen base") == 0
    assert _component(offloaded, "drift proxy", "frozen base from the CPU") > 0


def test_launch_that_cannot_fit_is_refused_with_the_table(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "8")
    cfg = TrainConfig.of(sp_size=2, validation_interval=0, gpu_memory_gb=24.0, device="cuda")
    with pytest.raises(ConfigError, match=r"\[memory-plan\].*24\.0 GB.*--ignore_memory_plan true") as err:
        plan_report.check_memory_plan(cfg)
    assert "| component" in str(err.value) and "| encode (peak) |" in str(err.value)
    assert "no single placement flag is enough" in str(err.value)  # 24 GB is too small whatever the placement
    # a budget in which the reference's shards on the device do not fit and their offload does
    offloaded, _ = _plan(cfg, world_size=8, per_backward=True, on_cpu=True)
    on_device, _ = _plan(cfg, world_size=8, per_backward=True, on_cpu=False)
    budget = (offloaded.peak_gib + on_device.peak_gib) / 2
    roomier = cfg.replace(gpu_memory_gb=budget)
    assert planner.plan_launch(roomier, 8, budget).placement.reference_on_cpu is False  # no --reference_mode_offload
    with pytest.raises(ConfigError, match=r"Fix: use --reference_placement cpu \(peak \d+\.\d GB\)"):
        plan_report.check_memory_plan(roomier)
    assert plan_report.check_memory_plan(cfg.replace(ignore_memory_plan=True)) is None
    assert plan_report.check_memory_plan(cfg.replace(device="cpu")) is None  # no GPU budget on the CPU


def test_launch_that_fits_without_the_margin_starts_with_a_warning(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "8")
    roomy = TrainConfig.of(sp_size=2, validation_interval=0, gpu_memory_gb=80.0, device="cuda",  # placements fixed:
                        gradient_reduction="per_update", reference_placement="device", reference_batch_size=1,
                        replay_group_size=1)
    plan = plan_report.check_memory_plan(roomy)
    assert plan.fits(planner.MARGIN) and capsys.readouterr().err == ""
    # a GPU 5% larger than that plan's peak: it fits, with less free than the margin
    tight = roomy.replace(gpu_memory_gb=plan.peak_gib * 1.05)
    tight_plan = plan_report.check_memory_plan(tight)
    assert tight_plan.fits() and not tight_plan.fits(planner.MARGIN)
    assert re.search(r"warning: \[memory-plan\] the launch fits with \d+\.\d GB \(\d+%\) of the GPU free, less than the "
                     r"10%", capsys.readouterr().err)


def test_command_line_ends_with_the_peak(tiny_root, capsys):
    with pytest.raises(SystemExit) as exit_info:  # 1 GB is less than the 2 GB runtime overhead: exit status 1
        plan_report.main(["--world_size", "1", "--gpu_memory_gb", "1", "--pretrained_model_root", str(tiny_root),
                          "--sp_size", "1", "--batch_size", "2", "--num_generations", "2", "--sample_n_frames", "5",
                          "--rollout_height", "16", "--rollout_width", "16", "--text_max_length", "16",
                          "--byt5_max_length", "8", "--vision_num_semantic_tokens", "4", "--reward_model",
                          "target_color", "--validation_interval", "0"])
    assert exit_info.value.code == 1
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert re.fullmatch(r"peak per GPU: \d+\.\d\d GB", lines[-1])
    peak = float(lines[-1].split()[-2])
    assert 2.0 < peak < 3.0  # the 2 GB runtime overhead plus the tiny models
    assert any(line.startswith("largest --batch_size that fits: ") for line in lines)
    assert "| component" in out and f"from {tiny_root}" in out


def test_command_line_rejects_a_bad_layout(capsys):
    with pytest.raises(SystemExit) as exit_info:
        plan_report.main(["--world_size", "6", "--sp_size", "4", "--validation_interval", "0"])
    assert exit_info.value.code == 2
    assert "sp-divides-world" in capsys.readouterr().err


class LiveBytes(TorchDispatchMode):
    """Peak bytes of the tensor storages alive at once among those the ops under it create."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self.storages = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if not isinstance(tensor, torch.Tensor):
                continue
            key, size = tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes()
            if key in self.storages or not size:
                continue
            self.storages.add(key)
            self.live += size
            self.peak = max(self.peak, self.live)
            weakref.finalize(tensor, self._free, key, size)
        return out

    def _free(self, key, size):
        self.live -= size
        self.storages.discard(key)


@pytest.mark.parametrize("tiled", [False, True])
def test_vae_decode_estimate_matches_the_live_bytes(tiny_components, tiled):
    """The decode formula against the peak of live tensor bytes in one no-grad decode of 5 x 48 x 64 with the tiny
    VAE; tiled with 32-pixel tiles (the real 256 would not tile so small a video)."""
    vae = tiny_components.vae
    config = dict(vae.config)
    frames, height, width = 5, 48, 64
    spatial = config["spatial_compression_ratio"]
    latents = torch.randn(1, config["latent_channels"], (frames - 1) // 4 + 1, height // spatial, width // spatial,
                          generator=torch.Generator().manual_seed(0))
    tile_settings = ("use_tiling", "tile_sample_min_height", "tile_sample_min_width", "tile_latent_min_height",
                     "tile_latent_min_width")
    saved = {name: getattr(vae, name) for name in tile_settings}
    vae.use_tiling = tiled
    if tiled:
        vae.enable_tiling(tile_sample_min_height=32, tile_sample_min_width=32, tile_latent_min_height=32 // spatial,
                          tile_latent_min_width=32 // spatial)

    try:
        with torch.no_grad(), LiveBytes() as tracker:
            vae.decode(latents, return_dict=False)
    finally:
        for name, value in saved.items():
            setattr(vae, name, value)
    estimate = plan_sizes.vae_decode_bytes(config, frames, height, width, 4, tiled, tile=32)
    print(f"VAE decode, tiled {tiled}: estimate {estimate:.0f} B, measured {tracker.peak} B, "
          f"ratio {estimate / tracker.peak:.3f}")
    assert abs(estimate / tracker.peak - 1) <= ACTIVATION_TOLERANCE


def test_device_memory_is_read_from_this_process_gpu(monkeypatch):
    """Without --gpu_memory_gb the budget is this process's GPU's memory: cuda:N's for --device cuda:N, and
    LOCAL_RANK's for a bare --device cuda or none (every rank of a node reads its own GPU, not cuda:0)."""
    asked = []

    def properties(index):
        asked.append(index)
        return SimpleNamespace(total_memory=(40 + index) * planner.GIB)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert planner.device_memory_gib(TrainConfig.of(device="cuda")) == 43.0
    assert planner.device_memory_gib(TrainConfig.of()) == 43.0
    assert planner.device_memory_gib(TrainConfig.of(device="cuda:1")) == 41.0
    assert asked == [3, 3, 1]
    assert planner.device_memory_gib(TrainConfig.of(device="cuda", gpu_memory_gb=70.0)) == 70.0
