"""Sections of ``TrainConfig`` that say what is trained and where: the model, LoRA, parallelism and memory,
throughput (levers that change how fast a step runs, not what it computes)."""

from dataclasses import dataclass
from typing import List, Optional

from sage_grpo.config.bounds import AT_LEAST_1, NON_NEGATIVE, POSITIVE, TOKENS, Bound
from sage_grpo.config.schema import config_field
from sage_grpo.config.sections import section

# Backends of diffusers' attention dispatcher offered by --attention_backend (AttentionBackendName values; see
# sage_grpo/models/attention.py).
ATTENTION_BACKENDS = ("native", "_native_math", "_native_efficient", "_native_flash", "_native_cudnn", "flash",
                      "flash_varlen", "_flash_3", "_flash_varlen_3", "sage", "sage_varlen", "xformers", "flex")
# --mixed_length_attention: how rows of different valid text lengths (the CFG pair) attend (models/attention.py)
MIXED_LENGTH_ATTENTION = ("auto", "mask", "split")


@section("model", "the checkpoint tree, the transformer version and the precision it is trained in")
@dataclass
class ModelConfig:
    pretrained_model_root: str = config_field("ckpts", "Root of the checkpoint tree (see ckpts/README.md)")
    pretrained_transformer_version: str = config_field(
        "480p_t2v", "Transformer subfolder under <root>/transformer/ (480p_t2v, 720p_t2v, 480p_t2v_distilled, ...)",
        aliases=("model_version",), defines_run=True, on_card=True)
    post_train_type: str = config_field(
        "grpo", "Post-training algorithm; only grpo is implemented (the reference's 'standard' crashes)",
        choices=("grpo", "standard"))
    dtype: str = config_field("bf16", "Dtype the transformer is loaded in", choices=("bf16", "fp32"), defines_run=True)
    master_weight_type: str = config_field(
        "fp32", "Dtype of the trained (FSDP) parameters; gradients are reduced in fp32", choices=("fp32", "bf16"),
        defines_run=True)
    attention_backend: str = config_field(
        "native", "diffusers attention backend of the transformer (native = torch SDPA; flash, flash_varlen, sage, "
        "... where installed); the text padding is trimmed and no dense mask is built", choices=ATTENTION_BACKENDS)
    text_max_length: Optional[int] = config_field(
        None, "Override of the MLLM text token length (default: the pipeline's 1000; tiny models use short lengths)",
        defines_run=True, bound=TOKENS)
    byt5_max_length: int = config_field(256, "byT5 glyph-stream token length", defines_run=True, bound=TOKENS)
    vision_num_semantic_tokens: int = config_field(
        729, "Image-embedding tokens fed to the transformer (zeros for text-to-video)", defines_run=True, bound=TOKENS)


@section("LoRA", "train LoRA adapters instead of every weight")
@dataclass
class LoRAConfig:
    use_lora: bool = config_field(False, "Train LoRA adapters instead of all weights", defines_run=True, on_card=True)
    lora_r: int = config_field(8, "LoRA rank", defines_run=True, on_card=True, bound=AT_LEAST_1)
    lora_alpha: int = config_field(16, "LoRA alpha", defines_run=True, on_card=True, bound=AT_LEAST_1)
    lora_dropout: float = config_field(
        0.0, "LoRA dropout", defines_run=True, bound=Bound(0, 1, high_open=True, rule="lora-dropout", fix="use 0.0"))
    lora_target_modules: Optional[List[str]] = config_field(
        None, "LoRA target modules (default all-linear)", nargs="+", defines_run=True)
    pretrained_lora_path: Optional[str] = config_field(None, "Load this adapter instead of creating one")


@section("parallelism and memory", "FSDP2, Ulysses, the memory plan's placements, the device")
@dataclass
class ParallelConfig:
    sp_size: int = config_field(8, "Ulysses sequence-parallel degree", bound=AT_LEAST_1)
    dp_replicate: int = config_field(1, "HSDP replicate degree of the FSDP mesh", bound=AT_LEAST_1)
    enable_fsdp: bool = config_field(True, "FSDP2 sharding when world size > 1")
    fsdp_param_dtype: str = config_field(
        "auto", "Dtype FSDP2 all-gathers the trained weights in for compute (master weights and gradient reduction "
        "stay --master_weight_type/fp32); auto: --dtype (bf16 at the reference launch: no autocast copies of fp32 "
        "weights); fp32: the reference's fp32 gathers under autocast", choices=("auto", "fp32", "bf16"))
    enable_gradient_checkpointing: bool = config_field(True, "Activation checkpointing of transformer blocks")
    gradient_reduction: str = config_field(
        "auto", "FSDP gradient reduction during accumulation: per_update (one reduce-scatter per optimizer update, "
        "unsharded fp32 gradients held between backwards), per_backward (a reduce-scatter after every backward, "
        "sharded gradients only, as the reference); auto: per_update when the memory plan fits with held gradients, "
        "else per_backward", choices=("auto", "per_update", "per_backward"))
    mini_batch_size_per_update: int = config_field(
        1, "Samples per transformer call in rollout, reference and training", defines_run=True, bound=AT_LEAST_1)
    reference_mode_offload: bool = config_field(False, "Keep the reference model on CPU between its passes")
    reference_placement: str = config_field(
        "auto", "Where the frozen KL reference's FSDP shards live: device (GPU memory, no transfers), cpu (offloaded, "
        "copied to the GPU for every pass); auto: cpu only with --reference_mode_offload when the memory plan says "
        "the device shards do not fit", choices=("auto", "device", "cpu"))
    reference_batch_size: int = config_field(
        0, "Transitions per no-grad forward of the KL reference means (an addition); 0: auto, "
        "--mini_batch_size_per_update on a CPU device (the reference's arithmetic: another batch size changes the "
        "means in the last bits), on CUDA the largest the memory plan fits, up to all of a rollout batch's",
        bound=Bound(0, rule="reference-batch", fix="use 0 (auto)"))
    offload_text_encoders: bool = config_field(
        True, "Keep the text encoders on the CPU and move them to the GPU only to encode prompts not cached yet")
    image_cache_gb: float = config_field(
        4.0, "Host memory for the image-to-video conditions encoded so far (VAE latent and SigLIP states of each "
        "distinct reference image and size, about 1.8 MB each in bf16); the least recently used are dropped and "
        "re-encoded when needed again; 0: no cache", bound=NON_NEGATIVE)
    vae_tiling: str = config_field(
        "auto", "Tiled VAE decoding: true, false, or auto (tiled when a decoded video exceeds 33x480x854 pixels)",
        choices=("auto", "true", "false"))
    gpu_memory_gb: Optional[float] = config_field(
        None, "GPU memory per device for the memory plan (default: the device's own; 80 when no GPU is visible)",
        bound=POSITIVE)
    ignore_memory_plan: bool = config_field(
        False, "Start even when the memory plan (python -m sage_grpo.plan) says the launch does not fit")
    collective_timeout_minutes: float = config_field(
        30.0, "Minutes any collective (all-reduce, broadcast, barrier) may wait for the other ranks before the run "
        "stops naming the rank that did not answer (the reference waits 120 minutes)", bound=POSITIVE)
    device: Optional[str] = config_field(None, "Device (default: cuda:LOCAL_RANK when available, else cpu)")
    cpu_threads: int = config_field(
        0, "torch threads of a CPU run (post_train.py sets them once at start-up and prints them); 0: "
        "$OMP_NUM_THREADS when set, else 1 (torch's one per core, spinning, ran a toy rollout step 40x slower on a "
        "busy 2-core machine: docs/toy_study.md)", bound=Bound(0, fix="use 0 (OMP_NUM_THREADS, else 1)"))


@section("throughput", "levers that change how fast a step runs, not what it computes")
@dataclass
class ThroughputConfig:
    replay_group_size: int = config_field(
        0, "Trained steps of a sample per policy forward and backward (grouped replay, an addition): the same mean "
        "over (sample, step) pairs and the same per-iteration beta, within float order; 1: one per forward (the "
        "reference); 0: auto, 1 on a CPU device (its runs are pinned bit for bit) or with --lora_dropout > 0 (the "
        "dropout draws would differ), on CUDA the largest the memory plan fits",
        bound="the replay-group rule: in [0, the trained steps per sample]")
    async_reward: str = config_field(
        "auto", "Score the rewards in a background worker while the reference means run, collected before the "
        "advantages (the same rewards and failures): true, false, or auto (a remote reward: true; a local one: on "
        "CUDA when the memory plan fits its forward beside the reference pass, false on a CPU device, whose cores "
        "the trainer's threads use)", choices=("auto", "true", "false"))
    mixed_length_attention: str = config_field(
        "auto", "Attention of rows whose valid text lengths differ (the CFG pair, prompts of a micro-batch): mask (one "
        "call with a key-padding mask), split (one mask-free call per run of rows of equal length, the same outputs "
        "within float order; SDPA can take its flash kernel); auto: split on CUDA, mask elsewhere (the CPU runs are "
        "pinned bit for bit)", choices=MIXED_LENGTH_ATTENTION)
