"""What DeepSpeed 0.19.8's pipeline engine costs beyond the layers' compute, and how dstk prices it.

- Counted on the real engine (2 gloo ranks, a tiny Llama cut by ``to_pipeline``, the config
  ``dstk generate`` writes): every ``p2p.send``/``p2p.recv`` with its bytes, the tensor-meta
  handshake, the loss broadcast at the end of ``train_batch``, ``BF16_Optimizer``'s per
  micro-batch ``clear_lp_grads``/``update_hp_grads`` under ZeRO-0 in bf16, and the tied
  embedding's gradient all-reduce.
- DeepSpeed's own ``TrainSchedule`` replayed with blocking transfers (``p2p.py`` asserts
  ``async_op == False``): the bubble and the transfers per micro-batch ``steptime`` prices, and
  the micro-batches each stage holds (``memory.in_flight_microbatches``).
- What ``step_time`` charges for each, and the plan's why lines for qwen2.5-7b on 8 H100s (a
  pipeline inside the node beats tensor parallelism there, and the line says why).

Run as a script, this file is one rank of the DeepSpeed count (through tests/dist.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SEQ, MICRO, GAS, HIDDEN, VOCAB = 16, 1, 4, 32, 128
CONFIG = {"model_type": "llama", "hidden_size": HIDDEN, "num_attention_heads": 4, "num_key_value_heads": 2,
          "intermediate_size": 64, "num_hidden_layers": 4, "vocab_size": VOCAB, "max_position_embeddings": 64}


def _rank_main(argv: list[str]) -> None:
    """One rank: for ZeRO-0 and ZeRO-1 in bf16, two ``train_batch`` calls of GAS micro-batches,
    counting what the engine does in the second (steady) one and the first (with the handshake)."""
    import deepspeed
    import torch
    import transformers

    deepspeed.init_distributed(dist_backend="gloo")
    import deepspeed.comm as dist
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
    from deepspeed.runtime.pipe import p2p

    from dstk.models import to_pipeline

    counts: dict[str, float] = {}

    def count(key: str, amount: float = 1) -> None:
        counts[key] = counts.get(key, 0) + amount

    def wrap(owner, name: str, key: str, *, nbytes=None) -> None:
        original = getattr(owner, name)

        def wrapped(*args, **kwargs):
            count(key)
            if nbytes is not None:
                count(key + "_bytes", nbytes(*args, **kwargs))
            return original(*args, **kwargs)

        setattr(owner, name, wrapped)

    tensor_bytes = lambda t, *a, **k: t.numel() * t.element_size()  # noqa: E731
    wrap(p2p, "send", "send", nbytes=tensor_bytes)
    wrap(p2p, "recv", "recv", nbytes=tensor_bytes)
    wrap(dist, "broadcast", "broadcast")
    all_reduce = dist.all_reduce

    def counted_all_reduce(*args, **kwargs):
        tensor = kwargs["tensor"] if "tensor" in kwargs else args[0]
        count("all_reduce")
        count("all_reduce_elements", tensor.numel())
        return all_reduce(*args, **kwargs)

    dist.all_reduce = counted_all_reduce
    wrap(BF16_Optimizer, "clear_lp_grads", "clear_lp_grads")
    wrap(BF16_Optimizer, "update_hp_grads", "update_hp_grads")

    out = {"rank": dist.get_rank(), "cases": []}
    for zero, tied in ((0, False), (1, False), (0, True)):
        config = transformers.AutoConfig.for_model(**CONFIG, tie_word_embeddings=tied)
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
        pipe = to_pipeline(model, num_stages=2, seq_len=SEQ)
        del model
        ds = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": GAS,
              "gradient_clipping": 1.0, "bf16": {"enabled": True}, "zero_optimization": {"stage": zero},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
              "pipeline": {"pipe_partitioned": False, "grad_partitioned": False, "activation_checkpoint_interval": 0},
              "steps_per_print": 10**9}
        engine, *_ = deepspeed.initialize(model=pipe, model_parameters=list(pipe.parameters()), config=ds)
        ids = torch.randint(0, VOCAB, (MICRO, SEQ))
        case = {"zero": zero, "tied": tied, "stage": engine.stage_id, "optimizer": type(engine.optimizer).__name__,
                "stage_params": sum(p.numel() for p in engine.module.parameters())}
        for batch in ("first", "steady"):
            counts.clear()
            engine.train_batch(data_iter=iter([(ids, ids)] * GAS))
            case[batch] = dict(counts)
        out["cases"].append(case)
        engine.destroy()
        del engine, pipe
    print("RESULT " + json.dumps(out), flush=True)
    from dstk.launch.rank import exit_rank

    exit_rank()


if __name__ == "__main__":
    _rank_main(sys.argv[1:])


import pytest  # noqa: E402

from dstk.estimate import steptime as st  # noqa: E402
from dstk.estimate import timing as tm  # noqa: E402
from dstk.estimate import estimate, stage_layers, stage_params  # noqa: E402
from dstk.estimate import memory as mem  # noqa: E402
from dstk.hardware import Cluster, get_gpu  # noqa: E402
from dstk.layout import Layout, Training  # noqa: E402
from dstk.models import get_model  # noqa: E402

H100 = Cluster(num_nodes=1, gpus_per_node=8, gpu=get_gpu("h100-sxm"))
QWEN = Training(seq_len=8192, global_batch=128)


# --- counted on the real engine -------------------------------------------------------------------


@pytest.fixture(scope="module")
def counted():
    from dist import run_ranks

    ranks = run_ranks(Path(__file__), world_size=2, timeout=400)
    out = {}
    for r in ranks:
        line = next(x for x in r.output.splitlines() if x.startswith("RESULT "))
        for case in json.loads(line[len("RESULT "):])["cases"]:
            out[(case["zero"], case["stage"]) + (("tied",) if case["tied"] else ())] = case
    return out


@pytest.mark.distributed
@pytest.mark.timeout(420)
@pytest.mark.parametrize("zero", [0, 1])
def test_each_micro_batch_sends_what_deepspeed_pipe_transfers_counts(counted, zero):
    """Per micro-batch, stage 0 sends the 3 tensors ``dstk.pipeline`` passes and receives one
    gradient, stage 1 the reverse: ``deepspeed_pipe_transfers(pp=2)`` calls in all, the hidden state
    once each way. The tensor meta goes once per run (the first batch's extra send), never again."""
    first, last = counted[(zero, 0)], counted[(zero, 1)]
    hidden = MICRO * SEQ * HIDDEN * 2  # bf16
    transfers, calls = st.deepspeed_pipe_transfers(pp=2, tp=1)
    for case in (first, last):
        steady = case["steady"]
        assert (steady.get("send", 0) + steady.get("recv", 0)) / GAS == calls
    assert first["steady"]["send"] == GAS * st.PIPE_FORWARD_TENSORS and first["steady"]["recv"] == GAS
    assert first["steady"]["recv_bytes"] == GAS * hidden  # the gradient of the hidden state only
    hidden_moves = (first["steady"]["recv_bytes"] + hidden * GAS) / (GAS * hidden)  # activations out + grads in
    assert hidden_moves == transfers
    assert first["first"]["send"] == first["steady"]["send"] + 1  # the meta handshake, first batch only
    assert last["first"]["recv"] == last["steady"]["recv"] + 1
    assert first["steady"]["broadcast"] == last["steady"]["broadcast"] == 1  # the loss, once a batch


@pytest.mark.distributed
@pytest.mark.timeout(420)
def test_bf16_zero0_pipeline_runs_bf16_optimizer_per_micro_batch(counted):
    """ZeRO-0 in bf16 under a pipeline is ``BF16_Optimizer`` (ZeRO-1 is not): each micro-batch clears
    the 16-bit gradients twice on a stage that is not last, once on the last, and adds them into the
    accumulation buffer once; ``bf16_pipe_grad_bytes_per_param`` prices exactly those passes."""
    for zero in (0, 1):
        for stage in (0, 1):
            case = counted[(zero, stage)]
            expected = st.bf16_optimizer_in_pipeline(engine="deepspeed", pp=2, zero_stage=zero, precision="bf16")
            assert (case["optimizer"] == "BF16_Optimizer") == expected, case
    w = 2
    for stage, last in ((0, False), (1, True)):
        steady = counted[(0, stage)]["steady"]
        clears_per_mb = (steady["clear_lp_grads"] - 1) / GAS  # one more in step()
        assert steady["update_hp_grads"] == GAS
        assert st.bf16_pipe_grad_bytes_per_param(last=last) == clears_per_mb * w + 3 * w
    assert "update_hp_grads" not in counted[(1, 0)]["steady"]


# --- DeepSpeed's schedule replayed with blocking transfers -----------------------------------------


def replay(*, pp: int, m: int, forward: list[float], backward: list[float], transfer: float) -> float:
    """Seconds of one ``train_batch`` under DeepSpeed 0.19.8's own ``TrainSchedule``: each stage
    runs its instructions in order; a send and the matching receive start together when both ranks
    reach them (blocking ``p2p.send``/``recv``) and take ``transfer`` seconds."""
    from deepspeed.runtime.pipe import schedule as sched

    programs = []
    for s in range(pp):
        ops = []
        for cmds in sched.TrainSchedule(micro_batches=m, stages=pp, stage_id=s).steps():
            for cmd in cmds:
                name = type(cmd).__name__
                if name == "ForwardPass":
                    ops.append(("compute", forward[s]))
                elif name == "BackwardPass":
                    ops.append(("compute", backward[s]))
                elif name in ("SendActivation", "RecvGrad"):
                    ops.append(("p2p", s + 1, (name in ("SendActivation", "RecvActivation"), s)))
                elif name in ("RecvActivation", "SendGrad"):
                    ops.append(("p2p", s - 1, (name in ("SendActivation", "RecvActivation"), s - 1)))
        programs.append(ops)
    pc, clock = [0] * pp, [0.0] * pp
    moved = True
    while moved:
        moved = False
        for s in range(pp):
            while pc[s] < len(programs[s]):
                op = programs[s][pc[s]]
                if op[0] == "compute":
                    clock[s] += op[1]
                    pc[s] += 1
                    moved = True
                    continue
                peer = op[1]
                other = programs[peer][pc[peer]] if pc[peer] < len(programs[peer]) else None
                if other is None or other[0] != "p2p" or other[1] != s or other[2] != op[2]:
                    break
                clock[s] = clock[peer] = max(clock[s], clock[peer]) + transfer
                pc[s] += 1
                pc[peer] += 1
                moved = True
    assert pc == [len(p) for p in programs], "the replay deadlocked"
    return max(clock)


@pytest.mark.parametrize("pp, m", [(2, 8), (4, 16), (8, 32), (8, 128)])
def test_the_schedule_costs_the_bubble_and_the_blocking_transfers_dstk_prices(pp, m):
    """Equal stages: no transfers, the step is ``(m + p - 1)(f + b)``, the bubble ``(p - 1)/m``
    that ``timing.bubble_fraction`` prices; blocking transfers of ``c`` add
    ``deepspeed_pipe_transfers(pp)[0] c`` to each further micro-batch (4 on an inner stage, not
    the 2 of a paired send and receive)."""
    f, b = 1.0, 2.0
    bare = replay(pp=pp, m=m, forward=[f] * pp, backward=[b] * pp, transfer=0.0)
    assert bare == pytest.approx((m + pp - 1) * (f + b))
    assert bare / (m * (f + b)) - 1 == pytest.approx(tm.bubble_fraction(pp=pp, microbatches=m, virtual_stages=1))
    c = 0.01

    def added(micro: int) -> float:
        return (replay(pp=pp, m=micro, forward=[f] * pp, backward=[b] * pp, transfer=c)
                - replay(pp=pp, m=micro, forward=[f] * pp, backward=[b] * pp, transfer=0.0))

    per_micro_batch = (added(2 * m) - added(m)) / m / c
    transfers, _ = st.deepspeed_pipe_transfers(pp=pp)
    assert per_micro_batch == pytest.approx(transfers, rel=0.02), per_micro_batch
    assert added(m) <= (m + pp - 1) * transfers * c * 1.001  # the fill and drain add no more


def test_uneven_stages_cost_no_more_than_the_slowest_stage_times_the_slots():
    """Stages of 3-4 layers and a light last one (qwen2.5-7b at pp=8): the slowest stage paces the
    schedule; ``(m + p - 1)`` slots of it bound the step from above within 1%."""
    layers = [3, 3, 4, 4, 4, 4, 4, 2]
    m = 128
    t = replay(pp=8, m=m, forward=[1.0 * n for n in layers], backward=[2.0 * n for n in layers], transfer=0.0)
    bound = (m + 7) * 3.0 * max(layers)
    assert 0.98 * bound <= t <= bound


# --- what step_time charges -------------------------------------------------------------------------


def _time(layout, **kw):
    return estimate(model=get_model("qwen2.5-7b"), layout=layout, training=QWEN, cluster=H100, **kw).time


def test_bf16_zero0_pipeline_pays_its_gradient_copies_every_micro_batch(monkeypatch):
    """qwen2.5-7b, pp=8: ZeRO-0 in bf16 pays ``bf16_pipe_grad_bytes_per_param`` (10 B on an inner
    stage, 8 on the last) of each stage's parameters at HBM bandwidth in every slot of the schedule;
    ZeRO-1 pays none. Made large, the charge paces the stage with the most parameters (the first,
    with the embedding) in all ``m + p - 1`` slots."""
    assert st.bf16_pipe_grad_bytes_per_param(last=False) == 10.0
    assert st.bf16_pipe_grad_bytes_per_param(last=True) == 8.0
    layout = Layout(pp=8, micro_batch=1, grad_accum=128)
    zero0 = _time(layout)
    zero1 = _time(Layout(pp=8, zero_stage=1, micro_batch=1, grad_accum=128))
    assert zero0.step_seconds > zero1.step_seconds * 1.02
    monkeypatch.setattr(st, "bf16_pipe_grad_bytes_per_param", lambda **kw: 0.0)
    free = _time(layout)
    assert free.step_seconds == pytest.approx(zero1.step_seconds, rel=0.005)
    big = 1000.0
    monkeypatch.setattr(st, "bf16_pipe_grad_bytes_per_param", lambda **kw: big)
    heavy = _time(layout)
    from dstk.estimate import _model_facts

    f = _model_facts(get_model("qwen2.5-7b"))
    counts = stage_layers(f.layers, 8, layout=layout, facts=f, seq_len=QWEN.seq_len)
    first = stage_params(f, layers=counts[0], first=True, last=False, tp=1, pp=8)
    assert first == max(stage_params(f, layers=n, first=i == 0, last=i == 7, tp=1, pp=8) for i, n in enumerate(counts))
    per_mb = tm.memory_seconds(nbytes=big * first, hbm_bytes_per_s=H100.gpu.hbm_bytes_per_s)
    slots = 128 + 7
    # The first stage was no slower than the slowest before the charge (at most all of it added), and
    # is now the slowest by nearly all of it.
    assert free.step_seconds + 0.9 * slots * per_mb < heavy.step_seconds <= free.step_seconds + slots * per_mb * 1.0001


def test_pipeline_p2p_is_priced_as_the_engines_send_it():
    """DeepSpeed's blocking transfers (4 hidden states and 8 calls a micro-batch at pp=8) against
    Megatron's paired ones (2); ``comm["pp"]`` carries them, inside compute."""
    layout = Layout(pp=8, micro_batch=1, grad_accum=128)
    ds = _time(layout).comm["pp"]
    meg = estimate(model=get_model("qwen2.5-7b"), layout=layout, training=QWEN, cluster=H100,
                   engine="megatron").time.comm["pp"]
    hidden = 8192 * get_model("qwen2.5-7b").hidden_size * 2
    from dstk.estimate import _bandwidth

    bw, _ = _bandwidth(group=2, stride=1, cluster=H100)
    assert ds > 4 * 128 * hidden / bw > meg > 2 * 128 * hidden / bw


def test_zero1_gradient_reduction_is_not_overlapped_under_a_pipeline():
    """The pipeline engine reduces after the last backward whatever ``overlap_comm`` says; without
    a pipeline ``overlap_comm`` hides ZeRO-1's buckets behind backward."""
    def step(pp, overlap):
        layout = Layout(dp=8 // pp, pp=pp, zero_stage=1, micro_batch=1, grad_accum=128 // (8 // pp))
        return _time(layout, buffers=mem.ZeroBuffers(overlap_comm=overlap, reduce_bucket_size=5e7)).step_seconds

    assert step(4, True) == step(4, False)
    assert step(1, True) < step(1, False)


# --- the plan's why lines ---------------------------------------------------------------------------


QWEN_PLAN = ["plan", "--model", "qwen2.5-7b", "--gpus", "8", "--gpu", "h100-sxm", "--seq-len", "8192",
             "--global-batch", "128"]


def test_qwen_plan_says_why_the_pipeline_beat_tensor_parallel_inside_the_node(capsys):
    """qwen2.5-7b on 8 H100s: a pipeline inside the node wins, and the tensor-parallel line says
    with the figures why (bubble + sends against all-reduces + the norms each TP rank runs whole);
    the winner is ZeRO-1 over one rank because ZeRO-0 would run BF16_Optimizer, and it says so."""
    from dstk.cli import main

    assert main(QWEN_PLAN + ["--format", "json"]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    best = plans[0]["layout"]
    # Since dstk renders fp32 gradient accumulation for bf16 ZeRO-1 pipelines (BF16_Optimizer's
    # 22 B/param a micro-batch, tests/test_pipeline_memory_peak.py), the pipeline no longer wins
    # here, and no bf16 pipeline is planned with ZeRO-0 (it can only accumulate in bf16).
    assert not any(p["layout"]["pp"] > 1 and p["layout"]["zero_stage"] == 0 for p in plans)
    if not (best["pp"] > 1 and best["tp"] == 1):
        return
    assert main(QWEN_PLAN) == 0
    text = " ".join(capsys.readouterr().out.split())
    tp_line = next(line for line in text.split(" - ") if line.startswith("tensor parallel"))
    assert "inside a node the pipeline lost less: bubble" in tp_line and "blocking sends" in tp_line
    assert "TP's all-reduces" in tp_line and "s more compute" in tp_line
    if best["zero_stage"] == 1 and best["dp"] == 1:
        assert "it wins on time: ZeRO-0 at the same layout takes" in text and "BF16_Optimizer" in text


def test_tp_against_pipeline_text_only_when_the_figures_show_it():
    """The line is written only for TP without a pipeline against a pipeline without TP, and only when
    the pipeline's bubble and sends are less than TP's all-reduces and extra compute."""
    from types import SimpleNamespace as NS

    from dstk.plan import Candidate, tp_against_pipeline_text

    def cand(layout, *, step, compute, bubble=0.0, comm=None):
        time = NS(step_seconds=step, compute_seconds=compute, bubble_seconds=bubble, comm_seconds=0.0,
                  comm=comm or {})
        return Candidate(layout=layout, estimate=NS(time=time, memory=None))

    pipe = cand(Layout(pp=8, grad_accum=128), step=13.4, compute=12.7, bubble=0.7, comm={"pp": 0.1})
    tp = cand(Layout(dp=4, tp=2, grad_accum=32), step=13.8, compute=13.8, comm={"tp": 0.6})
    text = tp_against_pipeline_text(tp, pipe)
    assert "bubble 0.7 s" in text and "sends 0.1 s" in text and "all-reduces 0.6 s" in text and "0.6 s more" in text
    assert tp_against_pipeline_text(pipe, tp) is None
    assert tp_against_pipeline_text(cand(Layout(dp=4, tp=2, pp=2, grad_accum=32), step=14, compute=14), pipe) is None
    lucky = cand(Layout(dp=4, tp=2, grad_accum=32), step=13.5, compute=12.7, comm={"tp": 0.1})
    assert tp_against_pipeline_text(lucky, pipe) is None  # 0.8 s of pipeline losses against 0.1 s + 0.1 s


def test_dp1_zero_line_names_a_slower_zero0_twin():
    """ZeRO over one rank that wins on time says so, with both steps, and under a pipeline why."""
    from dstk.plan import dp1_zero_line

    GIB = 2**30
    line = dp1_zero_line(Layout(pp=8, zero_stage=1, grad_accum=128), twin_bytes=60 * GIB, usable_bytes=70 * GIB,
                         zero_pinned=False, twin_step_seconds=13.74, step_seconds=13.38)
    assert "it wins on time: ZeRO-0 at the same layout takes 13.7 s/step against 13.4" in line
    assert "BF16_Optimizer" in line and "headroom" not in line
    same = dp1_zero_line(Layout(pp=8, zero_stage=1, grad_accum=128), twin_bytes=60 * GIB, usable_bytes=70 * GIB,
                         zero_pinned=False, twin_step_seconds=13.40, step_seconds=13.38)
    assert "it wins on headroom only" in same


@pytest.mark.distributed
@pytest.mark.timeout(420)
def test_a_tied_embedding_adds_one_all_reduce_of_its_gradient_a_step(counted):
    """Tied input and output embeddings on stages 0 and 1: each ``train_batch`` all-reduces the
    ``V x h`` gradient once between them (``_exec_reduce_tied_grads``), what
    ``tied_grad_allreduce_seconds`` prices; the untied model does not."""
    for stage in (0, 1):
        tied, untied = counted[(0, stage, "tied")]["steady"], counted[(0, stage)]["steady"]
        assert tied["all_reduce"] == untied["all_reduce"] + 1
        assert tied["all_reduce_elements"] - untied["all_reduce_elements"] == VOCAB * HIDDEN


def test_tied_gradient_all_reduce_is_priced_for_tied_models_only(monkeypatch):
    """gemma-7b (tied, V = 256k) at pp=2 on one node: one 2-rank all-reduce of ``w V h`` bytes a step,
    exposed; qwen2.5-7b (untied) and pp=1 pay none."""
    from dstk.estimate import _bandwidth, _model_facts

    gemma = _model_facts(get_model("gemma-7b"))
    qwen = _model_facts(get_model("qwen2.5-7b"))
    kw = dict(tp=1, dp=4, precision="bf16", cluster=H100)
    seconds = st.tied_grad_allreduce_seconds(facts=gemma, pp=2, **kw)
    bw, _ = _bandwidth(group=2, stride=4, cluster=H100)
    assert seconds == pytest.approx(2 * gemma.vocab * gemma.hidden / bw, rel=0.05)
    assert st.tied_grad_allreduce_seconds(facts=gemma, pp=1, **kw) == 0.0
    assert st.tied_grad_allreduce_seconds(facts=qwen, pp=2, **kw) == 0.0
    layout = Layout(dp=4, pp=2, micro_batch=1, grad_accum=32)
    training = Training(seq_len=4096, global_batch=128)
    t = estimate(model=get_model("gemma-7b"), layout=layout, training=training, cluster=H100).time
    monkeypatch.setattr(st, "tied_grad_allreduce_seconds", lambda **kw: 0.0)
    untied = estimate(model=get_model("gemma-7b"), layout=layout, training=training, cluster=H100).time
    assert t.step_seconds - untied.step_seconds == pytest.approx(seconds)  # exposed, after the last backward
    assert t.comm["pp"] - untied.comm["pp"] == pytest.approx(seconds)


@pytest.mark.parametrize("pp, m", [(2, 1), (2, 8), (4, 2), (4, 16), (8, 128)])
def test_each_stage_holds_the_micro_batches_memory_prices(pp, m):
    """Activations held: walking DeepSpeed's ``TrainSchedule``, stage ``i`` has at most
    ``min(p - i, m)`` forwards without their backward (stage 0 runs ``p`` forwards before its first
    backward), what ``memory.in_flight_microbatches`` prices; ``num_pipe_buffers`` is that, at least 2."""
    from deepspeed.runtime.pipe import schedule as sched

    for stage in range(pp):
        schedule = sched.TrainSchedule(micro_batches=m, stages=pp, stage_id=stage)
        live = peak = 0
        for cmds in schedule.steps():
            for cmd in cmds:
                live += {"ForwardPass": 1, "BackwardPass": -1}.get(type(cmd).__name__, 0)
                peak = max(peak, live)
        assert live == 0
        assert peak == mem.in_flight_microbatches(pp=pp, stage=stage, grad_accum=m)
        assert schedule.num_pipe_buffers() == max(2, peak)
