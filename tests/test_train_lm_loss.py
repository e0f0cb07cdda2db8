"""The fine-tune's forward (``dstk.train.worker.lm_loss``) on a real transformers model builds no KV cache."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
def test_the_training_forward_builds_no_kv_cache(model_type):
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    from dstk.train.worker import lm_loss

    kw = ({"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": 64} if model_type == "llama"
          else {"n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 64, "n_positions": 32})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **kw))
    model.train()
    assert model.config.use_cache  # what a from_pretrained/from_config model has: a cache unless told
    seen = []
    model.register_forward_hook(lambda _m, _args, out: seen.append(out.past_key_values))
    batch = torch.randint(0, 64, (2, 16))
    loss = lm_loss(model, batch)
    loss.backward()
    assert seen == [None] and torch.isfinite(loss)
    model(input_ids=batch, labels=batch)  # the same call without use_cache=False keeps one
    assert seen[-1] is not None
