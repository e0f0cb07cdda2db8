"""A generic GPT-style decoder from its dimensions alone (``--num-layers --hidden-size ...``).

It is given the Llama architecture (RMSNorm, rotary, SwiGLU, grouped-query attention, no biases,
untied lm_head) because that is what most decoders trained today look like and because it can be
built as a real ``LlamaForCausalLM``. Without ``ffn_hidden_size`` the MLP width follows Llama's
rule, ``8h/3`` rounded up to a multiple of 256 (Touvron et al. 2023), which keeps the MLP at
~8h^2 parameters like a GPT ``4h`` MLP.
"""

from __future__ import annotations

from dstk.models.llama import llama_like
from dstk.models.spec import ModelSpec

FAMILY = "generic"


def default_ffn(hidden_size: int, multiple: int = 256) -> int:
    """Llama's SwiGLU width: ``multiple * ceil((8h/3) / multiple)``."""
    width = int(8 * hidden_size / 3)
    return multiple * ((width + multiple - 1) // multiple)


def build(*, num_layers: int, hidden_size: int, num_heads: int, vocab_size: int, ffn_hidden_size: int | None = None,
          num_kv_heads: int | None = None, seq_len: int | None = None, name: str = "generic") -> ModelSpec:
    for key, value in (("num_layers", num_layers), ("hidden_size", hidden_size), ("num_heads", num_heads),
                       ("vocab_size", vocab_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{key}: expected a positive integer, got {value!r}")
    if hidden_size % num_heads:
        raise ValueError(f"num_heads: hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
    cfg = {"model_type": "llama", "hidden_size": hidden_size, "num_hidden_layers": num_layers,
           "num_attention_heads": num_heads, "num_key_value_heads": num_kv_heads or num_heads,
           "intermediate_size": ffn_hidden_size or default_ffn(hidden_size), "vocab_size": vocab_size,
           "max_position_embeddings": seq_len or 4096, "tie_word_embeddings": False}
    spec = llama_like(cfg, name=name, family=FAMILY, qkv_bias=False, o_bias=False)
    return spec if seq_len is not None else _without_seq_len(spec)


def _without_seq_len(spec: ModelSpec) -> ModelSpec:
    import dataclasses

    return dataclasses.replace(spec, seq_len=None, hf_config=spec.hf_config)


def hf_config(spec: ModelSpec) -> dict:
    return dict(spec.hf_config)
