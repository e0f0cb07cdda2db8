"""Gemma 1 (``GemmaForCausalLM``): Llama-shaped with GeGLU, ``head_dim`` 256, a 256k vocabulary
and tied embeddings (the embedding is most of Gemma-2B). Source: Gemma Team 2024; tensor list as
in ``transformers/models/gemma/modeling_gemma.py``.

No sliding window: ``GemmaConfig`` (transformers 5.25) has none, so every layer attends to every
earlier token. Gemma 2 and 3 interleave sliding and global layers, but they are other model types
(``gemma2``, ``gemma3``) with other layers (extra norms, soft-capping) that this family does not read."""

from __future__ import annotations

from dstk.models.llama_shaped import LlamaShaped
from dstk.models.spec import EagerLayer

SHAPE = LlamaShaped(family="gemma", architecture="GemmaForCausalLM", tied=True,
                    defaults={"head_dim": 256, "vocab_size": 256000, "max_position_embeddings": 8192,
                              "hidden_act": "gelu_pytorch_tanh"},
                    eager=EagerLayer(norm_weight_fp32=True))  # GemmaRMSNorm: x * (1 + weight) in fp32
FAMILY, HF_ARCHITECTURE, MODULES, PIPELINE_ADAPTER = SHAPE.exports
read, hf_config, preset = SHAPE.read, SHAPE.hf_config, SHAPE.preset

PRESETS = {
    "gemma-2b": preset(2048, 18, 8, 1, 16384),
    "gemma-7b": preset(3072, 28, 16, 16, 24576),
}
