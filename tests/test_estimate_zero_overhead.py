"""ZeRO's own host work per step apart from communication (``steptime.zero_overhead_seconds``,
``GPU.zero_tensor_seconds`` / ``GPU.zero3_tensor_seconds``): DeepSpeed's gradient hooks and copies
(ZeRO-1/2) and module hooks with their fetch/release bookkeeping (ZeRO-3), paid even over one
data-parallel rank. Measured with ``benchmarks/zero_dp1_cost.py`` (``--one-rank`` and tp=2 dp=1 on
2 gloo ranks); the figures are in docs/estimate.md. Pure arithmetic except the tensor count, which
is checked against a real transformers Llama."""

from __future__ import annotations

import pytest

from dstk.errors import DstkError
from dstk.estimate import _model_facts, estimate
from dstk.estimate import memory as mem
from dstk.estimate import steptime as st
from dstk.hardware import Cluster, get_gpu, load_catalog
from dstk.layout import Layout, Training
from dstk.models import family_module

TINY_HF = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 4096,
           "tie_word_embeddings": False}
BUCKET = 46_000  # what `dstk generate` writes for the tiny CPU intent


def _llama(**changes):
    return family_module("llama").read({**TINY_HF, **changes}, name="tiny")


# --- the term ----------------------------------------------------------------------------------


def test_term_is_micro_steps_times_tensors_times_the_stage_figure():
    gpu = get_gpu("cpu").replace(zero_tensor_seconds=1e-4, zero3_tensor_seconds=5e-4)
    f = st.zero_overhead_seconds
    assert f(zero_stage=0, num_tensors=21, num_micro_batches=4, gpu=gpu) == 0.0
    assert f(zero_stage=1, num_tensors=21, num_micro_batches=1, gpu=gpu) == pytest.approx(21 * 1e-4)
    assert f(zero_stage=2, num_tensors=21, num_micro_batches=3, gpu=gpu) == pytest.approx(3 * 21 * 1e-4)
    assert f(zero_stage=3, num_tensors=39, num_micro_batches=2, gpu=gpu) == pytest.approx(2 * 39 * 5e-4)


def test_catalog_gpus_pay_nothing_and_the_cpu_entry_is_measured():
    """Host Python beside asynchronous kernels is not priced on a GPU; the ``cpu`` entry carries
    the measured figures, ZeRO-3's well above ZeRO-1/2's (its hooks run on every module)."""
    for slug in ("a100-80gb", "h100-sxm"):
        gpu = get_gpu(slug)
        assert gpu.zero_tensor_seconds == 0.0 and gpu.zero3_tensor_seconds == 0.0
    cpu = get_gpu("cpu")
    assert 0 < cpu.zero_tensor_seconds < cpu.zero3_tensor_seconds


@pytest.mark.parametrize("changes", [{}, {"num_hidden_layers": 4}, {"tie_word_embeddings": True}])
def test_stage_tensors_count_what_transformers_builds(changes):
    """The tensors the hooks run on: ``named_parameters`` of the real HF Llama (21 for the tiny one,
    39 with 4 layers, 20 with a tied head)."""
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    hf = {k: v for k, v in {**TINY_HF, **changes}.items() if k != "model_type"}
    with torch.device("meta"):
        real = LlamaForCausalLM(LlamaConfig(**hf))
    facts = _model_facts(_llama(**changes))
    layers = hf["num_hidden_layers"]
    assert st.stage_tensors(facts, layers=layers, first=True, last=True) == len(list(real.parameters()))
    # a middle pipeline stage holds only its layers' tensors
    assert st.stage_tensors(facts, layers=1, first=False, last=False) == 9


@pytest.mark.parametrize("tied", [True, False])
def test_stage_tensors_count_a_layernorm_models_final_norm_and_bias(tied):
    """GPT-2's final LayerNorm has a weight and a bias: two tensors for the hooks (the count once took
    the final norm as one tensor, and missed the last stage's own copy of a tied head)."""
    torch = pytest.importorskip("torch")
    from transformers import GPT2Config, GPT2LMHeadModel

    hf = {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 128, "n_positions": 64, "tie_word_embeddings": tied}
    with torch.device("meta"):
        real = GPT2LMHeadModel(GPT2Config(**hf))
    facts = _model_facts(family_module("gpt2").read({"model_type": "gpt2", **hf}, name="tiny-gpt2"))
    assert st.stage_tensors(facts, layers=2, first=True, last=True) == len(list(real.parameters()))
    # a pipeline's last stage: the layers, ln_f's two tensors, and a head (its own copy when tied)
    assert st.stage_tensors(facts, layers=1, first=False, last=True, pp=2) == 12 + 2 + 1


def test_hardware_file_sets_the_figures(tmp_path):
    path = tmp_path / "hw.yaml"
    path.write_text("gpus:\n  cpu: {zero_tensor_seconds: 2.0e-4, zero3_tensor_seconds: 1.0e-3}\n")
    gpus, _ = load_catalog(path)
    assert gpus["cpu"].zero_tensor_seconds == 2e-4 and gpus["cpu"].zero3_tensor_seconds == 1e-3
    path.write_text("gpus:\n  cpu: {zero3_tensor_seconds: -1.0}\n")
    with pytest.raises(DstkError, match="zero3_tensor_seconds"):
        load_catalog(path)


# --- in the step ---------------------------------------------------------------------------------


def _step(zero: int, *, tp: int = 2, dp: int = 1, gpu=None, layers: int = 2) -> float:
    cluster = Cluster(num_nodes=1, gpus_per_node=tp * dp, gpu=gpu or get_gpu("cpu"))
    layout = Layout(tp=tp, dp=dp, zero_stage=zero, micro_batch=8 // dp)
    training = Training(seq_len=64, global_batch=8, precision="bf16")
    buffers = mem.ZeroBuffers(reduce_bucket_size=BUCKET, allgather_bucket_size=BUCKET)
    return estimate(model=_llama(num_hidden_layers=layers), layout=layout, training=training, cluster=cluster,
                    buffers=buffers).time.step_seconds


def test_tp2_dp1_zero_order_follows_the_measured_one():
    """tp=2 dp=1 on 2 CPU ranks measured ZeRO-0 < ZeRO-1/2 < ZeRO-3 (docs/estimate.md); without the
    term all four were predicted alike (38.9 ms), since at dp=1 there is no collective to price."""
    z0, z1, z2, z3 = (_step(z) for z in range(4))
    assert z0 < z1 < z3 and z0 < z2 < z3
    cpu = get_gpu("cpu")
    assert z3 - z0 == pytest.approx(21 * cpu.zero3_tensor_seconds)
    assert z1 - z0 == pytest.approx(21 * cpu.zero_tensor_seconds)


def test_term_scales_with_tensors_and_vanishes_where_the_figure_is_zero():
    cpu = get_gpu("cpu")
    deep = _step(3, layers=4) - _step(0, layers=4)
    assert deep == pytest.approx(39 * cpu.zero3_tensor_seconds)
    quiet = cpu.replace(zero_tensor_seconds=0.0, zero3_tensor_seconds=0.0)
    assert _step(3, gpu=quiet) == pytest.approx(_step(0, gpu=quiet))


def test_megatron_engine_pays_no_deepspeed_hooks():
    """Megatron's distributed optimizer (priced as ZeRO-1) has no DeepSpeed gradient hooks."""
    cpu = get_gpu("cpu")
    quiet = cpu.replace(zero_tensor_seconds=0.0, zero3_tensor_seconds=0.0)

    def step(gpu):
        cluster = Cluster(num_nodes=1, gpus_per_node=2, gpu=gpu)
        layout = Layout(dp=2, zero_stage=1, micro_batch=4)
        training = Training(seq_len=64, global_batch=8, precision="bf16")
        return estimate(model=_llama(), layout=layout, training=training, cluster=cluster,
                        engine="megatron").time.step_seconds

    assert step(cpu) == pytest.approx(step(quiet))
