"""Predicted activation bytes against what autograd really saves for backward in tiny real HF
models (``torch.autograd.graph.saved_tensors_hooks``, unique storages, parameters excluded)."""

from __future__ import annotations

import pytest

from dstk.estimate import saved_activation_bytes
from dstk.models import family_module

LLAMA = {"model_type": "llama", "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 352, "vocab_size": 512, "max_position_embeddings": 512}
GPT2 = {"model_type": "gpt2", "n_embd": 128, "n_layer": 2, "n_head": 4, "vocab_size": 512, "n_positions": 512}
BATCH = 2


def measured_saved_bytes(cfg: dict, *, attention: str, seq_len: int, precision: str, recompute: str) -> int:
    import torch
    import transformers

    keys = dict(cfg)
    config = transformers.AutoConfig.for_model(keys.pop("model_type"), **keys, attn_implementation=attention)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to(getattr(torch, {"bf16": "bfloat16"}.get(
        precision, "float32")))
    model.train()
    if recompute == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    ids = torch.randint(0, cfg["vocab_size"], (BATCH, seq_len))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(input_ids=ids, labels=ids)
    out.loss.backward()  # the graph was real
    return sum(saved.values())


CASES = [(family, cfg, attention, seq, precision, recompute)
         for family, cfg, precisions in (("llama", LLAMA, ("fp32", "bf16")), ("gpt2", GPT2, ("fp32",)))
         for attention in ("eager", "sdpa") for seq in (64, 256) for precision in precisions
         for recompute in ("none", "full")]


@pytest.mark.parametrize("family,cfg,attention,seq,precision,recompute", CASES,
                         ids=[f"{c[0]}-{c[2]}-s{c[3]}-{c[4]}-{c[5]}" for c in CASES])
def test_saved_activations_within_5_percent(family, cfg, attention, seq, precision, recompute):
    spec = family_module(cfg["model_type"]).read(cfg, name=family)
    got = measured_saved_bytes(cfg, attention=attention, seq_len=seq, precision=precision, recompute=recompute)
    want = saved_activation_bytes(model=spec, micro_batch=BATCH, seq_len=seq, precision=precision,
                                  attention=attention, recompute=recompute, cpu=True)
    assert want == pytest.approx(got, rel=0.05), f"predicted {want:.0f}, measured {got}"
