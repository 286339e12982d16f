"""generate.py's image-to-video render beside diffusers' ``HunyuanVideo15ImageToVideoPipeline`` on the same models,
prompt, image, settings and initial noise: the parity check of the i2v generation tests."""

import importlib

import torch
from model_fixtures import TINY_TEXT


def render_beside_diffusers_i2v(config, monkeypatch):
    """(rendered video, our final latents, diffusers' final latents, the plan) for ``config`` (a GenerateConfig with
    one prompt, its ``image_path`` and ``fixed_size``); diffusers starts from generate.py's seeded x_0."""
    from diffusers import ClassifierFreeGuidance, FlowMatchEulerDiscreteScheduler, HunyuanVideo15ImageToVideoPipeline
    from PIL import Image

    from sage_grpo.pipeline.generation import VideoGenerator, plan_generation

    vae_module = importlib.import_module("sage_grpo.models.vae")  # the module, not the function
    plan = plan_generation(config)
    generator = VideoGenerator(config, plan)
    decoded = []
    decode = vae_module.decode_latents
    monkeypatch.setattr(vae_module, "decode_latents", lambda vae, x, **kw: decoded.append(x) or decode(vae, x))
    video = generator.render(plan.items[0])

    c = generator.components
    pipe = HunyuanVideo15ImageToVideoPipeline(
        c.text_encoder, c.tokenizer, c.transformer, c.vae, FlowMatchEulerDiscreteScheduler(shift=plan.flow_shift),
        c.text_encoder_2, c.tokenizer_2, ClassifierFreeGuidance(guidance_scale=plan.guidance_scale),
        c.image_encoder, c.feature_extractor)
    pipe.set_progress_bar_config(disable=True)
    pipe.tokenizer_max_length, pipe.tokenizer_2_max_length = TINY_TEXT.max_length, TINY_TEXT.max_length_2
    pipe.prompt_template_encode_start_idx = generator.encoder.crop_start
    shape = tuple(decoded[0].shape[1:])
    noise = torch.randn(shape, generator=torch.Generator().manual_seed(config.seed))[None]  # generate.py's seeded x_0
    latents = pipe(image=Image.open(config.image_path).convert("RGB"), prompt=config.prompt, negative_prompt=None,
                   num_frames=config.video_length, num_inference_steps=config.num_inference_steps, latents=noise,
                   output_type="latent").frames
    return video, decoded[0], latents, plan
