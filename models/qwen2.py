"""Qwen2 and Qwen2.5 (``Qwen2ForCausalLM``): Llama-shaped with biases on the q/k/v projections
(not on o_proj), tied embeddings for the small sizes. Source: Yang et al. 2024 (Qwen2, Qwen2.5
reports); tensor list as in ``transformers/models/qwen2/modeling_qwen2.py``."""

from __future__ import annotations

from dstk.models.llama_shaped import LlamaShaped

SHAPE = LlamaShaped(family="qwen2", architecture="Qwen2ForCausalLM", qkv_bias=True, o_bias=False,
                    defaults={"max_position_embeddings": 32768, "rope_theta": 1e6})
FAMILY, HF_ARCHITECTURE, MODULES, PIPELINE_ADAPTER = SHAPE.exports
read, hf_config, preset = SHAPE.read, SHAPE.hf_config, SHAPE.preset

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
