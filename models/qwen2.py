"""Qwen2 and Qwen2.5 (``Qwen2ForCausalLM``): a Llama-shaped decoder with biases on the q/k/v
projections (not on o_proj), tied embeddings for the small sizes. Source: Yang et al. 2024
(Qwen2, Qwen2.5 reports); tensor list as in ``transformers/models/qwen2/modeling_qwen2.py``."""

from __future__ import annotations

from dstk.models.llama import MODULES, llama_like
from dstk.models.spec import ModelSpec

FAMILY = "qwen2"
HF_ARCHITECTURE = "Qwen2ForCausalLM"
MODULES = dict(MODULES)


def _qwen2(h, layers, heads, kv, ffn, vocab, *, tied=False, positions=32768):
    return {"model_type": FAMILY, "hidden_size": h, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv, "intermediate_size": ffn, "vocab_size": vocab,
            "max_position_embeddings": positions, "tie_word_embeddings": tied, "rope_theta": 1e6}


PRESETS = {
    "qwen2-7b": _qwen2(3584, 28, 28, 4, 18944, 152064, positions=131072),
    "qwen2.5-0.5b": _qwen2(896, 24, 14, 2, 4864, 151936, tied=True),
    "qwen2.5-1.5b": _qwen2(1536, 28, 12, 2, 8960, 151936, tied=True),
    "qwen2.5-3b": _qwen2(2048, 36, 16, 2, 11008, 151936, tied=True),
    "qwen2.5-7b": _qwen2(3584, 28, 28, 4, 18944, 152064),
    "qwen2.5-14b": _qwen2(5120, 48, 40, 8, 13824, 152064),
    "qwen2.5-32b": _qwen2(5120, 64, 40, 8, 27648, 152064),
    "qwen2.5-72b": _qwen2(8192, 80, 64, 8, 29568, 152064),
}


def read(cfg: dict, *, name: str) -> ModelSpec:
    return llama_like(cfg, name=name, family=FAMILY, qkv_bias=True, o_bias=False)


def hf_config(spec: ModelSpec) -> dict:
    return dict(spec.hf_config)


# --- Pipeline adapter (issue 5, dstk.pipeline) ------------------------------------------------
# Where the HF model keeps what dstk.pipeline cuts into stages (docs/pipeline.md). No torch here.
from dstk.pipeline.adapter import PipelineAdapter  # noqa: E402

# Per-layer masks from config.layer_types (full / sliding attention; mask='auto').

PIPELINE_ADAPTER = PipelineAdapter(
    family=FAMILY,
    embed_parts=(("tokens", MODULES["embed"]),),
    layers=MODULES["layers"],
    final_parts=(("norm", MODULES["final_norm"]),),
    head=MODULES["lm_head"],
    rotary="model.rotary_emb",
)
