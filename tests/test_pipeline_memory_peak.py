"""A DeepSpeed pipeline's memory at its peak, against DeepSpeed 0.19.8 as it runs.

Two gloo ranks (2 stages, dp = 1) run ``tests/pipeline_peak_ranks.py``: a tiny real Llama wrapped
by ``dstk.models.to_pipeline``, ``deepspeed.initialize`` with each case's config, a warm-up
``train_batch`` and two measured ones; each rank reports the peak of live allocator bytes over the
measured batches (torch.profiler's allocator events, every thread, inside each pipeline
instruction: not a snapshot) and the bytes live between batches. ``dstk.estimate.estimate`` of the
same layout, with the buffers read from the very same config (``read_settings``: what
``dstk estimate --config`` does), must match per stage.

What the measurements pinned down (each a term of ``dstk.estimate.memory``):

- ``BF16_Optimizer`` (bf16 ZeRO-0 under a pipeline, DeepSpeed's default; or ZeRO-1 with
  ``data_types.grad_accum_dtype: "fp32"``, what dstk renders) keeps an accumulation buffer of
  every parameter (``aP``: 2 B bf16, 4 B fp32) beside the bf16 ``.grad`` (``2P``), and casts a
  bf16 buffer to fp32 at the step (``bf16_optimizer_states`` / ``bf16_optimizer_peaks``);
- the pipeline engine holds one ``b s h w`` receive buffer per stage, not four
  (``pipeline_buffer_bytes``);
- the last stage keeps the logits, input and input gradient of its two pipe buffers' earlier
  micro-batches (``last_stage_outputs_bytes``);
- ZeRO-1 (DeepSpeedZeroOptimizer) under a pipeline keeps its bucket across micro-batches and
  appends a second at the schedule's end (``phase_peaks(pipeline=True)``).

``test_each_missing_term_is_caught`` takes each term out again and checks the same measurements
reject the estimate.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from dist import run_ranks
from dstk.estimate import estimate
from dstk.estimate import memory as mem
from dstk.estimate.buckets import choose_buffers
from dstk.estimate.dsconfig import read_settings
from dstk.hardware import Cluster, get_gpu
from dstk.intent import TrainingIntent
from dstk.layout import Layout, Training
from dstk.models import family_module
from dstk.render import ds_config

HERE = Path(__file__).parent
SEQ, MICRO, ACCUM = 128, 2, 4
CPU2 = Cluster(num_nodes=1, gpus_per_node=2, gpu=get_gpu("cpu"))
MODEL = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 704, "vocab_size": 4096, "max_position_embeddings": SEQ,
         "tie_word_embeddings": False}  # 2.5M parameters a stage; b s h = 65,536 elements
PEAK_TOLERANCE = 0.04
BETWEEN_TOLERANCE = 0.002  # between batches nothing but states and fixed buffers is live: exact


def spec():
    return family_module("llama").read(MODEL, name="t")


def layout(zero: int) -> Layout:
    return Layout(dp=1, pp=2, zero_stage=zero, micro_batch=MICRO, grad_accum=ACCUM)


TRAINING = Training(seq_len=SEQ, global_batch=MICRO * ACCUM, precision="bf16", optimizer="adamw", attention="sdpa")


def user_config(zero: int, **extra) -> dict:
    """As a user writes it: DeepSpeed's defaults for everything else (5e8-element buckets)."""
    return {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": ACCUM,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
            "zero_optimization": {"stage": zero}, "bf16": {"enabled": True}, "steps_per_print": 10**9, **extra}


def generated_config() -> dict:
    """What ``dstk generate`` writes for the dp=1 pp=2 ZeRO-1 layout on CPU ranks."""
    buffers, _ = choose_buffers(model=spec(), layout=layout(1), training=TRAINING, cluster=CPU2)
    intent = TrainingIntent(seq_len=SEQ, global_batch=MICRO * ACCUM, precision="bf16", optimizer="adamw")
    config = ds_config(layout=layout(1), training=intent, torch_adam=True, buffers=buffers)
    config["steps_per_print"] = 10**9
    return config


CASES = (  # label, DeepSpeed config, DeepSpeed's optimizer class
    ("user ZeRO-0", user_config(0), "BF16_Optimizer"),
    ("user ZeRO-1", user_config(1), "DeepSpeedZeroOptimizer"),
    ("user ZeRO-1 fp32 accumulation", user_config(1, data_types={"grad_accum_dtype": "fp32"}), "BF16_Optimizer"),
    ("generated ZeRO-1", generated_config(), "BF16_Optimizer"),
)


def predicted(ds: dict):
    """Per-stage ``MemoryBreakdown`` of the layout with the file's own buffers (allocator bytes:
    no CUDA context on a CPU rank)."""
    settings = read_settings(ds, hidden_size=MODEL["hidden_size"])
    return estimate(model=spec(), layout=layout(settings.zero_stage), training=TRAINING, cluster=CPU2,
                    buffers=settings.buffers).memory.per_stage


def between_batches(stage, *, params: int, ds: dict) -> float:
    """What is live between two ``train_batch`` calls: the states (bf16 parameters, master,
    Adam's states, ``BF16_Optimizer``'s accumulation buffer: the bf16 ``.grad`` is freed by the
    step's ``zero_grad``), the receive buffer and the last stage's kept outputs."""
    settings = read_settings(ds, hidden_size=MODEL["hidden_size"])
    zero, accum = settings.zero_stage, settings.buffers.grad_accum_dtype
    bf16 = mem.bf16_optimizer_in_pipeline(pp=2, zero_stage=zero, precision="bf16", grad_accum_dtype=accum)
    states = (mem.bf16_optimizer_states(params=params, dp=1, k=2.0, grad_accum_dtype=accum) if bf16
              else mem.model_states(params=params, persistent=0, precision="bf16", optimizer="adamw",
                                    zero_stage=zero, dp=1))
    tokens = MICRO * SEQ
    held = states.params_bytes + states.optimizer_bytes + (states.grads_bytes if bf16 else 0.0)
    held += mem.pipeline_buffer_bytes(pp=2, tokens=tokens, hidden=MODEL["hidden_size"], act_bytes=2)
    if stage == 1:
        kept = mem.pipeline_kept_outputs(last=True, grad_accum=ACCUM)["step"]
        held += kept * mem.last_stage_outputs_bytes(tokens=tokens, hidden=MODEL["hidden_size"],
                                                    vocab=MODEL["vocab_size"], act_bytes=2)
    return held


@functools.cache
def measured() -> tuple[list[dict], list[dict]]:
    cases = [{"model": MODEL, "seq_len": SEQ, "ds": ds} for _, ds, _ in CASES]
    ranks = run_ranks(HERE / "pipeline_peak_ranks.py", json.dumps(cases), world_size=2, timeout=400)
    out = {}
    for r in ranks:
        line = next(x for x in r.output.splitlines() if x.startswith("RESULT "))
        _, rank, data = line.split(" ", 2)
        out[int(rank)] = json.loads(data)
    return out[0], out[1]


def compare(prediction) -> tuple[list[str], list[str]]:
    rows, bad = [], []
    for c, (label, ds, _) in enumerate(CASES):
        want = prediction(ds)
        for got in (measured()[0][c], measured()[1][c]):
            s = got["stage"]
            err = want[s] / got["peak"] - 1
            rows.append(f"{label}, stage {s}: measured {got['peak'] / 2**20:,.2f} MiB in {got['phase']}, "
                        f"estimated {want[s] / 2**20:,.2f} MiB ({err:+.2%})")
            if abs(err) > PEAK_TOLERANCE:
                bad.append(rows[-1])
    return rows, bad


def peaks_of(ds) -> list[float]:
    return [m.total_bytes - m.overhead_bytes for m in predicted(ds)]


# --- fast: the terms as DeepSpeed's code has them -------------------------------------------------


def test_one_receive_buffer_per_stage():
    """``_allocate_or_extend_buffers`` serves both directions from one ``_grad_layer_buf``: b s h w."""
    assert mem.pipeline_buffer_bytes(pp=2, tokens=256, hidden=256, act_bytes=2) == 256 * 256 * 2
    assert mem.pipeline_buffer_bytes(pp=1, tokens=256, hidden=256, act_bytes=2) == 0


def test_which_pipelines_run_bf16_optimizer():
    """``engine.py:2294-2323``: bf16 ZeRO-0 by default, ZeRO-1 only with fp32 accumulation."""
    run = mem.bf16_optimizer_in_pipeline
    assert run(pp=2, zero_stage=0, precision="bf16")
    assert not run(pp=2, zero_stage=1, precision="bf16")
    assert run(pp=2, zero_stage=1, precision="bf16", grad_accum_dtype="fp32")
    assert run(pp=2, zero_stage=1, precision="bf16", grad_accum_dtype="torch.float32")
    assert not run(pp=2, zero_stage=0, precision="bf16", grad_accum_dtype="fp32")  # NotImplementedError there
    assert not run(pp=1, zero_stage=0, precision="bf16") and not run(pp=2, zero_stage=0, precision="fp32")


def test_fp32_accumulation_is_priced_per_micro_batch():
    """``hp.add_(lp.to(fp32))``: the clears (2 w inner, w last), read w, write and read the fp32 copy,
    read and write the buffer: 22 B/param on an inner stage, 20 on the last (bf16: 10 / 8); with
    optimizer offload ZeRO-1 is not BF16_Optimizer (``engine.py:2305``)."""
    from dstk.estimate import steptime as st

    assert st.bf16_pipe_grad_bytes_per_param(last=False, grad_accum_dtype="fp32") == 22.0
    assert st.bf16_pipe_grad_bytes_per_param(last=True, grad_accum_dtype="fp32") == 20.0
    assert st.bf16_pipe_grad_bytes_per_param(last=False) == 10.0
    assert st.bf16_optimizer_in_pipeline(engine="deepspeed", pp=2, zero_stage=1, precision="bf16",
                                         grad_accum_dtype="fp32")
    assert not mem.bf16_optimizer_in_pipeline(pp=2, zero_stage=1, precision="bf16", grad_accum_dtype="fp32",
                                              offload_optimizer="cpu")
    assert mem.pipeline_grad_accum_dtype(pp=2, zero_stage=1, precision="bf16", grad_accum=4) == "fp32"
    assert mem.pipeline_grad_accum_dtype(pp=2, zero_stage=1, precision="bf16", grad_accum=1) is None
    assert mem.pipeline_grad_accum_dtype(pp=2, zero_stage=1, precision="bf16", grad_accum=4,
                                         offload_optimizer="cpu") is None


def test_bf16_optimizer_states_hold_the_accumulation_buffer():
    """2P params, aP buffer from initialize, 4P/n master, 8P/n Adam, 4P/n cast at the step (bf16 only)."""
    s = mem.bf16_optimizer_states(params=1000, dp=2, k=2.0)
    assert (s.params_bytes, s.grads_bytes, s.master_bytes, s.states_bytes, s.step_grads_bytes) == \
        (2000, 2000, 2000, 4000, 2000)
    f = mem.bf16_optimizer_states(params=1000, dp=2, k=2.0, grad_accum_dtype="fp32")
    assert (f.grads_bytes, f.step_grads_bytes) == (4000, 0)


def test_generated_pipeline_config_accumulates_in_fp32_and_prices_as_its_plan():
    """dstk renders fp32 accumulation for a bf16 ZeRO-1 pipeline (no bf16 sums, no warning),
    ``estimate --config`` reads it back, and the plan's buffers say the same."""
    ds = generated_config()
    assert ds["data_types"] == {"grad_accum_dtype": "fp32"}
    buffers, _ = choose_buffers(model=spec(), layout=layout(1), training=TRAINING, cluster=CPU2)
    assert buffers.grad_accum_dtype == "fp32"
    assert read_settings(ds, hidden_size=MODEL["hidden_size"]).buffers.grad_accum_dtype == "fp32"
    plan = estimate(model=spec(), layout=layout(1), training=TRAINING, cluster=CPU2, buffers=buffers)
    assert [m.total_bytes for m in predicted(ds)] == [m.total_bytes for m in plan.memory.per_stage]
    # ZeRO-0 cannot take fp32 (DeepSpeed raises NotImplementedError): left at DeepSpeed's default.
    intent = TrainingIntent(seq_len=SEQ, global_batch=MICRO * ACCUM, precision="bf16", optimizer="adamw")
    assert "data_types" not in ds_config(layout=layout(0), training=intent)
    assert "data_types" not in ds_config(layout=Layout(dp=2, zero_stage=1, micro_batch=2, grad_accum=4),
                                         training=intent)


def test_generated_pipeline_config_validates_clean(tmp_path):
    """``dstk validate`` of the rendered pipeline config: no finding."""
    from dstk.cli import main

    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(generated_config()))
    assert main(["validate", str(path), "--world-size", "2", "--pipeline-stages", "2"]) == 0


def test_qwen_stage0_holds_the_bf16_accumulation_buffer():
    """qwen2.5-7b, 8 H100s, dp=1 pp=8 ZeRO-0 (DeepSpeed's default accumulation): stage 0 holds the
    bf16 buffer (2P) and the bf16 grads (2P) in every forward after the first backward."""
    from dstk.models import get_model

    model = get_model("qwen2.5-7b")
    cluster = Cluster(num_nodes=1, gpus_per_node=8, gpu=get_gpu("h100-sxm"))
    training = Training(seq_len=8192, global_batch=128, precision="bf16", optimizer="adamw", attention="sdpa")
    est = estimate(model=model, layout=Layout(dp=1, pp=8, zero_stage=0, micro_batch=1, grad_accum=128),
                   training=training, cluster=cluster)
    stage0 = est.memory.per_stage[0]
    params = stage0.params_bytes / 2
    assert stage0.peak_phase in ("forward", "backward")
    assert stage0.grads_bytes == pytest.approx(4 * params, rel=1e-6)


# --- real DeepSpeed on 2 gloo ranks ----------------------------------------------------------------


@pytest.mark.distributed
@pytest.mark.timeout(450)
def test_estimate_equals_the_measured_pipeline_peak():
    rows, bad = compare(peaks_of)
    print("\n".join(rows))
    assert len(rows) == 2 * len(CASES)
    assert not bad, "\n".join(bad)
    for c, (label, ds, optimizer) in enumerate(CASES):
        assert measured()[0][c]["optimizer"] == measured()[1][c]["optimizer"] == optimizer, label
        # Before the step (activations in flight, the last stage's logits): forward and backward.
        stages = predicted(ds)
        for got in (measured()[0][c], measured()[1][c]):
            m = stages[got["stage"]]
            want = max(m.phases["forward"], m.phases["backward"]) - m.overhead_bytes
            seen = max(v for k, v in got["phases"].items() if k not in ("OptimizerStep", "train_batch"))
            assert want / seen - 1 == pytest.approx(0, abs=PEAK_TOLERANCE), (label, got["stage"], want, seen)


@pytest.mark.distributed
@pytest.mark.timeout(450)
def test_between_batches_is_the_states_and_one_receive_buffer():
    """Between batches only states and fixed buffers are live: the sum must be exact."""
    rows, bad = [], []
    for c, (label, ds, _) in enumerate(CASES):
        for got in (measured()[0][c], measured()[1][c]):
            want = between_batches(got["stage"], params=got["stage_params"], ds=ds)
            err = want / got["between"] - 1
            rows.append(f"{label}, stage {got['stage']}: between {got['between'] / 2**20:.3f} MiB, "
                        f"states and buffers {want / 2**20:.3f} MiB ({err:+.3%})")
            if abs(err) > BETWEEN_TOLERANCE:
                bad.append(rows[-1])
    print("\n".join(rows))
    assert not bad, "\n".join(bad)


@pytest.mark.distributed
@pytest.mark.timeout(450)
def test_each_missing_term_is_caught(monkeypatch):
    """Mutations: each term taken out (or put back as it was) must fail against the same measurements."""
    def without_buffer(**kw):
        s = real_states(**kw)
        return mem.ModelStates(params_bytes=s.params_bytes, grads_bytes=0.0, step_grads_bytes=s.step_grads_bytes,
                               master_bytes=s.master_bytes, states_bytes=s.states_bytes)

    real_states = mem.bf16_optimizer_states
    with monkeypatch.context() as m:  # BF16_Optimizer's accumulation buffer left out
        m.setattr(mem, "bf16_optimizer_states", without_buffer)
        assert len(compare(peaks_of)[1]) >= 4
    with monkeypatch.context() as m:  # the last stage's kept outputs left out
        m.setattr(mem, "pipeline_kept_outputs", lambda **kw: {"forward": 0, "backward": 0, "step": 0})
        assert len(compare(peaks_of)[1]) >= 3
    with monkeypatch.context() as m:  # ZeRO-1's second bucket under a pipeline left out
        real_peaks = mem.phase_peaks
        m.setattr(mem, "phase_peaks", lambda **kw: real_peaks(**{**kw, "pipeline": False}))
        assert len(compare(peaks_of)[1]) >= 2
    with monkeypatch.context() as m:  # the old 2 x 2 x b s h w send/recv line: the between sums reject it
        real_buffer = mem.pipeline_buffer_bytes
        m.setattr(mem, "pipeline_buffer_bytes", lambda **kw: 4 * real_buffer(**kw))
        stage0 = [(c, measured()[0][c]) for c in range(len(CASES))]
        errors = [between_batches(got["stage"], params=got["stage_params"], ds=CASES[c][1]) / got["between"] - 1
                  for c, got in stage0]
        assert all(e > BETWEEN_TOLERANCE for e in errors), errors
