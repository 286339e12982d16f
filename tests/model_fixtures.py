"""Shared constants and helpers of the tests that use the tiny checkpoint (the fixtures ``tiny_root``,
``tiny_components`` and ``tiny_encoder`` live in ``conftest.py``). The checkpoint is written once into the session's
base temp dir, whichever test asks first.
"""

from pathlib import Path


from sage_grpo.models import TextEncoderSettings, write_tiny_hunyuan

TINY_SEED = 0
# Short text streams and few image tokens keep every transformer call in the milliseconds.
TINY_TEXT = TextEncoderSettings(max_length=16, max_length_2=8)
TINY_IMAGE_TOKENS = 4
# 5 frames of 16x16 -> latents (C, T, h, w) = (4, 2, 2, 2) with the tiny VAE (temporal 4, spatial 8).
TINY_VIDEO = dict(num_frames=5, height=16, width=16)


def tiny_i2v_checkpoint(tmp_path_factory) -> Path:
    """A tiny root whose only transformer version is the image-to-video ``480p_i2v`` (with the SigLIP encoder)."""
    root = tmp_path_factory.getbasetemp() / "tiny_i2v_ckpt"
    if not (root / "scheduler" / "scheduler_config.json").is_file():
        write_tiny_hunyuan(root, seed=TINY_SEED, versions=("480p_i2v",))
    return root


def write_image(path, height: int, width: int, seed: int = 0) -> Path:
    """A random RGB PNG of ``height x width`` pixels at ``path``."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return Path(path)


def tiny_checkpoint(tmp_path_factory) -> Path:
    root = tmp_path_factory.getbasetemp() / "tiny_ckpt"
    if not (root / "scheduler" / "scheduler_config.json").is_file():
        write_tiny_hunyuan(root, seed=TINY_SEED)
    return root


def tiny_args(root, out_dir, *extra) -> list:
    """post_train.py flags of a tiny CPU run (2 samples of 5 frames at 16x16, 3 SDE steps, a KL reference)."""
    return [
        "--pretrained_model_root", str(root), "--output_dir", str(out_dir), "--dtype", "fp32", "--device", "cpu",
        "--sp_size", "1", "--batch_size", "2", "--num_generations", "2", "--grpo_sampling_steps", "3",
        "--sample_n_frames", "5", "--rollout_height", "16", "--rollout_width", "16", "--text_max_length", "16",
        "--byt5_max_length", "8", "--vision_num_semantic_tokens", "4", "--reward_model", "target_color",
        "--reward_weights", '{"target_color": 1.0}', "--learning_rate", "1e-3", "--validation_interval", "0",
        "--save_interval", "1000", "--save_rollout_videos", "false", "--enable_gradient_checkpointing", "false",
        "--kl_weight", "1e-3", "--kl_coef", "1e-4", "--update_ref_model_step", "2", *extra,
    ]
