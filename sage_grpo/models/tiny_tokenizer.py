"""The tokenizer of the tiny test checkpoints: an offline byte-level BPE ``Qwen2Tokenizer`` with Qwen's special
tokens and chat template, trained on a few sentences.

Both tiny checkpoints use it: the HunyuanVideo-1.5 text encoder's (:mod:`sage_grpo.models.tiny`) and the
VideoReward's (:mod:`sage_grpo.rewards.tiny`), each with its own training text and vocabulary size. It lives below
both packages so that neither imports the other. ``tokenizers`` and ``transformers`` are imported when it is built.
"""

import json
from typing import Sequence

QWEN_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                       "<|image_pad|>", "<|video_pad|>", "<|vision_pad|>")
# Renders like Qwen2-VL-Instruct's template for one user turn with text and one video or image.
QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'video' or 'video' in content %}{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{% elif content['type'] == 'image' or 'image' in content %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tiny_qwen_tokenizer(texts: Sequence[str], vocab_size: int):
    """A byte-level BPE ``Qwen2Tokenizer`` trained on ``texts`` (the same texts give the same tokenizer), with Qwen's
    special tokens (pad = eos = unk = ``<|endoftext|>``) and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(QWEN_SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(list(texts), trainer=trainer)
    # Qwen2Tokenizer wants merges as tuples (lists raise "failed to extract enum PyMerges").
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" "))
              for m in json.loads(bpe.to_str())["model"]["merges"]]
    tokenizer = Qwen2Tokenizer(vocab=bpe.get_vocab(), merges=merges)
    tokenizer.add_special_tokens({"additional_special_tokens": list(QWEN_SPECIAL_TOKENS[1:])})
    tokenizer.chat_template = QWEN_CHAT_TEMPLATE
    return tokenizer
