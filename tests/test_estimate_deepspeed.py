"""Predicted model states and buffers against what the real DeepSpeed holds.

Two gloo ranks run ``tests/estimate_ranks.py``: a tiny real HF model is wrapped by
``deepspeed.initialize`` for each case, and rank 0 reports the bytes of the unique tensor storages
the case added, after initialize, after the first backward and after the first step. The
estimator's model-state terms (``dstk.estimate.memory``) must match each within 2%.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dist import run_ranks
from dstk.estimate import memory as mem
from dstk.estimate import rank_params
from dstk.layout import Layout
from dstk.models import family_module

HERE = Path(__file__).parent
BUCKET = 50_000  # the same small bucket estimate_ranks.py configures
THRESHOLD = 1000  # stage3_param_persistence_threshold: the norms persist, the matrices are sharded
DP = 2

LLAMA = {"model_type": "llama", "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 352, "vocab_size": 2048, "max_position_embeddings": 64,
         "tie_word_embeddings": False}
GPT2 = {"model_type": "gpt2", "n_embd": 128, "n_layer": 2, "n_head": 4, "vocab_size": 2048, "n_positions": 64,
        "tie_word_embeddings": True}

CASES = [  # (family, config, ZeRO stage, precision, optimizer offload, AutoTP degree)
    ("llama", LLAMA, 0, "bf16", "none", 1), ("llama", LLAMA, 1, "bf16", "none", 1),
    ("llama", LLAMA, 2, "bf16", "none", 1), ("llama", LLAMA, 3, "bf16", "none", 1),
    ("llama", LLAMA, 0, "fp32", "none", 1), ("llama", LLAMA, 2, "fp32", "none", 1),
    ("llama", LLAMA, 3, "fp32", "none", 1),
    ("gpt2", GPT2, 1, "bf16", "none", 1), ("gpt2", GPT2, 3, "bf16", "none", 1), ("gpt2", GPT2, 0, "fp32", "none", 1),
    ("llama", LLAMA, 2, "bf16", "cpu", 1), ("llama", LLAMA, 3, "bf16", "cpu", 1),
    ("llama", LLAMA, 1, "bf16", "none", 2),  # last: AutoTP sets up a TP mesh for the whole process
]


def predicted(config: dict, stage: int, precision: str, offload: str = "none", tp: int = 1) -> dict[str, float]:
    """What the estimator says this rank holds at each of the three points.

    - init: parameters, the fp32 master (ZeRO-0 mixed precision: and the Adam states, which
      ``BF16_Optimizer`` creates at initialize), ZeRO-3's gradient partition buffer and bucket;
      with offload also the pinned fp32 gradient partition and the staging buffers;
    - backward: init plus the gradients (ZeRO-3 and offload: already in their buffers);
    - step: gradients freed, optimizer states present, ZeRO-3's persistent tensors gathered.
    All ranks live on one CPU here, so GPU and CPU bytes add up.
    """
    spec = family_module(config["model_type"]).read(config, name="t")
    dp = DP // tp
    params = rank_params(spec, Layout(dp=dp, tp=tp, zero_stage=stage))
    tensors = (spec.embedding_tensors + spec.layer_tensors * spec.num_layers + spec.final_tensors
               + spec.lm_head_tensors)
    persistent = sum(t for t in tensors if t <= THRESHOLD) if stage == 3 else 0
    kw = dict(params=params, persistent=0, precision=precision, optimizer="adamw", zero_stage=stage, dp=dp)
    s = mem.model_states(**kw)  # where each term lives does not matter on one CPU
    grads = mem.model_states(**kw, offload_optimizer=offload).grads_bytes
    w = mem.param_bytes(precision)
    bucket = mem.reduce_bucket_bytes(zero_stage=stage, precision=precision, params=params,
                                     buffers=mem.ZeroBuffers(reduce_bucket_size=BUCKET))
    staging = sum(mem.offload_buffer_bytes(zero_stage=stage, precision=precision, offload_optimizer=offload,
                                           params=params, dp=dp, largest_tensor=spec.largest_tensor))
    states_at_init = stage == 0 and w == 2
    init = s.params_bytes + s.master_bytes + (s.states_bytes if states_at_init else 0) + staging
    if offload != "none":
        init += s.step_grads_bytes
    if stage == 3:
        init += grads + bucket
        return {"init": init, "backward": init, "step": init + s.states_bytes + w * persistent}
    return {"init": init, "backward": init + grads, "step": init + (0 if states_at_init else s.states_bytes)}


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_model_states_match_live_deepspeed_storages():
    cases = [{"config": cfg, "stage": stage, "precision": prec, "offload": off, "threshold": THRESHOLD, "tp": tp}
             for _, cfg, stage, prec, off, tp in CASES]
    ranks = run_ranks(HERE / "estimate_ranks.py", json.dumps(cases), world_size=DP, timeout=280)
    line = next(x for x in ranks[0].output.splitlines() if x.startswith("RESULT "))
    measured = json.loads(line[len("RESULT "):])
    rows, bad = [], []
    for (family, cfg, stage, prec, off, tp), got in zip(CASES, measured):
        want = predicted(cfg, stage, prec, off, tp)
        for point in ("init", "backward", "step"):
            err = want[point] / got[point] - 1
            rows.append(f"{family} ZeRO-{stage} {prec} offload={off} tp={tp} {point}: predicted {want[point]:.0f} measured {got[point]} "
                        f"({err:+.2%})")
            if abs(err) > 0.02:
                bad.append(rows[-1])
    print("\n".join(rows))
    assert not bad, "\n".join(bad)
