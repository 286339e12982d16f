"""HunyuanVideo-1.5 components: the checkpoint layout and geometry, loading, prompt encoding and the tiny test
checkpoint.

The names below are imported when first used (PEP 562), and heavy libraries (torch, diffusers, transformers) inside
the functions that need them: ``python -m sage_grpo.cli.verify`` and ``python -m sage_grpo.models.revisions``, which
``download_weights.sh`` runs for every repository, import neither torch nor diffusers.
"""

from sage_grpo import lazy_exports

_EXPORTS = {
    "DEFAULT_TRANSFORMER_VERSION": "layout",
    "TRANSFORMER_VERSIONS": "layout",
    "MissingCheckpointError": "layout",
    "check_layout": "layout",
    "required_layouts": "layout",
    "HunyuanComponents": "loading",
    "load_components": "loading",
    "load_transformer": "loading",
    "load_transformer_weights": "loading",
    "resolve_transformer_weights": "loading",
    "PromptEmbeds": "text_encoding",
    "PromptEncoder": "text_encoding",
    "TextEncoderSettings": "text_encoding",
    "write_tiny_hunyuan": "tiny",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
