"""Llama 2 and Llama 3.x (``LlamaForCausalLM``): the layout the other Llama-shaped families share
(``dstk.models.llama_shaped``). Sources: Touvron et al. 2023 (Llama 2), Grattafiori et al. 2024
(Llama 3); tensor list as in ``transformers/models/llama/modeling_llama.py``."""

from __future__ import annotations

from dstk.models.llama_shaped import LlamaShaped

SHAPE = LlamaShaped(family="llama", architecture="LlamaForCausalLM",
                    defaults={"rope_theta": 10000.0, "rms_norm_eps": 1e-5})
FAMILY, HF_ARCHITECTURE, MODULES, PIPELINE_ADAPTER = SHAPE.exports
read, hf_config, preset = SHAPE.read, SHAPE.hf_config, SHAPE.preset
LLAMA3 = {"rope_theta": 500000.0}

PRESETS = {
    "llama-2-7b": preset(4096, 32, 32, 32, 11008, 32000, 4096),
    "llama-2-13b": preset(5120, 40, 40, 40, 13824, 32000, 4096),
    "llama-2-70b": preset(8192, 80, 64, 8, 28672, 32000, 4096),
    "llama-3-8b": preset(4096, 32, 32, 8, 14336, 128256, 8192, **LLAMA3),
    "llama-3-70b": preset(8192, 80, 64, 8, 28672, 128256, 8192, **LLAMA3),
    "llama-3.1-8b": preset(4096, 32, 32, 8, 14336, 128256, 131072, **LLAMA3),
    "llama-3.1-70b": preset(8192, 80, 64, 8, 28672, 128256, 131072, **LLAMA3),
    "llama-3.1-405b": preset(16384, 126, 128, 8, 53248, 128256, 131072, **LLAMA3),
    "llama-3.2-1b": preset(2048, 16, 32, 8, 8192, 128256, 131072, tie_word_embeddings=True, head_dim=64, **LLAMA3),
    "llama-3.2-3b": preset(3072, 28, 24, 8, 8192, 128256, 131072, tie_word_embeddings=True, head_dim=128, **LLAMA3),
}
