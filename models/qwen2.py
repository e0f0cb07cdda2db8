"""Qwen2 and Qwen2.5 (``Qwen2ForCausalLM``): Llama-shaped with biases on the q/k/v projections
(not on o_proj), tied embeddings for the small sizes. Source: Yang et al. 2024 (Qwen2, Qwen2.5
reports); tensor list as in ``transformers/models/qwen2/modeling_qwen2.py``.

Sliding windows (``read_window``): ``Qwen2Config`` (transformers 5.25) keeps ``sliding_window``
only under ``use_sliding_window`` (default False) and slides only the layers its ``layer_types``
names ``sliding_attention``: by default those from ``max_window_layers`` (28) on. The published
Qwen2/Qwen2.5 configs say ``"use_sliding_window": false``, so no preset has a window."""

from __future__ import annotations

import dataclasses

from dstk.models.llama_shaped import LlamaShaped
from dstk.models.spec import ModelSpec

SHAPE = LlamaShaped(family="qwen2", architecture="Qwen2ForCausalLM", qkv_bias=True, o_bias=False,
                    defaults={"max_position_embeddings": 32768, "rope_theta": 1e6})
FAMILY, HF_ARCHITECTURE, MODULES, PIPELINE_ADAPTER = SHAPE.exports
hf_config, preset = SHAPE.hf_config, SHAPE.preset

CONFIG_DEFAULTS = {"use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28}
"""``Qwen2Config``'s (and ``Qwen3Config``'s) window keys when a config.json leaves them out."""


def read_window(cfg: dict, *, num_layers: int) -> tuple[int | None, tuple[int, ...] | None]:
    """(``sliding_window``, ``sliding_layers``) as ``Qwen2Config.__post_init__`` and
    ``Qwen2DecoderLayer`` apply them: the window only with ``use_sliding_window``; the layers the
    config's ``layer_types`` names ``sliding_attention``, else ``i >= max_window_layers``; (None,
    None) when no layer slides; (W, None) when every layer does."""
    keys = {**CONFIG_DEFAULTS, **{k: cfg[k] for k in CONFIG_DEFAULTS if k in cfg}}
    window = keys["sliding_window"] if keys["use_sliding_window"] else None
    if window is None:
        return None, None
    types = cfg.get("layer_types")
    if types is None:
        types = ["sliding_attention" if i >= keys["max_window_layers"] else "full_attention"
                 for i in range(num_layers)]
    layers = tuple(i for i, kind in enumerate(types[:num_layers]) if kind == "sliding_attention")
    if not layers:
        return None, None
    return int(window), None if len(layers) == num_layers else layers


def read(cfg: dict, *, name: str) -> ModelSpec:
    """The Llama-shaped spec plus the window its sliding layers apply (``read_window``)."""
    spec = SHAPE.read(cfg, name=name)
    window, layers = read_window(cfg, num_layers=spec.num_layers)
    return dataclasses.replace(spec, sliding_window=window, sliding_layers=layers)


PRESETS = {
    "qwen2-7b": preset(3584, 28, 28, 4, 18944, 152064, 131072),
    "qwen2.5-0.5b": preset(896, 24, 14, 2, 4864, 151936, tie_word_embeddings=True),
    "qwen2.5-1.5b": preset(1536, 28, 12, 2, 8960, 151936, tie_word_embeddings=True),
    "qwen2.5-3b": preset(2048, 36, 16, 2, 11008, 151936, tie_word_embeddings=True),
    "qwen2.5-7b": preset(3584, 28, 28, 4, 18944, 152064),
    "qwen2.5-14b": preset(5120, 48, 40, 8, 13824, 152064),
    "qwen2.5-32b": preset(5120, 64, 40, 8, 27648, 152064),
    "qwen2.5-72b": preset(8192, 80, 64, 8, 29568, 152064),
}
