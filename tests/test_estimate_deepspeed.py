"""Predicted model states and buffers against what the real DeepSpeed holds.

Two gloo ranks run ``tests/estimate_ranks.py``: a tiny real HF model is wrapped by
``deepspeed.initialize`` for each case, and rank 0 reports the bytes of the unique tensor storages
the case added, after initialize, after the first backward and after the first step. The
estimator's model-state terms (``dstk.estimate.memory``) must match each within 2%.

A diagnostic of the terms, not of the peak: the snapshots fall between the phases, so ZeRO-1/2's
reduce bucket (alive only inside backward) and the step's transients are never seen here, and
the buckets are set small on both sides. The peak itself is judged in
``tests/test_estimate_peak.py``.
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
    off = mem.model_states(**kw, offload_optimizer=offload)
    # ZeRO-3 keeps its gradient partition under offload too, on the CPU (in ``cpu_bytes``).
    grads = s.grads_bytes if stage == 3 else off.grads_bytes
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


PP_CASES = [(LLAMA, 0, "bf16"), (LLAMA, 1, "bf16")]  # (config, ZeRO stage, precision), pp=2 x dp=1


def predicted_pp(config: dict, zero_stage: int, precision: str, stage: int) -> dict[str, float]:
    """What the estimator says one rank of pipeline stage ``stage`` (pp=2, dp=1) holds after
    initialize and after the first ``train_batch`` in model states: ``rank_params`` of that stage through
    ``model_states``. ZeRO-1: as without a pipeline (master at initialize, states at the step,
    the gradient partition freed by it). ZeRO-0 bf16 under the pipeline engine differs from the
    plain engine in *when*, not in how much (measured): its gradient buffer exists from
    initialize and stays, and the Adam states appear at the first step."""
    spec = family_module(config["model_type"]).read(config, name="t")
    params = rank_params(spec, Layout(dp=1, pp=2, zero_stage=zero_stage), stage=stage)
    s = mem.model_states(params=params, persistent=0, precision=precision, optimizer="adamw",
                         zero_stage=zero_stage, dp=1)
    init = s.params_bytes + s.master_bytes + (s.grads_bytes if zero_stage == 0 else 0)
    return {"init": init, "step": init + s.states_bytes}


@pytest.mark.distributed
@pytest.mark.timeout(200)
def test_pp2_model_states_match_live_deepspeed_storages():
    """Every rank of a 2-stage ``to_pipeline`` run holds what the estimator predicts for its stage
    (tests/pipeline_memory_ranks.py: the caller's HF model is deleted after wrapping)."""
    cases = [{"config": cfg, "stage": z, "precision": prec} for cfg, z, prec in PP_CASES]
    ranks = run_ranks(HERE / "pipeline_memory_ranks.py", json.dumps(cases), world_size=2, timeout=180)
    rows, bad = [], []
    for r in ranks:
        line = next(x for x in r.output.splitlines() if x.startswith("RESULT "))
        for (cfg, z, prec), got in zip(PP_CASES, json.loads(line.split(" ", 2)[2])):
            want = predicted_pp(cfg, z, prec, got["stage_id"])
            # After initialize every live storage is a model state; after the step the last stage also
            # keeps its last micro-batch's logits and their gradient (activations, not model states).
            for point, measured in (("init", got["init"]), ("step", got["step_states"])):
                err = want[point] / measured - 1
                rows.append(f"pp=2 stage {got['stage_id']} ZeRO-{z} {prec} {point}: predicted {want[point]:.0f} "
                            f"measured {measured} of {got[point]} live ({err:+.2%})")
                if abs(err) > 0.02:
                    bad.append(rows[-1])
    print("\n".join(rows))
    assert len(rows) == 2 * 2 * len(PP_CASES)
    assert not bad, "\n".join(bad)


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
