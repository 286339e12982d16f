"""HunyuanVideo-1.5 components: the checkpoint layout and geometry, loading, prompt encoding and the tiny test
checkpoint.

Heavy libraries (diffusers, transformers) are imported inside the functions that need them.
"""

from sage_grpo.models.layout import (DEFAULT_TRANSFORMER_VERSION, TRANSFORMER_VERSIONS, MissingCheckpointError,
                                     check_layout, required_layouts)
from sage_grpo.models.loading import (HunyuanComponents, load_components, load_transformer,
                                      load_transformer_weights, resolve_transformer_weights)
from sage_grpo.models.text_encoding import PromptEmbeds, PromptEncoder, TextEncoderSettings
from sage_grpo.models.tiny import write_tiny_hunyuan

__all__ = [
    "DEFAULT_TRANSFORMER_VERSION",
    "TRANSFORMER_VERSIONS",
    "HunyuanComponents",
    "MissingCheckpointError",
    "PromptEmbeds",
    "PromptEncoder",
    "TextEncoderSettings",
    "check_layout",
    "load_components",
    "load_transformer",
    "load_transformer_weights",
    "required_layouts",
    "resolve_transformer_weights",
    "write_tiny_hunyuan",
]
