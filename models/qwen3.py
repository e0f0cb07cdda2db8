"""Qwen3 dense models (``Qwen3ForCausalLM``): Llama-shaped, no q/k/v bias, an RMSNorm over
``head_dim`` on queries and keys (QK-norm), ``head_dim`` 128 independent of the width. Source:
Qwen3 technical report (2025); tensor list as in ``transformers/models/qwen3/modeling_qwen3.py``.

Sliding windows: ``Qwen3Config`` reads them as ``Qwen2Config`` does (``use_sliding_window``,
``sliding_window``, ``max_window_layers``, ``layer_types``: ``dstk.models.qwen2.read_window``);
the published Qwen3 configs say ``"use_sliding_window": false``, so no preset has a window."""

from __future__ import annotations

import dataclasses

from dstk.models.llama_shaped import LlamaShaped
from dstk.models.qwen2 import read_window
from dstk.models.spec import ModelSpec

SHAPE = LlamaShaped(family="qwen3", architecture="Qwen3ForCausalLM", qk_norm=True,
                    defaults={"head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
                              "rope_theta": 1e6})
FAMILY, HF_ARCHITECTURE, MODULES, PIPELINE_ADAPTER = SHAPE.exports
hf_config, preset = SHAPE.hf_config, SHAPE.preset


def read(cfg: dict, *, name: str) -> ModelSpec:
    """The Llama-shaped spec plus the window its sliding layers apply (``qwen2.read_window``)."""
    spec = SHAPE.read(cfg, name=name)
    window, layers = read_window(cfg, num_layers=spec.num_layers)
    return dataclasses.replace(spec, sliding_window=window, sliding_layers=layers)


PRESETS = {
    "qwen3-0.6b": preset(1024, 28, 16, 8, 3072, tie_word_embeddings=True),
    "qwen3-1.7b": preset(2048, 28, 16, 8, 6144, tie_word_embeddings=True),
    "qwen3-4b": preset(2560, 36, 32, 8, 9728, tie_word_embeddings=True),
    "qwen3-8b": preset(4096, 36, 32, 8, 12288),
    "qwen3-14b": preset(5120, 40, 40, 8, 17408),
    "qwen3-32b": preset(5120, 64, 64, 8, 25600),
}
