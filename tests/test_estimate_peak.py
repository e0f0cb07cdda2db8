"""The memory estimate against the peak DeepSpeed really allocates.

Two gloo ranks run ``tests/peak_ranks.py``: for each case a real HF Llama is wrapped by
``deepspeed.initialize`` with the case's config and trained a warm-up step and two measured
steps; rank 0 reports the peak of live allocator bytes over the measured steps (torch.profiler
memory events: inside forward, backward and step, not a snapshot after they return) and the
phase it fell in. ``dstk.estimate.estimate`` for the same layout, with the buffers read from the
very same file (``dstk.estimate.dsconfig.read_settings``: what ``dstk estimate --config`` does),
must be within 5% of it, for configs as users write them (stage, precision, optimizer and
micro-batch only: DeepSpeed's 5e8-element buckets) and as ``dstk generate`` writes them
(``dstk.render.ds_config`` with ``dstk.estimate.buckets.choose_buffers``), ZeRO 0-3,
``overlap_comm`` on and off, a tiny model (the bucket dominates) and a 20M-parameter one.

``test_the_old_bucket_cap_fails`` puts back the cap the estimator had (``min(reduce_bucket_size,
P)``, one bucket whatever ``overlap_comm``) and checks that the same measurements reject it.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from dist import run_ranks
from dstk.estimate import MemoryBreakdown, estimate
from dstk.estimate import memory as mem
from dstk.estimate.buckets import choose_buffers
from dstk.estimate.dsconfig import read_settings
from dstk.hardware import Cluster, get_gpu
from dstk.intent import TrainingIntent
from dstk.layout import Layout, Training
from dstk.models import family_module
from dstk.render import ds_config

HERE = Path(__file__).parent
DP = 2
MICRO = 2
SEQ = 64  # peak_ranks.SEQ_LEN
TOLERANCE = 0.05
CPU2 = Cluster(num_nodes=1, gpus_per_node=DP, gpu=get_gpu("cpu"))

TINY = {"model_type": "llama", "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 352, "vocab_size": 2048, "max_position_embeddings": SEQ,
        "tie_word_embeddings": False}  # 0.89M parameters: a 5e8 bucket is 1,000x its gradients
MID = {"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
       "num_key_value_heads": 4, "intermediate_size": 1376, "vocab_size": 8192, "max_position_embeddings": SEQ,
       "tie_word_embeddings": False}  # 20.0M parameters


def user_config(stage: int, *, precision: str = "bf16", accumulation: int = 1, **zero) -> dict:
    """A config as a user writes it: stage, precision, optimizer, micro-batch; DeepSpeed's defaults
    for the rest. ``torch_adam``: the CPU ranks run torch's AdamW, as dstk's CPU configs do."""
    config = {"train_micro_batch_size_per_gpu": MICRO,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
              "zero_optimization": {"stage": stage, **zero}}
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    if accumulation > 1:
        config["gradient_accumulation_steps"] = accumulation
    return config


def spec_of(config: dict):
    return family_module(config["model_type"]).read(config, name="t")


def layout_of(stage: int, accumulation: int = 1) -> Layout:
    return Layout(dp=DP, zero_stage=stage, micro_batch=MICRO, grad_accum=accumulation)


def training_of(precision: str = "bf16", accumulation: int = 1) -> Training:
    return Training(seq_len=SEQ, global_batch=DP * MICRO * accumulation, precision=precision, optimizer="adamw",
                    attention="sdpa")


TRAINING = training_of()


def generated_config(model: dict, stage: int) -> dict:
    """The ``ds_config.json`` ``dstk generate`` writes for this layout on CPU ranks."""
    spec = spec_of(model)
    buffers, _ = choose_buffers(model=spec, layout=layout_of(stage), training=TRAINING, cluster=CPU2)
    intent = TrainingIntent(seq_len=SEQ, global_batch=DP * MICRO, precision="bf16", optimizer="adamw")
    return ds_config(layout=layout_of(stage), training=intent, torch_adam=True, buffers=buffers)


CASES = (  # (label, model config, DeepSpeed config)
    [(f"tiny user ZeRO-{z}", TINY, user_config(z)) for z in range(4)]
    + [("tiny user ZeRO-2 overlap_comm", TINY, user_config(2, overlap_comm=True)),
       ("tiny user ZeRO-3 no overlap_comm", TINY, user_config(3, overlap_comm=False)),
       ("tiny user ZeRO-0 fp32", TINY, user_config(0, precision="fp32")),
       ("tiny user ZeRO-2 fp32", TINY, user_config(2, precision="fp32"))]
    + [(f"tiny generated ZeRO-{z}", TINY, generated_config(TINY, z)) for z in range(4)]
    + [(f"20M user ZeRO-{z}", MID, user_config(z)) for z in (0, 2, 3)]
    + [(f"20M generated ZeRO-{z}", MID, generated_config(MID, z)) for z in (1, 2, 3)]
    # Last: after it, the next case's ZeRO-0 step saw 2P more (seen once; a previous engine's
    # leftover, not the next case's own allocation).
    + [("tiny user ZeRO-1 accumulation 2", TINY, user_config(1, accumulation=2, reduce_bucket_size=100_000))]
)


def predicted(model: dict, ds: dict) -> MemoryBreakdown:
    """``estimate`` of the layout the file describes, with the file's own buffers; per GPU."""
    spec = spec_of(model)
    settings = read_settings(ds, hidden_size=spec.hidden_size)
    accumulation = settings.grad_accum or 1
    return estimate(model=spec, layout=layout_of(settings.zero_stage, accumulation),
                    training=training_of(settings.precision, accumulation), cluster=CPU2,
                    buffers=settings.buffers).memory.per_gpu


def test_a_generated_file_prices_as_its_plan():
    """What ``dstk estimate --config`` reads back from a generated file is what the plan priced."""
    for label, model, ds in CASES:
        if "generated" in label:
            spec = spec_of(model)
            stage = ds["zero_optimization"]["stage"]
            buffers, _ = choose_buffers(model=spec, layout=layout_of(stage), training=TRAINING, cluster=CPU2)
            plan = estimate(model=spec, layout=layout_of(stage), training=TRAINING, cluster=CPU2, buffers=buffers)
            assert predicted(model, ds).total_bytes == plan.memory.per_gpu.total_bytes, label


@functools.cache
def measured() -> list[dict]:
    cases = [{"model": model, "ds": ds} for _, model, ds in CASES]
    ranks = run_ranks(HERE / "peak_ranks.py", json.dumps(cases), world_size=DP, timeout=400)
    line = next(x for x in ranks[0].output.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def compare(prediction) -> tuple[list[str], list[str]]:
    rows, bad = [], []
    for (label, model, ds), got in zip(CASES, measured(), strict=True):
        want = prediction(model, ds)
        err = want / got["peak"] - 1
        rows.append(f"{label}: measured {got['peak'] / 2**20:,.1f} MiB in {got['phase']}, "
                    f"estimated {want / 2**20:,.1f} MiB ({err:+.2%})")
        if abs(err) > TOLERANCE and not _gloo_copy_outlived_backward(model, ds, want=want, got=got):
            bad.append(rows[-1])
    return rows, bad


def _gloo_copy_outlived_backward(model: dict, ds: dict, *, want: float, got: dict) -> bool:
    """ZeRO-0 all-reduces a flat copy of the gradients (``w P`` bytes) at the end of backward; on
    gloo its worker thread frees that copy, sometimes only after ``step()`` has started (seen in one
    of three quiet CI runs: +1.7 MiB = 2 B x 0.89M on the tiny model, measured 20.7 vs 19.0 MiB).
    A CPU-rank race, not a GPU allocation: the step's peak then holds the copy on top of the
    estimate. Accepted only for ZeRO-0, only in the step, and only as exactly that copy (within 5%)."""
    if (ds.get("zero_optimization") or {}).get("stage", 0) != 0 or got["phase"] != "step":
        return False
    keys = dict(model)
    params = family_module(keys["model_type"]).read(keys, name="t").num_params
    copy = (2 if (ds.get("bf16") or {}).get("enabled") else 4) * params
    return abs((want + copy) / got["peak"] - 1) <= TOLERANCE


@pytest.mark.distributed
@pytest.mark.timeout(450)
def test_estimate_equals_the_measured_peak():
    phases = {}

    def prediction(model, ds):
        m = predicted(model, ds)
        phases[id(ds)] = m.peak_phase
        return m.total_bytes - m.overhead_bytes  # the allocator's bytes: no CUDA context on a CPU rank

    rows, bad = compare(prediction)
    print("\n".join(rows))
    assert len(rows) == len(CASES) == 19
    assert not bad, "\n".join(bad)
    # Where the bucket dominates, the peak is in backward (ZeRO-1/2) and the estimate says so.
    for (label, _, ds), got in zip(CASES, measured()):
        if label.startswith("tiny user ZeRO-") and ds["zero_optimization"]["stage"] in (1, 2):
            assert got["phase"] == phases[id(ds)] == "backward", label
    # The measurement sees DeepSpeed's flat buffers: ZeRO-2's 5e8-element bf16 bucket only inside
    # backward (twice with overlap_comm), ZeRO-3's from initialize, between the steps too.
    got = dict(zip((label for label, _, _ in CASES), measured()))
    zero2, double, zero3 = (got[f"tiny user {x}"] for x in ("ZeRO-2", "ZeRO-2 overlap_comm", "ZeRO-3"))
    assert zero2["phases"]["backward"] - zero2["between_steps"] > 1e9 > zero2["phases"]["step"]
    assert double["phases"]["backward"] - zero2["phases"]["backward"] == pytest.approx(1e9, rel=1e-3)
    assert zero3["between_steps"] > 1e9


@pytest.mark.distributed
@pytest.mark.timeout(450)
def test_the_old_bucket_cap_fails(monkeypatch):
    """Mutation check: the estimator as it was (bucket capped at the parameters, never doubled)."""

    def capped(*, zero_stage, precision, params, buffers):
        return 0.0 if zero_stage == 0 else mem.param_bytes(precision) * min(buffers.reduce_bucket_size, params)

    monkeypatch.setattr(mem, "reduce_bucket_bytes", capped)
    monkeypatch.setattr(mem.ZeroBuffers, "overlaps", lambda self, stage: False)

    def prediction(model, ds):
        m = predicted(model, ds)
        return m.total_bytes - m.overhead_bytes

    _, bad = compare(prediction)
    assert len(bad) >= 4, "the measured peaks should reject a bucket capped at the model size"
