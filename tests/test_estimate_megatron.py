"""The Megatron-engine memory model (``dstk.estimate.megatron``, ``estimate(engine="megatron")``).

Oracles: Korthikanti et al. 2022 (arXiv 2205.05198) Table 2 formulas and Figure 1 bars, Megatron-LM's
own accounting (``theoretical_memory_usage.py``: 18 bytes/param, ``6 + 12/d`` with the distributed
optimizer), and the layouts the paper trained on 80 GB A100s, which the planner must accept.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from dstk.estimate import estimate, megatron as meg, rank_params
from dstk.estimate.memory import LayerShape
from dstk.hardware import Cluster, get_gpu, get_interconnect
from dstk.layout import Layout, Training
from dstk.models import family_module

GiB = 2**30
S = 2048
VOCAB = 51200

# Korthikanti et al. Table 3: name -> (heads, hidden, layers, pp, gpus, global batch, micro-batch);
# interleaved chunks per calculon's transcription of Figure 1 (calculon-ai/calculon,
# validation/seqsel/fig1/*.json: 3 for 175B and 530B, none for 22B and 1T).
MODELS = {
    "22B": (64, 6144, 48, 1, 8, 4, 4, 1),
    "175B": (96, 12288, 96, 8, 64, 64, 1, 3),
    "530B": (128, 20480, 105, 35, 280, 280, 1, 3),
    "1T": (160, 25600, 128, 64, 512, 512, 1, 1),
}
# Figure 1, GiB per GPU: parameters + optimizer, activations (TP baseline), activations (SP +
# selective), as calculon transcribes the bars (calculon/llm/validation.py, seqsel_fig1).
FIGURE1 = {
    "22B": (45.5625, 59.25, 9.5625),
    "175B": (45.5625, 66.84375, 12.3515625),
    "530B": (31.640625, 114.0234375, 23.076171875),
    "1T": (32.958984375, 131.25, 26.5625),
}


def gpt(heads: int, hidden: int, layers: int):
    cfg = {"model_type": "gpt2", "n_embd": hidden, "n_layer": layers, "n_head": heads, "vocab_size": VOCAB,
           "n_positions": S, "attn_pdrop": 0.1}
    return family_module("gpt2").read(cfg, name=f"gpt-{hidden}")


def paper_run(name: str, *, recompute: str, sp: bool, engine: str = "megatron", attention: str = "eager"):
    heads, hidden, layers, pp, gpus, batch, micro, v = MODELS[name]
    cluster = Cluster(num_nodes=max(1, gpus // 8), gpus_per_node=min(8, gpus), gpu=get_gpu("a100-80gb"),
                      interconnect=get_interconnect("ib-hdr"))
    training = Training(seq_len=S, global_batch=batch, precision="fp16", attention=attention)
    layout = Layout(dp=1, tp=8, pp=pp, micro_batch=micro, grad_accum=batch // micro, recompute=recompute,
                    sequence_parallel=sp, virtual_stages=v)
    return estimate(model=gpt(heads, hidden, layers), layout=layout, training=training, cluster=cluster,
                    engine=engine)


def gpt_shape(*, heads: int, hidden: int, t: int, dropout: bool = True) -> LayerShape:
    """A GPT layer's shape on one of ``t`` TP ranks (what ``estimate`` hands the formulas)."""
    return LayerShape(hidden=hidden, q_width=hidden // t, kv_width=hidden // t, ffn=4 * hidden // t,
                      heads=heads // t, dropout=dropout)


# --- Table 2 ------------------------------------------------------------------------------------

TABLE2 = {
    # (recompute, sequence parallel): bytes per layer / sbh, Korthikanti et al. Table 2
    ("none", False): lambda t, a, h: 10 + 24 / t + 5 * a * S / (h * t),
    ("none", True): lambda t, a, h: 34 / t + 5 * a * S / (h * t),
    ("selective", False): lambda t, a, h: 10 + 24 / t,
    ("selective", True): lambda t, a, h: 34 / t,
    ("full", False): lambda t, a, h: 2,
}


@pytest.mark.parametrize("heads,hidden", [(64, 6144), (96, 12288), (16, 2048)])
@pytest.mark.parametrize("variant,t", [(v, t) for v in TABLE2 for t in (1, 2, 8) if t > 1 or not v[1]])
def test_layer_activations_reproduce_table2(variant, t, heads, hidden):
    recompute, sp = variant
    b = 2
    got = meg.layer_activation_bytes(shape=gpt_shape(heads=heads, hidden=hidden, t=t), gated=False, tokens=S * b,
                                     seq_len=S, act_bytes=2, attention="eager", recompute=recompute,
                                     sequence_parallel_tp=t if sp else 1)
    want = S * b * hidden * TABLE2[variant](t, heads, hidden)
    assert got == pytest.approx(want, rel=1e-12)


def test_no_parallelism_is_34_plus_5as_over_h():
    h, a, b = 4096, 32, 1
    got = meg.layer_activation_bytes(shape=gpt_shape(heads=a, hidden=h, t=1), gated=False, tokens=S * b, seq_len=S,
                                     act_bytes=2, attention="eager", recompute="none")
    assert got == pytest.approx(S * b * h * (34 + 5 * a * S / h))


def test_full_recompute_with_sequence_parallel_keeps_a_sharded_layer_input():
    got = meg.layer_activation_bytes(shape=gpt_shape(heads=64, hidden=6144, t=8), gated=False, tokens=S, seq_len=S,
                                     act_bytes=2, attention="eager", recompute="full", sequence_parallel_tp=8)
    assert got == pytest.approx(2 * S * 6144 / 8)


def test_flash_attention_leaves_the_score_terms_out():
    """A fused kernel keeps Q, K, V, its output (all in the 34) and an fp32 log-sum-exp per row."""
    h, a, t = 6144, 64, 8
    kw = dict(shape=gpt_shape(heads=a, hidden=h, t=t), gated=False, tokens=S, seq_len=S, act_bytes=2,
              sequence_parallel_tp=t)
    flash = meg.layer_activation_bytes(attention="flash", recompute="none", **kw)
    selective = meg.layer_activation_bytes(attention="eager", recompute="selective", **kw)
    assert selective == pytest.approx(S * h * 34 / t)
    assert flash == pytest.approx(selective + 4 * S * a / t)
    assert meg.layer_activation_bytes(attention="sdpa", recompute="selective", **kw) == pytest.approx(selective)


def test_no_dropout_no_masks_and_gated_mlp():
    """Without dropout the two residual masks and the attention-dropout terms go (``2h`` and
    ``3as`` of the fp16 34 + 5as/h); SwiGLU keeps fc1's 2f output and fc2's f input."""
    h, a = 4096, 32
    plain = gpt_shape(heads=a, hidden=h, t=1, dropout=False)
    got = meg.layer_activation_bytes(shape=plain, gated=False, tokens=S, seq_len=S, act_bytes=2, attention="eager",
                                     recompute="none")
    assert got == pytest.approx(S * h * (32 + 2 * a * S / h))
    f = 11008
    swiglu = dataclasses.replace(plain, ffn=f)
    got = meg.layer_activation_bytes(shape=swiglu, gated=True, tokens=S, seq_len=S, act_bytes=2, attention="eager",
                                     recompute="selective")
    assert got == pytest.approx(S * (8 * h + 8 * h + 6 * f))


# --- model states -----------------------------------------------------------------------------


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_states_are_18_bytes_per_param_without_the_distributed_optimizer(precision):
    st = meg.model_states(params=1e9, precision=precision, optimizer="adamw", distributed_optimizer=False, dp=8)
    assert (st.params_bytes, st.grads_bytes, st.optimizer_bytes) == (2e9, 4e9, 12e9)
    assert st.params_bytes + st.grads_bytes + st.optimizer_bytes == 18e9


@pytest.mark.parametrize("dp", [1, 2, 8, 64])
def test_distributed_optimizer_is_6_plus_12_over_d(dp):
    st = meg.model_states(params=1e9, precision="bf16", optimizer="adam", distributed_optimizer=True, dp=dp)
    assert st.params_bytes + st.grads_bytes + st.optimizer_bytes + st.step_grads_bytes == pytest.approx(
        1e9 * (6 + 12 / dp))


def test_fp32_has_no_master_copy():
    st = meg.model_states(params=1e9, precision="fp32", optimizer="adamw", distributed_optimizer=True, dp=4)
    assert (st.params_bytes, st.grads_bytes, st.optimizer_bytes) == (4e9, 4e9, 2e9)


def test_estimate_uses_megatron_states_with_zero1_as_the_distributed_optimizer():
    spec = gpt(16, 2048, 8)
    cluster = Cluster(num_nodes=1, gpus_per_node=8, gpu=get_gpu("a100-80gb"))
    training = Training(seq_len=S, global_batch=16, precision="bf16")
    for zero, per_param in ((0, 18), (1, 6 + 12 / 4)):
        layout = Layout(dp=4, tp=2, pp=1, zero_stage=zero, micro_batch=1, grad_accum=4)
        est = estimate(model=spec, layout=layout, training=training, cluster=cluster, engine="megatron")
        stage = est.memory.per_gpu
        params = rank_params(spec, layout, tp_style="megatron")
        assert stage.model_states_bytes == pytest.approx(per_param * params, rel=1e-6)


def test_estimate_refuses_what_the_megatron_engine_cannot_run():
    spec = gpt(16, 2048, 8)
    cluster = Cluster(num_nodes=1, gpus_per_node=8, gpu=get_gpu("a100-80gb"))
    training = Training(seq_len=S, global_batch=8, precision="bf16")
    for layout in (Layout(dp=8, zero_stage=2), Layout(dp=8, zero_stage=1, offload_optimizer="cpu")):
        with pytest.raises(ValueError, match="megatron engine"):
            estimate(model=spec, layout=layout, training=training, cluster=cluster, engine="megatron")
    with pytest.raises(ValueError, match="engine"):
        estimate(model=spec, layout=Layout(dp=8), training=training, cluster=cluster, engine="Megatron")


# --- embedding sharding --------------------------------------------------------------------------


def test_megatron_engine_shards_the_word_embedding_by_tp_and_keeps_positions_whole():
    spec = gpt(64, 6144, 48)
    word, positions = spec.embedding_tensors
    one = Layout(dp=1, tp=1, pp=1)
    eight = Layout(dp=1, tp=8, pp=1)
    layers_1 = rank_params(spec, one, tp_style="megatron") - spec.embedding_params
    layers_8 = rank_params(spec, eight, tp_style="megatron") - word / 8 - positions
    assert 7.9 < layers_1 / layers_8 < 8.0  # matrices sharded, norms and row-parallel biases not
    # Through estimate(): the megatron engine's first stage holds word/8, AutoTP the whole table.
    cluster = Cluster(num_nodes=1, gpus_per_node=8, gpu=get_gpu("a100-80gb"))
    training = Training(seq_len=S, global_batch=4, precision="bf16")
    layout = Layout(dp=1, tp=8, pp=1, micro_batch=4)
    meg_p = estimate(model=spec, layout=layout, training=training, cluster=cluster, engine="megatron")
    ds_p = estimate(model=spec, layout=layout, training=training, cluster=cluster)
    assert meg_p.memory.per_gpu.params_bytes == pytest.approx(2 * (layers_8 + word / 8 + positions), rel=1e-9)
    assert ds_p.memory.per_gpu.params_bytes - meg_p.memory.per_gpu.params_bytes == pytest.approx(
        2 * word * 7 / 8, rel=1e-9)


def test_untied_output_layer_sits_on_the_last_stage_sharded_by_tp():
    def spec(tied: bool):
        cfg = {"model_type": "gpt2", "n_embd": 2048, "n_layer": 8, "n_head": 16, "vocab_size": VOCAB,
               "n_positions": S, "tie_word_embeddings": tied}
        return family_module("gpt2").read(cfg, name=f"tied-{tied}")

    untied, tied = spec(False), spec(True)
    head = VOCAB * 2048 / 4
    one = Layout(dp=1, tp=4, pp=1)
    assert rank_params(untied, one, tp_style="megatron") - rank_params(tied, one, tp_style="megatron") == head
    two = Layout(dp=1, tp=4, pp=2, micro_batch=1, grad_accum=8)
    first = rank_params(untied, two, stage=0, tp_style="megatron")
    last = rank_params(untied, two, stage=1, tp_style="megatron")
    assert last - first == pytest.approx(sum(untied.final_tensors) + head - head - S * 2048)
    assert first - rank_params(untied, Layout(dp=1, tp=4, pp=2, micro_batch=1, grad_accum=8), stage=0) == \
        pytest.approx(head - VOCAB * 2048)  # AutoTP keeps the input embedding whole


# --- Figure 1 -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(FIGURE1))
def test_figure1_within_5_percent(name):
    """Korthikanti et al. Figure 1, per GPU: parameters + optimizer (the bar counts the
    transformer layers, so a stage holding only layers; 22B has one stage, embedding included)
    and first-stage activations, TP baseline and SP + selective recompute."""
    states, act_base, act_seqsel = FIGURE1[name]
    for (recompute, sp), published in ((("none", False), act_base), (("selective", True), act_seqsel)):
        mem = paper_run(name, recompute=recompute, sp=sp).memory
        layers_only = mem.per_stage[len(mem.per_stage) // 2]
        assert layers_only.model_states_bytes / GiB == pytest.approx(states, rel=0.05)
        assert mem.per_stage[0].activations_bytes / GiB == pytest.approx(published, rel=0.05)


def test_figure1_activations_on_the_deepspeed_path_are_far_off():
    """The HF-module accounting is what the Megatron engine got before: 1.8-2x the published
    SP + selective activations. The engine switch is what makes the difference."""
    published = FIGURE1["530B"][2]
    hf = paper_run("530B", recompute="selective", sp=True, engine="deepspeed").memory.per_stage[0]
    assert hf.activations_bytes / GiB > 1.5 * published


def test_activation_terms_add_up_in_estimate():
    """22B, one stage: L layers + the embedding and output terms, nothing else."""
    heads, hidden, layers, pp, gpus, batch, micro, v = MODELS["22B"]
    terms = meg.activation_terms(shape=gpt_shape(heads=heads, hidden=hidden, t=8), gated=False, tokens=micro * S,
                                 seq_len=S, vocab=VOCAB, act_bytes=2, attention="eager", recompute="selective",
                                 tp=8, sequence_parallel_tp=8)
    act = paper_run("22B", recompute="selective", sp=True).memory.per_gpu.activations_bytes
    assert terms.layer_bytes == pytest.approx(micro * S * hidden * 34 / 8)
    assert act == pytest.approx(layers * terms.layer_bytes + terms.first_stage_bytes + terms.last_stage_bytes, abs=1)
    # Korthikanti §4.3: output layer + loss 4sbh/t (1 + V/h) with SP.
    assert terms.last_stage_bytes == pytest.approx(4 * micro * S * hidden / 8 * (1 + VOCAB / hidden))


def test_buffers_are_megatrons_not_zeros():
    mem = paper_run("530B", recompute="selective", sp=True).memory.per_gpu
    tokens_h = S * 20480
    assert mem.buffers_bytes == pytest.approx(2 * tokens_h + 2 * 2 * tokens_h / 8)  # SP gather + p2p


# --- the planner ----------------------------------------------------------------------------------


def _intent(tmp_path, name: str, *, recompute: str):
    from dstk.intent import intent_from_dict

    heads, hidden, layers, pp, gpus, batch, micro, v = MODELS[name]
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "gpt2", "n_embd": hidden, "n_layer": layers, "n_head": heads,
                                  "vocab_size": VOCAB, "n_positions": S, "attn_pdrop": 0.1}))
    return intent_from_dict({
        "model": {"name": str(config)},
        "cluster": {"num_nodes": gpus // 8, "gpus_per_node": 8, "gpu": "a100-80gb"},
        "training": {"seq_len": S, "global_batch": batch, "precision": "fp16"},
        "constraints": {"engine": "megatron", "tp": 8, "pp": pp, "micro_batch": micro, "recompute": recompute},
    })


@pytest.mark.parametrize("name", ["530B", "1T"])
def test_planner_accepts_the_published_selective_sp_layouts_on_80gb_a100(tmp_path, name):
    """Korthikanti et al. trained 530B (TP 8 x PP 35) and 1T (TP 8 x PP 64) with sequence parallelism
    and selective recompute on 80 GB A100s (Table 5): the planner must keep those layouts."""
    from dstk.plan import plan_intent, resolve

    ctx = resolve(_intent(tmp_path, name, recompute="selective"))
    result = plan_intent(ctx)
    assert result.plans, [r.reason for r in result.rejected]
    best = result.plans[0].layout
    assert (best.tp, best.pp, best.micro_batch, best.recompute, best.sequence_parallel) == (
        8, MODELS[name][3], 1, "selective", True)
    assert result.plans[0].estimate.memory.per_gpu.total_bytes <= ctx.search.usable_bytes


@pytest.mark.parametrize("name", ["530B", "1T"])
def test_published_layouts_fit_with_the_papers_interleaving(name):
    """The same with the interleaving of Figure 1 (530B: 3 chunks), estimated directly."""
    from dstk.plan import Search

    mem = paper_run(name, recompute="selective", sp=True).memory
    search = Search(world_size=MODELS[name][4], gpus_per_node=8, num_layers=MODELS[name][2],
                    num_heads=MODELS[name][0], num_kv_heads=MODELS[name][0], global_batch=MODELS[name][5],
                    capacity_bytes=get_gpu("a100-80gb").memory_bytes,
                    overhead_bytes=get_gpu("a100-80gb").overhead_bytes)
    assert mem.per_gpu.total_bytes <= search.usable_bytes
    hf = paper_run(name, recompute="selective", sp=True, engine="deepspeed").memory.per_gpu
    assert hf.total_bytes > search.usable_bytes  # what the planner saw before


def test_baseline_without_recompute_does_not_fit_530b():
    """Figure 1: without recompute or SP the 530B activations alone (114 GiB) exceed the GPU."""
    mem = paper_run("530B", recompute="none", sp=False).memory
    assert mem.per_gpu.total_bytes > get_gpu("a100-80gb").memory_bytes
