"""ZeRO-3's gathered parameters at the peak, as DeepSpeed 0.19.8's coordinator holds them.

``dstk.estimate.memory.gathered_params`` says how many partitioned parameter elements are gathered
at the loss (beside the logits: the step's peak) and at most over a step (forward's last layer,
when the prefetch overshoots ``stage3_max_live_parameters`` by the LM head). The fast tests pin its
cases; ``test_measured_on_two_ranks`` runs ``tests/zero3_gathered_ranks.py`` on 2 gloo ranks
(a real HF Llama under ``deepspeed.initialize``, every fetch counted: the most gathered at once
over each measured step, and what is held when forward returns) and compares it with what
``dstk.estimate.estimate`` prices for the same model and the same file (``read_settings``: what
``dstk estimate --config`` does), for configs as users write them (no stage3_* key), as
``dstk generate`` writes them, and with a small ``max_live``/prefetch bucket that make the cap
bind, with layer matrices larger than the bucket and smaller.

Tolerance: the prefetch adds whole parameters, so DeepSpeed stops anywhere within one layer
matrix ``t`` past ``max_live``; the formula states the bound. Each measured figure must lie at
or below the estimate and less than ``min(t, stage3_prefetch_bucket_size)`` under it: an
under-count of any size, or an over-count by one bucket, fails (checked by mutation: the old
formula's ``largest + prefetch``, the bound minus one bucket, and the bound plus one bucket each
fail). The reuse-distance tail is an estimate, not a bound: within the same width either way.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from dist import run_ranks
from dstk.estimate import estimate
from dstk.estimate import memory as mem
from dstk.estimate.dsconfig import read_settings
from dstk.hardware import Cluster, get_gpu
from dstk.layout import Layout, Training
from dstk.models import family_module
from dstk.render import ds_config

HERE = Path(__file__).parent
DP = 2
SEQ = 32  # zero3_gathered_ranks.SEQ_LEN
CPU2 = Cluster(num_nodes=1, gpus_per_node=DP, gpu=get_gpu("cpu"))
NAME = "ZeRO-3 gathered parameters"

# Layer matrices larger than a 1e5 prefetch bucket (MLP 1.8e5 elements; the attention ones sit
# under DeepSpeed's 1e5 persistence threshold) and an LM head of 1.05e6.
BIG = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
       "num_key_value_heads": 2, "intermediate_size": 704, "vocab_size": 4096, "max_position_embeddings": SEQ,
       "tie_word_embeddings": False}
# Layer matrices smaller than the bucket (at most 4.5e4), an LM head of 2.6e5.
SMALL = dict(BIG, hidden_size=128, intermediate_size=352, vocab_size=2048)


def config(**zero) -> dict:
    return {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
            "zero_optimization": {"stage": 3, **zero}}


def spec_of(model: dict):
    return family_module(model["model_type"]).read(model, name="t")


def layout() -> Layout:
    return Layout(dp=DP, zero_stage=3, micro_batch=1, grad_accum=1)


def training(precision: str = "bf16") -> Training:
    return Training(seq_len=SEQ, global_batch=DP, precision=precision, optimizer="adamw", attention="sdpa")


def generated(model: dict) -> dict:
    """The ds_config.json ``dstk generate`` writes for this layout on CPU ranks."""
    from dstk.estimate.buckets import choose_buffers
    from dstk.intent import TrainingIntent

    buffers, _ = choose_buffers(model=spec_of(model), layout=layout(), training=training(), cluster=CPU2)
    intent = TrainingIntent(seq_len=SEQ, global_batch=DP, precision="bf16", optimizer="adamw")
    return ds_config(layout=layout(), training=intent, torch_adam=True, buffers=buffers)


CAP = dict(stage3_max_live_parameters=400_000, stage3_prefetch_bucket_size=100_000,
           stage3_max_reuse_distance=400_000)
CASES = (  # (label, model, DeepSpeed config, recompute)
    ("(a) DeepSpeed's defaults", BIG, config(), False),
    ("(b) dstk's generated config", BIG, generated(BIG), False),
    ("(c) max_live caps the prefetch, matrices > bucket", BIG, config(**CAP), False),
    ("(c) the same, gradient checkpointing", BIG, config(**CAP), True),
    ("(c) max_live 2e6", BIG, config(**dict(CAP, stage3_max_live_parameters=2_000_000)), False),
    ("(c) matrices < bucket", SMALL, config(**dict(CAP, stage3_max_live_parameters=500_000,
                                                   stage3_param_persistence_threshold=1000)), False),
    ("(c) reuse 5e6 keeps the tail (an estimate)", BIG,
     config(**dict(CAP, stage3_max_reuse_distance=5_000_000)), False),
)


def predicted(model: dict, ds: dict) -> tuple[float, float, float]:
    """(at the loss, most, prefetch bucket) in elements: what ``estimate`` prices for this file."""
    spec = spec_of(model)
    settings = read_settings(ds, hidden_size=spec.hidden_size)
    per_gpu = estimate(model=spec, layout=layout(), training=training(settings.precision), cluster=CPU2,
                       buffers=settings.buffers).memory.per_gpu
    named = {b.name: b.bytes / 2 for b in per_gpu.buffers}
    at_loss = named[NAME]
    return at_loss, named.get(f"{NAME}, forward's last layer", at_loss), settings.buffers.prefetch_bucket_size


@functools.cache
def measured() -> list[dict]:
    cases = [{"model": model, "ds": ds, "recompute": recompute} for _, model, ds, recompute in CASES]
    ranks = run_ranks(HERE / "zero3_gathered_ranks.py", json.dumps(cases), world_size=DP, timeout=500)
    line = next(x for x in ranks[0].output.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


# --- the formula's cases (fast) ----------------------------------------------------------------

G, T = 1_048_576, 180_224  # BIG's LM head and largest layer matrix


def gp(*, params=5_000_000, persistent=0, live=400_000, reuse=400_000, bucket=100_000):
    return mem.gathered_params(params=params, persistent=persistent, largest_tensor=G, largest_layer_tensor=T,
                               buffers=mem.ZeroBuffers(max_live_parameters=live, max_reuse_distance=reuse,
                                                       prefetch_bucket_size=bucket))


def test_max_live_caps_the_prefetch_not_what_is_held():
    g = gp()
    assert g.most == 400_000 + G  # the LM head overshoots the cap whole
    assert g.at_loss == G  # the LM head is kept for backward; the cap stops the prefetch


def test_the_prefetch_refills_to_max_live_at_the_loss():
    g = gp(live=2_000_000)
    assert g.at_loss == 2_000_000 + T
    assert g.most == 2_000_000 + G


def test_a_layer_tensor_larger_than_the_lm_head_overshoots_instead():
    """Mixtral's fused experts: the prefetch's last parameter may be a layer tensor larger than g."""
    g = mem.gathered_params(params=5e9, persistent=0, largest_tensor=G, largest_layer_tensor=3 * G,
                            buffers=mem.ZeroBuffers(max_live_parameters=1e6, max_reuse_distance=1e6))
    assert g.at_loss == g.most == 1e6 + 3 * G


def test_the_bucket_does_not_add_to_the_working_set():
    assert gp(bucket=100_000) == gp(bucket=300_000)


def test_a_reuse_distance_of_twice_the_model_keeps_it_whole():
    g = gp(reuse=10_000_000, persistent=700_000)
    assert g.at_loss == g.most == 4_300_000  # the partitioned ones only
    assert gp(reuse=9_999_999).most < 4_300_000 + 700_000


def test_a_shorter_reuse_keeps_the_tail():
    g = gp(reuse=8_000_000, persistent=1_000_000)
    assert g.at_loss == g.most == 8_000_000 / 2 * 4_000_000 / 5_000_000


def test_never_more_than_the_partitioned_parameters():
    g = gp(params=1_200_000, persistent=200_000)
    assert g.at_loss == g.most == 1_000_000


def test_the_estimate_prices_forward_at_its_last_layer_when_that_holds_more():
    """With the logits small, forward's fullest moment is its last layer, the LM head prefetched."""
    at_loss, most, _ = predicted(BIG, config(**CAP))
    assert (at_loss, most) == (G, 400_000 + G)


def test_the_plan_states_one_figure():
    """The plan's why line and its buffer line give the same gathered bytes."""
    import contextlib
    import io
    import re

    from dstk.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["plan", "--model", "llama-3-70b", "--gpus", "64", "--gpu", "h100-sxm", "--seq-len", "4096",
              "--global-batch", "512"])
    text = " ".join(out.getvalue().split())
    why = re.search(r"so ([\d.]+ GiB) stay gathered at the loss", text)
    line = re.search(rf"{NAME}: .*?= ([\d.]+ GiB) \(gpu, forward, backward", text)
    assert why and line, text
    assert why.group(1) == line.group(1)


# --- against real DeepSpeed --------------------------------------------------------------------

@pytest.mark.distributed
@pytest.mark.parametrize("index", range(len(CASES)), ids=[c[0] for c in CASES])
def test_measured_on_two_ranks(index):
    label, model, ds, _ = CASES[index]
    got = measured()[index]
    steps = got["steps"]
    assert all(s["peak"] == s["counter"] for s in steps), steps  # our count is DeepSpeed's own
    most = max(s["peak"] for s in steps)
    at_loss = max(s["at_loss"] for s in steps)
    want_loss, want_most, bucket = predicted(model, ds)
    width = min(bucket, max(spec_of(model).layer_tensors))
    report = (f"{label}: measured at the loss {at_loss:,} most {most:,}; estimated {want_loss:,.0f} "
              f"{want_most:,.0f} (width {width:,} elements)")
    print(report)
    for want, got in ((want_loss, at_loss), (want_most, most)):
        low = -width if "an estimate" in label else 0
        assert low <= want - got < width, report
