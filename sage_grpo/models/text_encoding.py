"""Prompt encoding for HunyuanVideo-1.5 with classifier-free guidance: the Qwen2.5-VL stream and the byT5 glyph stream.

Both streams are computed by diffusers' own ``HunyuanVideo15Pipeline`` helpers, so the embeddings equal the ones the
diffusers pipeline feeds its transformer:

- MLLM stream (``embeds``/``masks``, (B, L, D)/(B, L)): the prompt is wrapped in the system message + user chat
  template, padded to ``crop_start + max_length`` tokens, encoded, hidden state ``-(num_hidden_layers_to_skip + 1)``
  is taken and the first ``crop_start`` (template) positions are cut off, leaving ``L = max_length``.
- byT5 stream (``embeds_2``/``masks_2``, (B, L2, D2)/(B, L2)): only the quoted text of the prompt ("..." or “...”,
  formatted as ``Text "x". ``) is encoded, ``L2 = max_length_2``; a prompt without quotes gives zeros and a zero mask.

The negative prompt ("" by default, as in the reference) is encoded once and repeated over the batch.
``crop_start=None`` counts the template tokens before the user text with the tokenizer itself: diffusers hard-codes
108, the count for the released tokenizer and system message, while a tiny test tokenizer needs its own count.

``PromptEncoder(cache=True)`` keeps every encoded prompt in memory (CPU), keyed by prompt text; with ``cache_path`` it
also loads and saves them in a ``.pt`` file keyed by an encoder identity (configs, settings and a weight checksum), so
a cache written by other weights or other lengths is never reused.
"""

import contextlib
import hashlib
import inspect
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from sage_grpo.safe_io import load_plain

if TYPE_CHECKING:
    from sage_grpo.models.image_condition import ImageCondition

_STREAM_FIELDS = ("embeds", "masks", "embeds_2", "masks_2")
_ALL_STREAM_FIELDS = _STREAM_FIELDS + tuple(f"neg_{name}" for name in _STREAM_FIELDS)


def _diffusers_pipeline_class():
    from diffusers import HunyuanVideo15Pipeline

    return HunyuanVideo15Pipeline


def default_system_message() -> str:
    """The system message of diffusers' HunyuanVideo-1.5 pipeline (the released model's video template)."""
    helper = _diffusers_pipeline_class()._get_mllm_prompt_embeds
    return inspect.signature(helper).parameters["system_message"].default


@dataclass(frozen=True)
class TextEncoderSettings:
    """Tokenizer lengths and template of the two text streams (real-model defaults; tiny tests shorten them)."""

    max_length: int = 1000  # MLLM tokens kept after the template crop (L)
    max_length_2: int = 256  # byT5 glyph tokens (L2)
    crop_start: Optional[int] = None  # template tokens before the user text; None: counted with the tokenizer
    num_hidden_layers_to_skip: int = 2  # take hidden state -(skip + 1) of the Qwen2.5-VL text model
    system_message: Optional[str] = None  # None: diffusers' HunyuanVideo-1.5 system message


@dataclass
class PromptEmbeds:
    """Positive and negative conditioning of B prompts, both streams; negatives are aligned with the positives.

    ``image``: the image-to-video condition of the B samples (:class:`~sage_grpo.models.image_condition.ImageCondition`,
    shared by both CFG branches), or None for text-to-video; selected and moved with the rest.

    ``valid_tokens``: per row, the (positive, negative) prompt's valid MLLM + byT5 tokens as Python ints, counted once
    where the embeddings are built (:meth:`PromptEncoder.encode`) so that no transformer call reads them back from the
    device (``sage_grpo/models/transformer_forward.py``; plain ints also hold under fake tensors); selected with the
    rest. None when not counted: the transformer then counts them in every call (one host sync each)."""

    embeds: Tensor  # (B, L, D) Qwen2.5-VL hidden states
    masks: Tensor  # (B, L) 1 = real token
    embeds_2: Tensor  # (B, L2, D2) byT5 glyph states
    masks_2: Tensor  # (B, L2)
    neg_embeds: Tensor
    neg_masks: Tensor
    neg_embeds_2: Tensor
    neg_masks_2: Tensor
    image: Optional["ImageCondition"] = None
    valid_tokens: Optional[Tuple[Tuple[int, int], ...]] = None

    def __len__(self) -> int:
        return self.embeds.shape[0]

    def _map(self, fn, image, valid_tokens) -> "PromptEmbeds":
        streams = {name: fn(name, getattr(self, name)) for name in _ALL_STREAM_FIELDS}
        return PromptEmbeds(**streams, image=image, valid_tokens=valid_tokens)

    def select(self, indices: Union[Sequence[int], Tensor, slice]) -> "PromptEmbeds":
        """The rows ``indices`` of every tensor (a list, a LongTensor or a slice)."""
        valid_tokens = None
        if self.valid_tokens is not None:
            rows = range(len(self))[indices] if isinstance(indices, slice) else (
                indices.tolist() if isinstance(indices, Tensor) else indices)
            valid_tokens = tuple(self.valid_tokens[row] for row in rows)
        if not isinstance(indices, slice):
            indices = torch.as_tensor(indices, dtype=torch.long, device=self.embeds.device)
        image = self.image.select(indices) if self.image is not None else None
        return self._map(lambda _, t: t[indices], image, valid_tokens)

    def to(self, device=None, dtype: Optional[torch.dtype] = None) -> "PromptEmbeds":
        """Move every tensor to ``device``; ``dtype`` applies to the embeddings only (masks keep theirs)."""
        image = self.image.to(device, dtype) if self.image is not None else None
        return self._map(lambda name, t: t.to(device=device, dtype=dtype if "embeds" in name else None), image,
                         self.valid_tokens)

    def with_image(self, image: Optional["ImageCondition"]) -> "PromptEmbeds":
        """The same prompts with the image condition ``image`` (one row per prompt; None: text-to-video)."""
        if image is not None and len(image) != len(self):
            raise ValueError(f"got an image condition of {len(image)} rows for {len(self)} prompts")
        return replace(self, image=image)

    @classmethod
    def cat(cls, parts: Sequence["PromptEmbeds"]) -> "PromptEmbeds":
        images = [p.image for p in parts]
        if any(i is None for i in images) and not all(i is None for i in images):
            raise ValueError("cannot concatenate image-to-video and text-to-video conditioning: one transformer call "
                             "is one task")
        image = None if images[0] is None else type(images[0]).cat(images)
        counts = [p.valid_tokens for p in parts]
        valid_tokens = None if any(c is None for c in counts) else sum(counts, ())
        return cls(**{name: torch.cat([getattr(p, name) for p in parts]) for name in _ALL_STREAM_FIELDS}, image=image,
                   valid_tokens=valid_tokens)

    def positive(self) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        return self.embeds, self.masks, self.embeds_2, self.masks_2

    def negative(self) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        return self.neg_embeds, self.neg_masks, self.neg_embeds_2, self.neg_masks_2

    def counted(self) -> "PromptEmbeds":
        """These embeddings with :attr:`valid_tokens` counted from the masks (one host sync)."""
        counts = [masks.bool().sum(dim=1) + masks_2.bool().sum(dim=1)
                  for masks, masks_2 in ((self.masks, self.masks_2), (self.neg_masks, self.neg_masks_2))]
        return replace(self, valid_tokens=tuple(map(tuple, torch.stack(counts, dim=1).tolist())))


def count_template_tokens(tokenizer, system_message: Optional[str] = None) -> int:
    """Number of chat-template tokens before the user text (what diffusers crops; 108 for the released model)."""
    sentinel = "\x00user-text\x00"
    conversation = [{"role": "system", "content": system_message or default_system_message()},
                    {"role": "user", "content": sentinel}]
    rendered = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    prefix = rendered[: rendered.index(sentinel)]
    return len(tokenizer(prefix, add_special_tokens=False).input_ids)


class PromptEncoder:
    """Encodes prompts with the two text encoders; optional per-prompt cache in memory and on disk."""

    def __init__(self, text_encoder, tokenizer, text_encoder_2, tokenizer_2,
                 settings: TextEncoderSettings = TextEncoderSettings(), *, cache: bool = False,
                 cache_path: Optional[Union[str, Path]] = None,
                 compute_device: Optional[Union[str, torch.device]] = None):
        """``compute_device``: where the encoders run when it is not where they live (offloaded encoders: kept on the
        CPU, moved to the GPU only while they encode prompts not cached yet, then moved back)."""
        self.text_encoder, self.tokenizer = text_encoder, tokenizer
        self.compute_device = torch.device(compute_device) if compute_device is not None else None
        self.text_encoder_2, self.tokenizer_2 = text_encoder_2, tokenizer_2
        self.settings = settings
        self.system_message = settings.system_message or default_system_message()
        self.crop_start = settings.crop_start if settings.crop_start is not None else self.count_template_tokens()
        self.cache_path = Path(cache_path) if cache_path is not None else None
        self._cache: Optional[Dict[str, Dict[str, Tensor]]] = {} if (cache or cache_path is not None) else None
        self._identity: Optional[str] = None
        if self.cache_path is not None and self.cache_path.is_file():
            self._cache.update(load_plain(self.cache_path, "prompt-embedding cache").get(self.identity, {}))

    @classmethod
    def from_components(cls, components, settings: TextEncoderSettings = TextEncoderSettings(), **kwargs):
        return cls(components.text_encoder, components.tokenizer, components.text_encoder_2, components.tokenizer_2,
                   settings, **kwargs)

    @property
    def device(self) -> torch.device:
        return next(self.text_encoder.parameters()).device

    def count_template_tokens(self) -> int:
        return count_template_tokens(self.tokenizer, self.system_message)

    @property
    def identity(self) -> str:
        """Hash of what determines an encoding: both encoder configs, weight checksums, tokenizers and settings."""
        if self._identity is None:
            def checksum(module) -> float:
                return float(sum(p.detach().sum(dtype=torch.float64).item() for p in module.parameters()))
            payload = {
                "text_encoder": self.text_encoder.config.to_dict(),
                "text_encoder_2": self.text_encoder_2.config.to_dict(),
                "checksums": [checksum(self.text_encoder), checksum(self.text_encoder_2)],
                "tokenizers": [len(self.tokenizer), len(self.tokenizer_2)], "dtype": str(self.text_encoder.dtype),
                "settings": asdict(self.settings), "system_message": self.system_message, "crop_start": self.crop_start,
            }
            self._identity = hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]
        return self._identity

    @contextlib.contextmanager
    def _on_compute_device(self) -> Iterator[torch.device]:
        """The encoders on ``compute_device`` for the block (and back home after it); no move without one."""
        home = self.device
        if self.compute_device is None or self.compute_device == home:
            yield home
            return
        encoders = (self.text_encoder, self.text_encoder_2)
        try:
            for encoder in encoders:
                encoder.to(self.compute_device)
            yield self.compute_device
        finally:
            for encoder in encoders:
                encoder.to(home)

    @torch.no_grad()
    def encode_streams(self, prompts: Sequence[str]) -> Dict[str, Tensor]:
        """Both streams of ``prompts`` (no cache): {"embeds", "masks", "embeds_2", "masks_2"}, batch first, on the
        device the encoders live on."""
        home = self.device
        with self._on_compute_device() as device:
            streams = self._encode_streams(prompts, device)
        return {name: value.to(home) for name, value in streams.items()}

    def _encode_streams(self, prompts: Sequence[str], device: torch.device) -> Dict[str, Tensor]:
        pipeline_class = _diffusers_pipeline_class()
        embeds, masks = pipeline_class._get_mllm_prompt_embeds(
            text_encoder=self.text_encoder, tokenizer=self.tokenizer, prompt=list(prompts), device=device,
            tokenizer_max_length=self.settings.max_length,
            num_hidden_layers_to_skip=self.settings.num_hidden_layers_to_skip,
            system_message=self.system_message, crop_start=self.crop_start,
        )
        embeds_2, masks_2 = pipeline_class._get_byt5_prompt_embeds(
            tokenizer=self.tokenizer_2, text_encoder=self.text_encoder_2, prompt=list(prompts), device=device,
            tokenizer_max_length=self.settings.max_length_2,
        )
        return dict(embeds=embeds, masks=masks, embeds_2=embeds_2, masks_2=masks_2)

    def _lookup(self, prompts: Sequence[str]) -> Dict[str, Tensor]:
        """Streams of ``prompts``, encoding only those not cached yet (in one batch)."""
        if self._cache is None:
            return self.encode_streams(prompts)
        todo = list(dict.fromkeys(p for p in prompts if p not in self._cache))
        if todo:
            fresh = self.encode_streams(todo)
            for row, prompt in enumerate(todo):
                self._cache[prompt] = {k: fresh[k][row].cpu() for k in _STREAM_FIELDS}
        return {k: torch.stack([self._cache[p][k] for p in prompts]).to(self.device) for k in _STREAM_FIELDS}

    def encode(self, prompts: Sequence[str], negative_prompt: str = "") -> PromptEmbeds:
        """Positive streams of ``prompts`` and the negative prompt's streams repeated to the same batch size."""
        if isinstance(prompts, str):
            raise TypeError("encode() takes a list of prompts")
        positive = self._lookup(prompts)
        negative = self._lookup([negative_prompt])
        repeat = {k: v.expand(len(prompts), *v.shape[1:]).contiguous() for k, v in negative.items()}
        return PromptEmbeds(**positive, **{f"neg_{k}": v for k, v in repeat.items()}).counted()

    def precompute(self, prompts: Sequence[str], negative_prompt: str = "") -> None:
        """Fill the cache with ``prompts`` (e.g. a whole prompt file) and save it if a cache path is set."""
        if self._cache is None:
            raise ValueError("precompute() needs PromptEncoder(cache=True) or a cache_path")
        self._lookup(list(prompts) + [negative_prompt])
        self.save_cache()

    def save_cache(self) -> None:
        """Write the in-memory cache under this encoder's identity (other identities in the file are kept)."""
        if self.cache_path is None:
            return
        stored = load_plain(self.cache_path, "prompt-embedding cache") if self.cache_path.is_file() else {}
        stored[self.identity] = dict(self._cache)
        self.cache_path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(stored, self.cache_path)

    @property
    def cached_prompts(self) -> List[str]:
        return list(self._cache or {})
