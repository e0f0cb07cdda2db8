"""LoRA in the estimator: the frozen base, the adapters' states, their activations, the step.

Unit tier: model states by hand (ZeRO-2 keeps the frozen base whole, ZeRO-3 partitions it; no
gradient, master or optimizer state for it), QLoRA's NF4 bytes, the activations a real peft
forward saves (``saved_tensors_hooks``), the step time's LoRA terms, the generated bucket.
Distributed tier: the estimate against the peak DeepSpeed really allocates on 2 gloo ranks
(``tests/peak_ranks.py``, the machinery of ``test_estimate_peak.py``), for a 20M Llama with LoRA
through peft, ZeRO-2 and ZeRO-3, configs as users write them (DeepSpeed's defaults) and as dstk
writes them; the mutation that counts optimizer states for the frozen weights is rejected.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import pytest

from dstk.estimate import estimate, saved_activation_bytes
from dstk.estimate import lora as lora_est
from dstk.estimate import memory as mem
from dstk.estimate.buckets import choose_buffers
from dstk.estimate.dsconfig import read_settings
from dstk.hardware import Cluster, get_gpu
from dstk.intent import TrainingIntent
from dstk.layout import Layout, Lora, Training
from dstk.models import get_model
from dstk.render import ds_config
from dstk.train.lora import resolve_targets

from test_estimate_peak import CPU2, DP, MICRO, MID, SEQ, TOLERANCE, spec_of, user_config

HERE = Path(__file__).parent
ALL = Lora(rank=8, alpha=16.0)
QV_DROPOUT = Lora(rank=8, alpha=16.0, targets="q,v", dropout=0.1)


def _training(lora: Lora | None, precision: str = "bf16") -> Training:
    return Training(seq_len=SEQ, global_batch=DP * MICRO, precision=precision, optimizer="adamw", attention="sdpa",
                    lora=lora)


def _layout(stage: int, **kw) -> Layout:
    return Layout(dp=DP, zero_stage=stage, micro_batch=MICRO, **kw)


# --- memory arithmetic, by hand ------------------------------------------------------------------

def test_mid_adapter_count_by_hand():
    """r (fan_in + fan_out) per module, 4 layers: q 512+512, k 512+256, v 512+256, o 512+512,
    gate/up 512+1376, down 1376+512."""
    per_layer = 8 * ((512 + 512) + 2 * (512 + 256) + (512 + 512) + 3 * (512 + 1376))
    lf = lora_est.lora_facts(model=spec_of(MID), lora=ALL)
    assert lf.trainable == 4 * per_layer == 295_936
    assert lf.largest_adapter == 8 * 1376


@pytest.mark.parametrize("stage", [1, 2])
def test_zero12_keep_the_frozen_base_whole_and_shard_only_the_adapters(stage):
    """bf16, Adam, n = 2, P = base, T = adapters: params ``2P + 2T``, gradient partition ``2T/n``,
    master ``4T/n``, states ``8T/n``. Nothing of the optimizer scales with ``P``."""
    spec = spec_of(MID)
    P, T = spec.num_params, 295_936
    s = lora_est.model_states(base_params=P, base_persistent=0, lf=lora_est.lora_facts(model=spec, lora=ALL), lora=ALL,
                              precision="bf16", optimizer="adamw", zero_stage=stage, dp=2)
    assert s.params_bytes == 2 * P + 2 * T
    assert s.grads_bytes == 2 * T / 2
    assert s.master_bytes == 4 * T / 2 and s.states_bytes == 8 * T / 2
    assert s.step_grads_bytes == 4 * T / 2


def test_zero3_partitions_the_frozen_base_too():
    """ZeRO-3: ``2P/n`` of the base (its persistent norms whole), the adapters' partition plus the
    small adapter tensors kept whole (under the persistence threshold), ``2T/n`` gradients."""
    spec = spec_of(MID)
    P, T = spec.num_params, 295_936
    lf = lora_est.lora_facts(model=spec, lora=ALL)
    s = lora_est.model_states(base_params=P, base_persistent=1000, lf=lf, lora=ALL, precision="bf16",
                              optimizer="adamw", zero_stage=3, dp=2, adapter_persistent=T)
    assert s.params_bytes == 2 * P / 2 + 2 * 1000 + 2 * T / 2 + 2 * T
    assert s.grads_bytes == T and s.optimizer_bytes == 12 * T / 2
    off = lora_est.model_states(base_params=P, base_persistent=0, lf=lf, lora=ALL, precision="bf16",
                                optimizer="adamw", zero_stage=3, dp=2, offload_optimizer="cpu", offload_params="cpu")
    assert off.params_bytes == 0 and off.cpu_bytes == pytest.approx(2 * P / 2 + 2 * T / 2 + 2 * T / 2 + 16 * T / 2)


def test_the_estimate_prices_only_the_adapters_in_the_optimizer():
    """The whole estimate, ZeRO-2: optimizer bytes are ``12 T / n`` (not ``12 (P + T) / n``) and the
    step's fp32 gradient partition ``4 T / n``; a full fine-tune of the same layout pays for ``P``."""
    spec = spec_of(MID)
    T = 295_936
    buffers = mem.ZeroBuffers(reduce_bucket_size=200_000)
    lora = estimate(model=spec, layout=_layout(2), training=_training(ALL), cluster=CPU2, buffers=buffers)
    full = estimate(model=spec, layout=_layout(2), training=_training(None), cluster=CPU2, buffers=buffers)
    assert lora.memory.per_gpu.optimizer_bytes == 12 * T // 2
    assert full.memory.per_gpu.optimizer_bytes == 12 * spec.num_params // 2
    allocated = [e.memory.per_gpu.total_bytes - e.memory.per_gpu.overhead_bytes for e in (lora, full)]
    assert allocated[0] < allocated[1] / 3


def test_qlora_base_is_nf4_with_double_quantized_constants():
    """4 bits + an 8-bit absmax per 64 + an fp32 constant per 256 blocks (Dettmers et al. 2023 §3):
    0.5 + 1/64 + 4/16384 B; without double quantization an fp32 absmax per 64: 0.5625 B."""
    assert lora_est.nf4_bytes_per_param() == pytest.approx(0.5 + 1 / 64 + 4 / 16384)
    assert lora_est.nf4_bytes_per_param(double_quant=False) == 0.5625
    spec = get_model("llama-2-7b")
    lf = lora_est.lora_facts(model=spec, lora=Lora(rank=16, alpha=32, bits=4))
    linears = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008)
    assert lf.quantized == linears
    frozen = lora_est.frozen_param_bytes(params=spec.num_params, quantized=lf.quantized, precision="bf16", bits=4)
    assert frozen == pytest.approx(linears * 0.515869140625 + 2 * (spec.num_params - linears))
    assert 3.5e9 < frozen < 4.0e9  # 6.74B parameters: ~3.7 GB instead of 13.5 GB in bf16


def test_reduce_bucket_is_not_capped_by_the_adapters_but_dstk_caps_its_own():
    """DeepSpeed allocates ``reduce_bucket_size`` whatever the trainable count (``setup_buckets``):
    a user's config with LoRA pays the 5e8 bucket; dstk's generated bucket is capped at the adapters."""
    spec = spec_of(MID)
    user = estimate(model=spec, layout=_layout(2), training=_training(ALL), cluster=CPU2).memory.per_gpu
    assert any(b.name == "reduce bucket" and b.bytes == 2 * 5e8 for b in user.buffers)
    # 8 H100s would reach 90% of NVLink's bandwidth from ~6.5e7 elements; rank 1 on q has 262,144.
    h100 = Cluster(num_nodes=1, gpus_per_node=8, gpu=get_gpu("h100-sxm"))
    training = Training(seq_len=2048, global_batch=8, lora=Lora(rank=1, alpha=2, targets="q"))
    buffers, why = choose_buffers(model=get_model("llama-2-7b"), layout=Layout(dp=8, zero_stage=2),
                                  training=training, cluster=h100)
    assert buffers.reduce_bucket_size == 262_144  # 32 x (4096 + 4096), exactly: one bucket holds them all
    assert not buffers.overlap_comm  # one bucket: nothing to overlap, no second buffer
    assert "trainable (LoRA) parameters of one GPU" in " ".join(why)
    full, _ = choose_buffers(model=get_model("llama-2-7b"), layout=Layout(dp=8, zero_stage=2),
                             training=dataclasses.replace(training, lora=None), cluster=h100)
    assert full.reduce_bucket_size > 1e7


# --- activations: what a real peft forward saves ----------------------------------------------

def peft_saved_bytes(cfg: dict, *, lora: Lora, family: str, micro: int, seq_len: int) -> int:
    """Bytes one forward of the HF config ``cfg`` (``model_type`` and its keys), wrapped by peft as the ranks
    build it (adapters added in fp32, then the whole module cast to bf16), saves for backward: unique storages
    through ``saved_tensors_hooks``, parameters excluded."""
    import torch
    import transformers

    from dstk.train import lora as peft_lora

    keys = dict(cfg)
    config = transformers.AutoConfig.for_model(keys.pop("model_type"), **keys)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    settings = peft_lora.LoraSettings(rank=lora.rank, alpha=lora.alpha, dropout=lora.dropout,
                                      targets=resolve_targets(family=family, targets=lora.targets))
    model = peft_lora.apply(model, settings).to(torch.bfloat16)
    model.train()
    ids = torch.randint(0, keys["vocab_size"], (micro, seq_len))
    seen: dict[int, int] = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, labels=ids).loss
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(n for ptr, n in seen.items() if ptr not in params)


@pytest.mark.parametrize("lora", [ALL, Lora(rank=8, alpha=16.0, targets="q,v"),
                                  Lora(rank=4, alpha=8, targets="o,down")], ids=["all-linear", "q,v", "o,down"])
def test_activations_equal_what_peft_saves(lora):
    """``saved_tensors_hooks`` over a bf16 Llama wrapped by peft (as the ranks build it: adapters
    added in fp32, then the whole module cast) against the estimator's activations: equal to the
    byte up to the 4-byte loss scalar."""
    measured = peft_saved_bytes(MID, lora=lora, family="llama", micro=MICRO, seq_len=SEQ)
    spec = spec_of(MID)
    full = saved_activation_bytes(model=spec, micro_batch=MICRO, seq_len=SEQ, cpu=True)
    lf = lora_est.lora_facts(model=spec, lora=lora)
    shape = mem.LayerShape(hidden=512, q_width=512, kv_width=256, ffn=1376, heads=8)
    layer, once = lora_est.activation_delta_bytes(lf=lf, lora=lora, tokens=MICRO * SEQ, shape=shape, act_bytes=2)
    predicted = full + spec.num_layers * layer + once
    assert abs(predicted - measured) <= 8, (predicted, measured)
    # and the estimate carries the same figure
    est = estimate(model=spec, layout=Layout(dp=2, micro_batch=MICRO), training=_training(lora), cluster=CPU2)
    assert est.memory.per_gpu.activations_bytes == int(predicted)


# --- step time ----------------------------------------------------------------------------------

def test_lora_step_has_no_base_weight_gradients_and_reduces_only_the_adapters():
    """70B on 8 H100, ZeRO-3, full recompute: LoRA's compute is about 3/4 of the full fine-tune's
    (the base GEMMs drop from 4x the forward (recompute) to 3x; attention and the rest stay);
    the DP reduce-scatter moves the adapters only, while ZeRO-3 still gathers the whole base."""
    spec = get_model("llama-3-70b")
    cluster = Cluster(num_nodes=1, gpus_per_node=8, gpu=get_gpu("h100-sxm"))
    layout = Layout(dp=8, zero_stage=3, micro_batch=1, grad_accum=8, recompute="full")
    training = Training(seq_len=4096, global_batch=64)
    full = estimate(model=spec, layout=layout, training=training, cluster=cluster).time
    lora = estimate(model=spec, layout=layout, training=dataclasses.replace(training, lora=Lora(rank=16, alpha=32)),
                    cluster=cluster).time
    assert 0.65 < lora.compute_seconds / full.compute_seconds < 0.85
    assert lora.comm["dp"] < full.comm["dp"] / 100
    assert lora.comm["zero3_gather"] == pytest.approx(full.comm["zero3_gather"], rel=0.01)
    assert lora.model_flops_per_step < full.model_flops_per_step * 0.7


# --- against the measured peak on 2 gloo ranks ---------------------------------------------------

def _peft_json(lora: Lora) -> dict:
    return {"rank": lora.rank, "alpha": lora.alpha, "dropout": lora.dropout,
            "targets": list(resolve_targets(family="llama", targets=lora.targets)), "bits": None,
            "fan_in_fan_out": False}


def generated_config(stage: int, lora: Lora) -> dict:
    """The ``ds_config.json`` ``dstk generate --lora-rank`` writes for this layout on CPU ranks."""
    buffers, _ = choose_buffers(model=spec_of(MID), layout=_layout(stage), training=_training(lora), cluster=CPU2)
    intent = TrainingIntent(seq_len=SEQ, global_batch=DP * MICRO, precision="bf16", optimizer="adamw",
                            lora_rank=lora.rank)
    return ds_config(layout=_layout(stage), training=intent, torch_adam=True, buffers=buffers)


CASES = (  # (label, DeepSpeed config, LoRA)
    [(f"user ZeRO-{z}", user_config(z), ALL) for z in (2, 3)]
    + [(f"generated ZeRO-{z}", generated_config(z, ALL), ALL) for z in (0, 1, 2, 3)]
    + [("generated ZeRO-2 q,v dropout 0.1", generated_config(2, QV_DROPOUT), QV_DROPOUT)]
)


def predicted(ds: dict, lora: Lora) -> int:
    """``estimate`` of the layout the file describes, with the file's own buffers: the allocator's
    bytes (no CUDA context on a CPU rank)."""
    spec = spec_of(MID)
    settings = read_settings(ds, hidden_size=spec.hidden_size)
    m = estimate(model=spec, layout=_layout(settings.zero_stage), training=_training(lora, settings.precision),
                 cluster=CPU2, buffers=settings.buffers).memory.per_gpu
    return m.total_bytes - m.overhead_bytes


@functools.cache
def measured() -> list[dict]:
    from dist import run_ranks

    cases = [{"model": MID, "ds": ds, "lora": _peft_json(lora)} for _, ds, lora in CASES]
    ranks = run_ranks(HERE / "peak_ranks.py", json.dumps(cases), world_size=DP, timeout=400)
    line = next(x for x in ranks[0].output.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def compare() -> tuple[list[str], list[str]]:
    rows, bad = [], []
    for (label, ds, lora), got in zip(CASES, measured(), strict=True):
        want = predicted(ds, lora)
        err = want / got["peak"] - 1
        rows.append(f"LoRA {label}: measured {got['peak'] / 2**20:,.1f} MiB in {got['phase']}, "
                    f"estimated {want / 2**20:,.1f} MiB ({err:+.2%})")
        if abs(err) > TOLERANCE:
            bad.append(rows[-1])
    return rows, bad


@pytest.mark.distributed
@pytest.mark.timeout(450)
def test_lora_estimate_equals_the_measured_peak():
    rows, bad = compare()
    print("\n".join(rows))
    assert len(rows) == len(CASES) == 7
    assert not bad, "\n".join(bad)


@pytest.mark.distributed
@pytest.mark.timeout(450)
def test_optimizer_states_for_frozen_weights_are_rejected(monkeypatch):
    """Mutation check: an estimator that gives the frozen base gradients, an fp32 master and Adam
    states (a full fine-tune's model states) fails against the same measurements."""

    def as_if_trainable(*, base_params, lf, precision, optimizer, zero_stage, dp, **kw):
        return mem.model_states(params=base_params + lf.trainable, persistent=0, precision=precision,
                                optimizer=optimizer, zero_stage=zero_stage, dp=dp)

    monkeypatch.setattr(lora_est, "model_states", as_if_trainable)
    _, bad = compare()
    assert len(bad) == len(CASES), "the measured peaks should reject optimizer states for frozen weights"


def test_the_frozen_base_skips_its_weight_gradient_gemms_as_priced(monkeypatch):
    """LoRA's backward drops the base's weight-gradient GEMMs: exactly the ones ``layer_seconds``
    prices, with their own shapes and A100 wave losses (``LayerSeconds.weight_grad_gemm``), not the
    forward GEMMs' time, which differs from them once waves are priced."""
    from dstk.estimate import _model_facts
    from dstk.estimate import steptime as st

    gpu = get_gpu("a100-80gb")
    spec = get_model("llama-3-8b")
    facts = _model_facts(spec)
    lora = Lora(rank=8, alpha=16.0)
    kw = dict(facts=facts, lf=lora_est.lora_facts(model=spec, lora=lora), lora=lora,
              layout=Layout(dp=8, micro_batch=1, grad_accum=1), training=Training(seq_len=2048, global_batch=8,
                                                                                   precision="bf16"),
              cluster=Cluster(num_nodes=1, gpus_per_node=8, gpu=gpu))
    base = st.layer_seconds(facts=facts, tokens=2048, seq_len=2048, tp=1, sp=1, act_bytes=2, attention="sdpa",
                            gpu=gpu, peak_flops=gpu.peak_flops("bf16"))
    assert base.weight_grad_gemm is not None and abs(base.weight_grad_gemm / base.gemm - 1) > 0.05
    priced = lora_est.step_terms(**kw).layer_backward_seconds
    # the same step had the layer not said which GEMMs are weight gradients (the forward's time)
    plain = st.layer_seconds
    monkeypatch.setattr(st, "layer_seconds", lambda **k: dataclasses.replace(plain(**k), weight_grad_gemm=None))
    forward_time = lora_est.step_terms(**kw).layer_backward_seconds
    assert priced - forward_time == pytest.approx(base.gemm - base.weight_grad_gemm, rel=1e-9)
