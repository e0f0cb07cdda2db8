"""A byte-level BPE tokenizer trained on the fine-tuning corpus itself (no hub)."""

from __future__ import annotations

import os
from pathlib import Path

EOS = "<|endoftext|>"
PAD = "<|pad|>"


def train_tokenizer(texts: list[str], *, vocab_size: int, output_dir: str | os.PathLike):
    """Train byte-level BPE (GPT-2's scheme: 256 byte symbols, so any text encodes) with
    ``vocab_size`` entries including EOS and PAD; save it as an HF tokenizer directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 258 + 2:
        from dstk.errors import DstkError

        raise DstkError(f"vocab_size {vocab_size} is too small for a byte-level tokenizer",
                        hint="use a model with vocab_size >= 260")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS, PAD], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD, bos_token=EOS)
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(str(output_dir))
    return hf
