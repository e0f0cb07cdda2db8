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
    adam = hw.host_optimizer_bytes_per_param(optimizer="adamw", precision="bf16", zero_stage=3)
    assert adam == 8 + 28 + 6
    assert hw.host_optimizer_bytes_per_param(optimizer="lion", precision="bf16", zero_stage=3) == 8 + 20 + 6
    assert hw.host_optimizer_bytes_per_param(optimizer="adamw", precision="fp32", zero_stage=2) == 8 + 28 + 8


def _method(source: str, name: str) -> str:
    """The text of ``def name`` in ``source``, up to the next method."""
    body = source[source.index(f"    def {name}("):]
    return body[:body.index("\n    def ", 10)]


def test_the_unscale_and_the_overflow_check_are_where_deepspeed_runs_them():
    """The DeepSpeed 0.19.8 lines each case of ``host_optimizer_bytes_per_param`` rests on."""
    stage12 = _method(_deepspeed_file("runtime/zero/stage_1_and_2.py"), "unscale_and_clip_grads")
    assert "if self.clip_grad == 0.0 and self.loss_scale == 1.0:\n            return" in stage12
    stage3_source = _deepspeed_file("runtime/zero/stage3.py")
    stage3 = _method(stage3_source, "unscale_and_clip_grads")
    assert "return" not in stage3 and ".grad.mul_(1. / combined_scale)" in stage3
    check = _method(stage3_source, "_overflow_check_and_loss_scale_update")
    assert "if self.dtype == torch.float16:\n            self.check_overflow()" in check
    overflow = _method(stage3_source, "has_overflow")
    assert "torch.isinf(self.grad_partitions_flat_buffer).any()" in overflow
    assert "torch.isnan(self.grad_partitions_flat_buffer).any()" in overflow
    assert "self.device = get_accelerator().current_device_name() if not self.offload_optimizer else " \
           "OffloadDeviceEnum.cpu" in stage3_source  # the flat gradient buffer is on the host
    scaler = _deepspeed_file("runtime/fp16/loss_scaler.py")
    assert "loss_scale_value = static_loss_scale if dtype == torch.half else 1.0" in scaler
    assert re.search(r"^GRADIENT_CLIPPING_DEFAULT = 1\.0$", _deepspeed_file("runtime/constants.py"), re.M)
    assert hw.GRADIENT_CLIPPING_DEFAULT == 1.0
    # ZeRO-1/2 check overflow and take the norm on the GPU gradient, before it is copied down
    copy = _method(_deepspeed_file("runtime/zero/stage_1_and_2.py"), "copy_grads_in_partition")
    assert "self.set_norm_for_param_grad_in_gpu(param)" in copy
    assert "self.update_offload_overflow_tracker_for_param_grad(param)" in copy


def test_torch_checks_overflow_with_the_ops_the_byte_count_assumes():
    """``isinf`` = ``abs`` + ``eq``, ``isnan`` = ``ne`` (12 B a parameter on fp16 gradients)."""
    import torch
    from torch.profiler import profile

    x = torch.ones(64, dtype=torch.float16)
    ops = {}
    for name, fn in (("isinf", torch.isinf), ("isnan", torch.isnan)):
        with profile() as prof:
            fn(x).any()
        ops[name] = {e.key for e in prof.key_averages()}
    assert {"aten::abs", "aten::eq", "aten::any"} <= ops["isinf"]
    assert "aten::ne" in ops["isnan"] and "aten::abs" not in ops["isnan"]
    assert hw.host_overflow_check_bytes_per_param(zero_stage=3, precision="fp16") == (2 + 2) + (2 + 1) + 1 + (2 + 1) + 1


@pytest.mark.parametrize("zero, precision, clip, loss_scale, expected", [
    (3, "bf16", 0.0, 0, 42),    # ZeRO-3 always unscales, even by 1 / 1
    (3, "bf16", 1.0, 0, 42),
    (2, "bf16", 1.0, 0, 42),    # DeepSpeed's default clipping (1.0)
    (2, "bf16", 0.0, 0, 34),    # clipping off, loss scale 1: the unscale returns early
    (1, "bf16", 0.0, 0, 34),
    (2, "fp32", 0.0, 0, 36),
    (2, "fp16", 0.0, 0, 42),    # dynamic loss scale (fp16.loss_scale 0): 2^16, unscaled
    (2, "fp16", 0.0, 128, 42),  # static 128
    (2, "fp16", 0.0, 1, 34),    # static 1 and no clipping: skipped
    (3, "fp16", 1.0, 0, 54),    # + the host overflow check of the fp16 gradient buffer, 12
    (3, "fp16", 0.0, 1, 54),
])
def test_the_host_bytes_of_each_case(zero, precision, clip, loss_scale, expected):
    assert hw.host_optimizer_bytes_per_param(optimizer="adamw", precision=precision, zero_stage=zero,
                                             gradient_clipping=clip, loss_scale=loss_scale) == expected
    # DeepSpeed's and dstk's defaults: clipping 1.0, dynamic loss scale
    default = hw.host_optimizer_bytes_per_param(optimizer="adamw", precision=precision, zero_stage=zero)
    assert default == (54 if (zero, precision) == (3, "fp16") else 44 if precision == "fp32" else 42)


def test_the_estimate_drops_the_unscale_with_clipping_off_under_zero_2_only():
    h100 = get_gpu("h100-sxm")
    cluster = Cluster(num_nodes=1, gpus_per_node=8, gpu=h100)
    model = family_module("llama").read(LLAMA_8B, name="8b")

    def offload(zero, clip):
        est = estimate(model=model, layout=Layout(dp=8, zero_stage=zero, micro_batch=1, grad_accum=1,
                                                  offload_optimizer="cpu"),
                       training=Training(seq_len=4096, global_batch=8, precision="bf16", grad_clip=clip),
                       cluster=cluster)
        return est.time.comm["offload"], est.model.num_params / 8

    (on, shard), (off, _) = offload(2, 1.0), offload(2, 0.0)
    assert on - off == pytest.approx(8 * shard * 8 / h100.host_dram_bytes_per_s, rel=1e-9)
    assert offload(3, 1.0)[0] == offload(3, 0.0)[0]


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
    # the host link: the step's 2 B upload and the last bucket's 6 B (ZeRO-3; tests/test_offload_traffic.py)
    pcie = (2 * shard + (2 + 4) * 5e8 / 8) / h100.host_bytes_per_s
    host = shard * 42 / h100.host_dram_bytes_per_s  # one rank alone on the node
    assert eight == pytest.approx(pcie + 8 * host, rel=1e-9)
    assert four == pytest.approx(pcie + 4 * host, rel=1e-9)
    # an 8B shard over 8 H100 ranks: ~1e9 parameters each, ~0.9 s on a DGX H100's 366 GB/s
    assert 0.8 < eight < 1.1


def test_the_catalog_names_the_dgx_nodes():
    # the published triads, GiB/s as my_stream prints them
    assert get_gpu("a100-80gb").host_dram_bytes_per_s == pytest.approx(206.751 * 2**30)
    # 2 DIMMs a channel (32 x 64 GB, NVIDIA's MLPerf system description): DDR5-4400, not 4800
    assert get_gpu("h100-sxm").host_dram_bytes_per_s == pytest.approx(372.228 * 2**30 * 4400 / 4800)
    assert get_gpu("h200").host_dram_bytes_per_s == get_gpu("h100-sxm").host_dram_bytes_per_s
    assert hw.dram_peak_bytes_per_s(sockets=2, channels_per_socket=8, mega_transfers_per_s=4800) == 614.4e9
    a10 = get_gpu("a10")
    assert a10.host_dram_bytes_per_s is None
    assert Cluster(gpu=a10).host_dram_bytes_per_s == hw.HOST_DRAM_FALLBACK_BYTES_PER_S


@pytest.mark.parametrize("slug, node, gb_per_s", [
    ("v100-32gb", "DGX-1", 2 * 4 * 2133 * 8e6 * 89.076 * 2**30 / 153.6e9),  # 85.0: Broadwell's triad share
    ("b200", "DGX B200", 2 * 8 * 4400 * 8e6 * 372.228 * 2**30 / 614.4e9),    # 366.4: 2 DIMMs a channel
    ("mi250x", "HPE Cray EX235a", 1 * 8 * 3200 * 8e6 * 206.751 * 2**30 / 409.6e9),  # 111.0, one socket
])
def test_the_reference_nodes_added_for_v100_b200_and_mi250x(slug, node, gb_per_s):
    assert get_gpu(slug).host_dram_bytes_per_s == pytest.approx(gb_per_s)
    assert hw.HOST_DRAM_NODES[slug] == node
    note = hw.host_optimizer_note(cluster=Cluster(gpus_per_node=8, gpu=get_gpu(slug)))
    assert note.startswith(f"CPU optimizer step priced at the {node}'s {gb_per_s / 1e9:.0f} GB/s of DRAM")


@pytest.mark.parametrize("slug", ["a10", "l40s", "h100-pcie", "mi300x"])
def test_gpus_sold_in_many_servers_say_their_node_figure_is_assumed(slug):
    gpu = get_gpu(slug)
    assert gpu.host_dram_bytes_per_s is None
    note = hw.host_optimizer_note(cluster=Cluster(gpus_per_node=8, gpu=gpu))
    assert note.startswith("CPU optimizer step priced at an assumed 222 GB/s of node DRAM (a DGX A100's)")
    assert f"gpus.{slug}.host_dram_gbps in a --hardware file" in note


def test_the_note_names_the_thread_oversubscription_and_its_fix(tmp_path):
    source = _deepspeed_file("launcher/launch.py")
    bound = source[source.index("if args.bind_cores_to_rank:"):]
    assert bound.index('current_env["OMP_NUM_THREADS"]') < bound.index("if not args.no_python:")
    assert source.count('"OMP_NUM_THREADS"') == 1  # set nowhere else: a default launch leaves it unset
    runner = (pathlib.Path(importlib.util.find_spec("torch").origin).parent / "distributed/run.py").read_text()
    assert 'if "OMP_NUM_THREADS" not in os.environ and nproc_per_node > 1:\n        omp_num_threads = 1' in runner
    note = hw.host_optimizer_note(cluster=Cluster(gpus_per_node=8, gpu=get_gpu("h100-sxm")))
    assert "leaves OMP_NUM_THREADS unset, so each rank's CPU Adam runs a thread on every core, 8 threads a core" in note
    assert note.endswith("(not priced); fix: dstk launch --env OMP_NUM_THREADS=<physical cores / 8>")
    one = hw.host_optimizer_note(cluster=Cluster(gpus_per_node=1, gpu=get_gpu("h100-sxm")))
    assert "OMP_NUM_THREADS" not in one and "DGX H100" in one
    assert hw.host_optimizer_note(cluster=Cluster(gpus_per_node=2, gpu=get_gpu("cpu"))) is None
    (tmp_path / "hw.yaml").write_text("gpus:\n  h100-sxm: {host_dram_gbps: 100}\n")
    gpus, _ = load_catalog(tmp_path / "hw.yaml")
    assert hw.host_optimizer_note(cluster=Cluster(gpu=gpus["h100-sxm"])).startswith(
        "CPU optimizer step priced at the --hardware file's 100 GB/s of node DRAM")


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


@pytest.mark.parametrize("value, message", [("-5", "gpus.h100-sxm.host_dram_gbps: expected a positive number, got -5"),
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
    # the host step: ~1e9 parameters a rank x 42 B x 8 ranks over the DGX H100's 366 GB/s, 0.92 s
    host = shard * 42 * 8 / get_gpu("h100-sxm").host_dram_bytes_per_s
    assert 0.85 < host < 0.95
    # the host link (tests/test_offload_traffic.py): the step's 2 B upload, and the last bucket's 6 B
    # (at most DeepSpeed's default bucket's share); the 64 micro-batches' copies hide behind backward
    link = best.estimate.time.comm["offload"] - host - 2 * shard / 64e9
    assert 0 < link <= 6 * 5e8 / 8 / 64e9
    assert best.estimate.time.comm["offload"] < 0.05 * best.estimate.time.step_seconds
    assert any("host RAM per node" in line for line in best.why)
    assert any(line.startswith("CPU optimizer step priced at the DGX H100's 366 GB/s") for line in best.why)


def test_a_plan_without_offload_has_no_host_step_line():
    best = _llama_3_8b_node(offload_optimizer="none", dp=8, zero_stage=3).plans[0]
    assert not any("CPU optimizer step" in line for line in best.why)


def test_dstk_estimate_notes_an_assumed_node_figure(capsys):
    from dstk.cli import main

    argv = ["estimate", "--model", "llama-3-8b", "--gpus", "8", "--gpu", "l40s", "--zero", "3",
            "--offload-optimizer", "cpu"]
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())  # the notes wrap
    assert "CPU optimizer step priced at an assumed 222 GB/s of node DRAM (a DGX A100's): no reference node " \
           "for the NVIDIA L40S 48GB; set gpus.l40s.host_dram_gbps in a --hardware file" in out
    assert main(argv[:-2]) == 0  # no offload, no note
    assert "CPU optimizer step" not in capsys.readouterr().out


@pytest.mark.parametrize("clip, priced", [("0", 0.0), ("0.5", 0.5), (None, 1.0), ('"auto"', 1.0)])
def test_dstk_estimate_config_reads_gradient_clipping(tmp_path, capsys, clip, priced):
    """A DeepSpeed file's ``gradient_clipping`` decides ZeRO-2's host unscale: absent is DeepSpeed's
    default, 1.0; 0 drops 8 of the 42 bytes a parameter."""
    from dstk.cli import main

    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
              "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    text = json.dumps(config)
    if clip is not None:
        text = text[:-1] + f', "gradient_clipping": {clip}}}'
    path = tmp_path / "ds.json"
    path.write_text(text)
    assert main(["estimate", "--config", str(path), "--model", "llama-3-8b", "--gpus", "8", "--gpu", "h100-sxm",
                 "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["training"]["grad_clip"] == priced
    shard = out["model"]["num_params"] / 8
    # the host link (tests/test_offload_traffic.py): no overlap_comm (DeepSpeed's ZeRO-2 default), so the
    # fp32 gradient's 4 B run on the compute stream, then the last bucket's and the step's 2 B upload
    pcie = ((4 + 2) * shard + 4 * 5e8 / 8) / get_gpu("h100-sxm").host_bytes_per_s
    per_param = 34 if priced == 0 else 42
    assert out["time"]["comm"]["offload"] == pytest.approx(
        pcie + 8 * shard * per_param / get_gpu("h100-sxm").host_dram_bytes_per_s, rel=1e-6)


def test_the_benchmark_times_each_case_with_the_real_cpu_adam():
    """``benchmarks/cpu_adam.py`` end to end, tiny: the real DeepSpeedCPUAdam in a spawned process
    with ``OMP_NUM_THREADS=1``, one row per case at the bytes ``host_optimizer_bytes_per_param`` gives."""
    import subprocess
    import sys

    script = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "cpu_adam.py"
    run = subprocess.run([sys.executable, str(script), "--params", "2e5", "--procs", "1", "--threads", "1",
                          "--steps", "1"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "bytes per parameter: adam 28, z2 bf16 clip 42, z2 bf16 noclip 34, z3 fp16 54" in run.stdout
    rows = [line.split() for line in run.stdout.splitlines() if line.startswith("    1       1 ")]
    assert [" ".join(r[2:-6]) for r in rows] == ["adam", "z2 bf16 clip", "z2 bf16 noclip", "z3 fp16"]
    assert all(float(r[-3]) > 0 for r in rows)  # the median ratio, predicted / measured


def test_real_deepspeed_unscales_where_the_byte_count_says():
    """DeepSpeed 0.19.8 with the real DeepSpeedCPUAdam, one gloo rank (``tests/unscale_ranks.py``):
    ZeRO-2 in bf16 rescales the CPU gradient partition with clipping on (1.0, and its default) and
    not with 0; ZeRO-3 rescales it with 0 too; in bf16 no overflow check reads a gradient."""
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    from dist import run_ranks

    cases = [{"zero": 2, "precision": "bf16", "clip": 0.0}, {"zero": 2, "precision": "bf16", "clip": 1.0},
             {"zero": 2, "precision": "bf16", "clip": None}, {"zero": 3, "precision": "bf16", "clip": 0.0},
             {"zero": 2, "precision": "fp32", "clip": 0.0}]
    ranks = run_ranks(pathlib.Path(__file__).resolve().parent / "unscale_ranks.py", json.dumps(cases),
                      world_size=1, timeout=500)
    line = next(x for x in ranks[0].output.splitlines() if x.startswith("UNSCALE "))
    seen = json.loads(line[len("UNSCALE "):])
    for case, got in zip(cases, seen):
        clip = hw.GRADIENT_CLIPPING_DEFAULT if case["clip"] is None else case["clip"]
        runs = hw.host_unscale_runs(zero_stage=case["zero"], precision=case["precision"], gradient_clipping=clip)
        assert got["unscale_muls"] == int(runs), (case, got)
        assert got["largest_overflow_check"] <= 1, (case, got)  # scalars (the norm's) only
        assert hw.host_overflow_check_bytes_per_param(zero_stage=case["zero"], precision=case["precision"]) == 0
