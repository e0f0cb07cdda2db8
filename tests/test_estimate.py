"""The estimator's formulas and its API (pure arithmetic; the DeepSpeed comparison is in
test_estimate_deepspeed.py, activations in test_estimate_activations.py)."""

from __future__ import annotations

import json

import pytest

from dstk.cli import main
from dstk.estimate import estimate
from dstk.estimate import memory as mem
from dstk.estimate import timing as tm
from dstk.hardware import Cluster, get_gpu, get_interconnect
from dstk.layout import Layout, Training
from dstk.models import ModelSpec, get_model

H100x8 = Cluster(num_nodes=1, gpus_per_node=8, gpu=get_gpu("h100-sxm"))
TRAIN = Training(seq_len=4096, global_batch=64)


def est(model="llama-3-8b", cluster=H100x8, training=TRAIN, **layout):
    spec = get_model(model) if isinstance(model, str) else model
    return estimate(model=spec, layout=Layout(**layout), training=training, cluster=cluster)


def test_zero_paper_table():
    """Rajbhandari et al. 2020 Figure 1: Psi = 7.5B, N_d = 64, K = 12 -> 120, 31.4, 16.6, 1.88 GB."""
    got = [mem.zero_paper_bytes(params=7.5e9, dp=64, stage=s) / 1e9 for s in range(4)]
    assert got == pytest.approx([120, 31.4, 16.6, 1.875], abs=0.05)


def test_model_states_shrink_with_zero_and_match_bytes_per_param():
    p = 8e9
    s0, s1, s2, s3 = (mem.model_states(params=p, persistent=0, precision="bf16", optimizer="adamw",
                                       zero_stage=z, dp=8) for z in range(4))
    assert s0.params_bytes + s0.grads_bytes + s0.optimizer_bytes == 16 * p  # 2 + 2 + 12
    assert s2.optimizer_bytes == 12 * p / 8 and s2.params_bytes == 2 * p
    assert s3.params_bytes == 2 * p / 8
    totals = [s.params_bytes + s.grads_bytes + s.optimizer_bytes for s in (s0, s1, s2, s3)]
    assert totals == sorted(totals, reverse=True)
    fp32 = mem.model_states(params=p, persistent=0, precision="fp32", optimizer="sgd", zero_stage=1, dp=4)
    assert fp32.optimizer_bytes == (4 + 4) * p / 4  # DeepSpeed clones an fp32 master even in fp32


def test_offload_moves_states_to_cpu():
    on = mem.model_states(params=1e9, persistent=0, precision="bf16", optimizer="adamw", zero_stage=3, dp=4)
    off = mem.model_states(params=1e9, persistent=0, precision="bf16", optimizer="adamw", zero_stage=3, dp=4,
                           offload_optimizer="cpu", offload_params="cpu")
    assert off.optimizer_bytes == 0 and off.params_bytes == 0
    assert off.cpu_bytes == pytest.approx(on.optimizer_bytes + on.step_grads_bytes + on.params_bytes)


def test_estimate_json_shape():
    d = est(dp=8, zero_stage=1, grad_accum=8).to_dict()
    assert set(d["memory"]["per_gpu"]) >= {"params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes",
                                           "buffers_bytes", "overhead_bytes", "total_bytes"}
    assert set(d["time"]) >= {"step_seconds", "tokens_per_second", "tflops_per_gpu", "mfu"}
    assert d["layout"]["zero_stage"] == 1 and "cpu_bytes" in d["memory"]
    per_gpu = d["memory"]["per_gpu"]
    assert per_gpu["total_bytes"] == sum(v for k, v in per_gpu.items() if k != "total_bytes")
    json.dumps(d)


def test_params_only_has_unknown_activations():
    e = estimate(model=7_000_000_000, layout=Layout(dp=8, zero_stage=2), training=TRAIN, cluster=H100x8)
    assert e.memory.per_gpu.activations_bytes is None
    assert e.memory.per_gpu.optimizer_bytes == pytest.approx(12 * 7e9 / 8, rel=1e-6)
    assert e.to_dict()["memory"]["per_gpu"]["activations_bytes"] is None


def test_pipeline_stages_differ_at_the_ends():
    e = est(dp=2, pp=4, zero_stage=1, grad_accum=32)
    first, *_, last = e.memory.per_stage
    assert len(e.memory.per_stage) == 4 and sum(s.num_layers for s in e.memory.per_stage) == 32
    spec = get_model("llama-3-8b")
    assert first.params_bytes - e.memory.per_stage[1].params_bytes == 2 * spec.embedding_params
    assert last.params_bytes > e.memory.per_stage[1].params_bytes  # lm_head
    assert first.activations_bytes > e.memory.per_stage[2].activations_bytes  # 1F1B holds p - i micro-batches
    assert e.time.bubble_fraction == pytest.approx(3 / 32)


def test_activation_terms_follow_recompute_and_attention():
    base = dict(dp=8, micro_batch=1, grad_accum=8)
    none = est(**base).memory.per_gpu.activations_bytes
    sel = est(**base, recompute="selective").memory.per_gpu.activations_bytes
    full = est(**base, recompute="full").memory.per_gpu.activations_bytes
    eager = est(training=Training(seq_len=4096, global_batch=64, attention="eager"), **base).memory.per_gpu
    assert full < sel <= none < eager.activations_bytes
    # eager attention keeps the fp32 softmax and its bf16 copy: (4 + 2) a s bytes per token per layer
    spec = get_model("llama-3-8b")
    extra = eager.activations_bytes - none
    assert extra > 32 * 4096 * spec.num_heads * 4096 * 6


def test_tensor_parallel_shards_and_adds_communication():
    one = est(dp=8, zero_stage=1, grad_accum=8)
    tp = est(dp=2, tp=4, zero_stage=1, grad_accum=32)
    assert tp.memory.per_gpu.params_bytes < one.memory.per_gpu.params_bytes / 3
    assert tp.time.comm["tp"] > 0 and one.time.comm["tp"] == 0


def test_flops_and_mfu_are_consistent():
    e = est(dp=8, grad_accum=8)
    spec = get_model("llama-3-8b")
    # 6N + 12 L s (a d) per token, N = matmul params (no embedding lookup)
    n = spec.num_params - spec.embedding_params - spec.num_layers * 2 * spec.hidden_size - spec.hidden_size
    per_token = 6 * n + 12 * spec.num_layers * 4096 * spec.attention_width
    assert e.time.model_flops_per_step == pytest.approx(per_token * 64 * 4096, rel=1e-9)
    assert e.time.mfu == pytest.approx(e.time.tflops_per_gpu * 1e12 / 989e12)
    assert e.time.tokens_per_second == pytest.approx(64 * 4096 / e.time.step_seconds)


def test_slower_network_and_more_nodes_cost_time():
    spec = get_model("llama-2-13b")
    fast = Cluster(num_nodes=4, gpus_per_node=8, gpu=get_gpu("a100-80gb"), interconnect=get_interconnect("ib-ndr"))
    slow = Cluster(num_nodes=4, gpus_per_node=8, gpu=get_gpu("a100-80gb"), interconnect=get_interconnect("eth-25g"))
    layout = Layout(dp=32, zero_stage=3, grad_accum=2)
    training = Training(seq_len=2048, global_batch=64)
    a = estimate(model=spec, layout=layout, training=training, cluster=fast)
    b = estimate(model=spec, layout=layout, training=training, cluster=slow)
    assert b.time.comm_seconds > a.time.comm_seconds and b.time.step_seconds > a.time.step_seconds


def test_cpu_cluster_for_the_demo():
    cpu = Cluster(num_nodes=1, gpus_per_node=2, gpu=get_gpu("cpu"))
    tiny = ModelSpec.generic(num_layers=2, hidden_size=64, num_heads=4, vocab_size=256, seq_len=128)
    e = estimate(model=tiny, layout=Layout(dp=2, zero_stage=2, grad_accum=2),
                 training=Training(seq_len=128, global_batch=4, precision="fp32"), cluster=cpu)
    assert 0 < e.memory.per_gpu.total_bytes < cpu.gpu.memory_bytes and e.time.step_seconds > 0


def test_layout_must_use_the_whole_cluster():
    with pytest.raises(ValueError, match="dp\\*tp\\*pp"):
        est(dp=4)


def test_bubble_and_ring_formulas():
    assert tm.bubble_fraction(pp=4, microbatches=8) == pytest.approx(3 / 8)
    assert tm.bubble_fraction(pp=4, microbatches=8, virtual_stages=2) == pytest.approx(3 / 16)
    assert tm.ring_allreduce_seconds(nbytes=8e9, ranks=8, bandwidth=1e9) == pytest.approx(14.0)
    assert tm.ring_gather_seconds(nbytes=8e9, ranks=8, bandwidth=1e9) == pytest.approx(7.0)
    assert mem.in_flight_microbatches(pp=4, stage=0, grad_accum=8) == 4
    assert mem.in_flight_microbatches(pp=4, stage=3, grad_accum=8) == 1


# --- the CLI ---------------------------------------------------------------------------------


def test_cli_json(capsys):
    assert main(["estimate", "--model", "gpt2", "--gpus", "2", "--gpu", "a100-80gb", "--zero", "2",
                 "--global-batch", "8", "--seq-len", "1024", "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["layout"]["dp"] == 2 and d["layout"]["grad_accum"] == 4 and d["model"]["num_params"] == 124_439_808


def test_cli_dimensions_and_human(capsys):
    assert main(["estimate", "--num-layers", "4", "--hidden-size", "256", "--num-heads", "4", "--vocab-size",
                 "1000", "--gpus", "16", "--gpus-per-node", "8", "--gpu", "a100-40gb", "--pp", "2", "--zero", "1",
                 "--global-batch", "64", "--tokens", "1e9"]) == 0
    out = capsys.readouterr().out
    assert "per stage" in out and "MFU" in out and "time for 1,000,000,000 tokens" in out


@pytest.mark.parametrize("argv", [
    ["estimate", "--gpus", "8"],
    ["estimate", "--model", "gpt2", "--params", "1e9", "--gpus", "8"],
    ["estimate", "--model", "gpt2", "--gpus", "8", "--tp", "3"],
    ["estimate", "--model", "gpt2", "--gpus", "8", "--global-batch", "12"],
    ["estimate", "--num-layers", "2", "--gpus", "8"],
    ["estimate", "--model", "gpt2", "--gpus", "8", "--zero", "2", "--pp", "2"],
])
def test_cli_usage_errors(argv, capsys):
    assert main(argv) == 2
    assert "error:" in capsys.readouterr().err


def test_cli_unknown_model_is_exit_1(capsys):
    assert main(["estimate", "--model", "no-such-model", "--gpus", "8"]) == 1


def test_models_and_gpus_commands(capsys):
    assert main(["models", "--format", "json"]) == 0
    assert any(r["name"] == "llama-3-8b" for r in json.loads(capsys.readouterr().out))
    assert main(["gpus"]) == 0
    assert "h100-sxm" in capsys.readouterr().out


def test_cli_from_an_intent_file(tmp_path, capsys):
    intent = tmp_path / "intent.yaml"
    intent.write_text("model: {num_layers: 2, hidden_size: 64, num_heads: 4, vocab_size: 512}\n"
                      "cluster: {num_nodes: 1, gpus_per_node: 2, gpu: cpu}\n"
                      "training: {seq_len: 64, global_batch: 8, precision: fp32}\n")
    assert main(["estimate", "--intent", str(intent), "--zero", "2", "--micro-batch", "2", "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["layout"]["dp"] == 2 and d["layout"]["grad_accum"] == 2 and d["training"]["precision"] == "fp32"
    assert d["cluster"]["gpu"] == "cpu"
    assert main(["estimate", "--intent", str(intent), "--gpus", "4"]) == 2


def test_cli_estimate_does_not_import_the_heavy_stack():
    import subprocess
    import sys

    code = ("import sys; from dstk.cli import main; main(['estimate', '--model', 'llama-3-8b', '--gpus', '8', "
            "'--format', 'json']); print([m for m in ('torch', 'deepspeed', 'transformers', 'datasets') "
            "if m in sys.modules], file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr.strip().splitlines()[-1] == "[]"
