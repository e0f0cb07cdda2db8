"""The offloaded optimizer step priced from the node's DRAM bandwidth, shared by its ranks
(``dstk.hardware.host_optimizer_seconds``): the bytes DeepSpeed's host step moves per parameter,
the catalog's node figure and its ``--hardware`` override, and the planner's Llama-3-8B pick on
8 H100. ``benchmarks/cpu_adam.py`` measures the real DeepSpeedCPUAdam against the formula."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re

import pytest

from dstk import hardware as hw
from dstk import plan as planner
from dstk.errors import DstkError
from dstk.estimate import estimate
from dstk.hardware import Cluster, get_gpu, get_interconnect, load_catalog
from dstk.intent import intent_from_dict
from dstk.layout import Layout, Training
from dstk.models import family_module

LLAMA_8B = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
            "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}


def _deepspeed_file(relative: str) -> str:
    """A file of the installed DeepSpeed, read without importing it (no torch here)."""
    spec = importlib.util.find_spec("deepspeed")
    return (pathlib.Path(spec.origin).parent / relative).read_text()


def test_cpu_adam_moves_the_bytes_its_kernel_loads_and_stores():
    source = _deepspeed_file("ops/csrc/includes/cpu_adam.h")
    kernel = source[source.index("void Adam_Optimizer::Step_AVX"):]
    kernel = kernel[:kernel.index("*rounded_size = new_rounded_size;")]
    loads = re.findall(r"simd_load<span>\(\w+, (\w+) \+ i\)", kernel)
    stores = re.findall(r"simd_store<span>\((\w+) \+ i,", kernel)
    assert sorted(loads) == ["_exp_avg", "_exp_avg_sq", "_params", "grads"]
    assert sorted(stores) == ["_exp_avg", "_exp_avg_sq", "_params"]
    assert hw.CPU_ADAM_BYTES_PER_PARAM == 4 * (len(loads) + len(stores))  # fp32 states and master


def test_the_host_step_counts_the_unscale_and_the_16_bit_copy_deepspeed_runs():
    stage12 = _deepspeed_file("runtime/zero/stage_1_and_2.py")
    assert "self.unscale_and_clip_grads([single_grad_partition], scaled_global_grad_norm)" in stage12
    assert "bit16_partition_buffer.data.copy_(fp32_partition.data)" in stage12
    adam = hw.host_optimizer_bytes_per_param(optimizer="adamw", precision="bf16")
    assert adam == 8 + 28 + 6
    assert hw.host_optimizer_bytes_per_param(optimizer="adamw", precision="bf16", unscale=False) == 28 + 6
    assert hw.host_optimizer_bytes_per_param(optimizer="lion", precision="bf16") == 8 + 20 + 6
    assert hw.host_optimizer_bytes_per_param(optimizer="adamw", precision="fp32") == 8 + 28 + 8


@pytest.mark.parametrize("ranks", [1, 2, 8])
def test_the_time_scales_with_ranks_per_node_and_with_the_shard(ranks):
    one = hw.host_optimizer_seconds(params_per_rank=1e9, ranks_per_node=1, host_dram_bytes_per_s=200e9,
                                    bytes_per_param=42)
    assert one == pytest.approx(1e9 * 42 / 200e9)
    assert hw.host_optimizer_seconds(params_per_rank=1e9, ranks_per_node=ranks, host_dram_bytes_per_s=200e9,
                                     bytes_per_param=42) == pytest.approx(ranks * one)
    assert hw.host_optimizer_seconds(params_per_rank=ranks * 1e9, ranks_per_node=1, host_dram_bytes_per_s=200e9,
                                     bytes_per_param=42) == pytest.approx(ranks * one)


def _offload_seconds(cluster: Cluster, *, dp: int, zero: int = 3) -> tuple[float, float]:
    """The estimate's offload seconds of an 8B Llama and its shard (parameters per rank)."""
    model = family_module("llama").read(LLAMA_8B, name="8b")
    est = estimate(model=model, layout=Layout(dp=dp, zero_stage=zero, micro_batch=1, grad_accum=1,
                                              offload_optimizer="cpu"),
                   training=Training(seq_len=4096, global_batch=dp, precision="bf16"), cluster=cluster)
    return est.time.comm["offload"], est.model.num_params / dp


def test_the_estimate_shares_the_node_between_its_ranks():
    h100 = get_gpu("h100-sxm")
    one_node = Cluster(num_nodes=1, gpus_per_node=8, gpu=h100)
    two_nodes = Cluster(num_nodes=2, gpus_per_node=4, gpu=h100, interconnect=get_interconnect("ib-ndr"))
    (eight, shard), (four, same) = _offload_seconds(one_node, dp=8), _offload_seconds(two_nodes, dp=8)
    assert shard == same
    pcie = (4 + 2) * shard / h100.host_bytes_per_s
    host = shard * 42 / h100.host_dram_bytes_per_s  # one rank alone on the node
    assert eight == pytest.approx(pcie + 8 * host, rel=1e-9)
    assert four == pytest.approx(pcie + 4 * host, rel=1e-9)
    # an 8B shard over 8 H100 ranks: ~1e9 parameters each, ~0.85 s on a DGX H100's 400 GB/s
    assert 0.8 < eight < 1.1


def test_the_catalog_names_the_dgx_nodes():
    # the published triads, GiB/s as my_stream prints them
    assert get_gpu("a100-80gb").host_dram_bytes_per_s == pytest.approx(206.751 * 2**30)
    assert get_gpu("h100-sxm").host_dram_bytes_per_s == pytest.approx(372.228 * 2**30)
    assert get_gpu("h200").host_dram_bytes_per_s == get_gpu("h100-sxm").host_dram_bytes_per_s
    assert hw.dram_peak_bytes_per_s(sockets=2, channels_per_socket=8, mega_transfers_per_s=4800) == 614.4e9
    a10 = get_gpu("a10")
    assert a10.host_dram_bytes_per_s is None
    assert Cluster(gpu=a10).host_dram_bytes_per_s == hw.HOST_DRAM_FALLBACK_BYTES_PER_S


def test_the_node_figure_round_trips_through_a_hardware_file(tmp_path):
    path = tmp_path / "hw.yaml"
    path.write_text("gpus:\n"
                    "  h100-sxm: {host_dram_gbps: 100}\n"
                    "  my-a10: {base: a10, host_dram_gbps: 50.5}\n")
    gpus, _ = load_catalog(path)
    assert gpus["h100-sxm"].host_dram_bytes_per_s == 100e9
    assert gpus["my-a10"].host_dram_bytes_per_s == 50.5e9
    assert gpus["a100-80gb"].host_dram_bytes_per_s == get_gpu("a100-80gb").host_dram_bytes_per_s
    slow, shard = _offload_seconds(Cluster(gpus_per_node=8, gpu=gpus["h100-sxm"]), dp=8)
    fast, _ = _offload_seconds(Cluster(gpus_per_node=8, gpu=get_gpu("h100-sxm")), dp=8)
    assert slow - fast == pytest.approx(8 * shard * 42 * (1 / 100e9 - 1 / get_gpu("h100-sxm").host_dram_bytes_per_s))


def test_dstk_estimate_prices_offload_at_the_hardware_files_node(tmp_path, capsys):
    from dstk.cli import main

    path = tmp_path / "hw.yaml"
    path.write_text("gpus:\n  h100-sxm: {host_dram_gbps: 100}\n")
    argv = ["estimate", "--model", "llama-3-8b", "--gpus", "8", "--gpu", "h100-sxm", "--zero", "3",
            "--offload-optimizer", "cpu", "--format", "json"]
    offload = {}
    for name, extra in (("catalog", []), ("file", ["--hardware", str(path)])):
        assert main(argv + extra) == 0
        out = json.loads(capsys.readouterr().out)
        offload[name] = out["time"]["comm"]["offload"]
    shard = out["model"]["num_params"] / 8
    host = shard * 42 * 8
    assert offload["file"] - offload["catalog"] == pytest.approx(
        host / 100e9 - host / get_gpu("h100-sxm").host_dram_bytes_per_s, rel=1e-6)


@pytest.mark.parametrize("value, message", [("-5", "host_dram_bytes_per_s: expected a positive number"),
                                            ("fast", "host_dram_gbps: expected a number")])
def test_a_bad_node_figure_is_refused_with_its_name(tmp_path, value, message):
    path = tmp_path / "hw.yaml"
    path.write_text(f"gpus:\n  h100-sxm: {{host_dram_gbps: {value}}}\n")
    with pytest.raises(DstkError, match=message):
        load_catalog(path)


def _llama_3_8b_node(**constraints):
    """The plan of docs/plan.md's Llama-3-8B intent (examples/intents/llama-3-8b-1node.yaml)."""
    intent = intent_from_dict({"model": {"name": "llama-3-8b"},
                               "cluster": {"num_nodes": 1, "gpus_per_node": 8, "gpu": "h100-sxm"},
                               "training": {"seq_len": 8192, "global_batch_tokens": 4194304, "precision": "bf16"},
                               "constraints": constraints})
    return planner.plan_intent(planner.resolve(intent), top=3)


def test_the_llama_3_8b_node_still_plans_with_sane_why_lines():
    result = _llama_3_8b_node()
    assert result.plans
    best = result.plans[0]
    assert best.why[0].startswith(planner.describe(best.layout) + ": fastest of")
    for line in best.why:
        assert "nan" not in line and "inf " not in line
    if best.layout.offload_optimizer == "cpu":  # the pick of 3 December 2026: its host RAM is said
        assert any("host RAM per node" in line for line in best.why)


def test_the_llama_3_8b_offload_step_is_the_node_share():
    best = _llama_3_8b_node(offload_optimizer="cpu", dp=8, zero_stage=3).plans[0]
    assert best.layout.offload_optimizer == "cpu"
    shard = best.estimate.model.num_params / 8
    # the host step: ~1e9 parameters a rank x 42 B x 8 ranks over the DGX H100's 400 GB/s, 0.84 s
    host = shard * 42 * 8 / get_gpu("h100-sxm").host_dram_bytes_per_s
    assert 0.8 < host < 0.9
    assert best.estimate.time.comm["offload"] == pytest.approx((4 + 2) * shard / 64e9 + host)
    assert best.estimate.time.comm["offload"] < 0.05 * best.estimate.time.step_seconds
    assert any("host RAM per node" in line for line in best.why)
