"""``dstk doctor --calibrate``: the profile it writes, read back by ``load_catalog`` and ``plan``.

Unit tests build profiles from measurements (no ranks), check the sources each figure is
attributed to, the round trip through the ``--hardware FILE`` loader, and the bad-output paths
(refused before anything is measured, never a half-written file). The ``distributed`` test runs
the real calibration on 2 CPU ranks, plans the tiny Llama with the profile, fine-tunes that
plan and times DeepSpeed's step of it on the same 2 ranks: the predicted step within 2x of the
measured one, the fine-tune's tokens/s of the same order.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dstk import calibrate as cal
from dstk.cli import main
from dstk.errors import DstkError
from dstk.hardware import get_gpu, load_catalog

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "examples" / "intents" / "tiny-llama-cpu.yaml"
CORPUS = ROOT / "templates" / "corpus" / "harbour-notes.txt"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _measured(*, flops=(20e9, 60e9, 150e9, 170e9), dims=(32, 64, 256, 1024), tokens=512, busbw=1.1e9,
              precision="bf16", device="cpu", ranks=2) -> cal.Measurements:
    return cal.Measurements(
        precision=precision, num_ranks=ranks, device=device, backend="gloo" if device == "cpu" else "nccl",
        gemm=tuple(cal.GemmPoint(m=max(tokens, d), n=d, k=d, flops_per_s=f) for d, f in zip(dims, flops)),
        memory_bytes_per_s=10.4e9, op_seconds=7e-6, layer_overhead_seconds=3.5e-3, step_fixed_seconds=5e-3,
        allreduce=(cal.BusPoint(size_bytes=2**18, busbw_bytes_per_s=0.12e9),
                   cal.BusPoint(size_bytes=2**25, busbw_bytes_per_s=busbw)))


def _by_key(profile: cal.Profile) -> dict[str, cal.Figure]:
    return {f.key: f for f in profile.figures}


def test_cpu_profile_takes_its_peak_from_the_sweep_and_says_so():
    profile = cal.build_profile(base=get_gpu("cpu"), measured=_measured())
    gpu, figs = profile.gpu, _by_key(profile)
    assert gpu.bf16_flops == pytest.approx(170e9)
    assert figs["bf16_tflops"].source == "measured" and figs["bf16_tflops"].value == pytest.approx(0.17)
    curve = gpu.gemm_efficiency
    assert [d for d, _ in curve] == [32, 64, 256, 1024]
    assert [f for _, f in curve] == pytest.approx([20 / 170, 60 / 170, 150 / 170, 1.0], abs=1e-3)
    assert gpu.gemm_fraction(64) == pytest.approx(60 / 170, abs=1e-3)
    assert gpu.hbm_bytes_per_s == pytest.approx(10.4e9)
    # 1.1 GB/s of bus bandwidth on the catalog's 2 GB/s link.
    assert gpu.intra_node_bytes_per_s == get_gpu("cpu").intra_node_bytes_per_s
    assert gpu.intra_node_efficiency == pytest.approx(0.55)
    assert gpu.layer_overhead_seconds == pytest.approx(3.5e-3)
    assert {k for k, f in figs.items() if f.source == "measured"} == {
        "bf16_tflops", "gemm_efficiency", "hbm_gbps", "intra_node_efficiency", "layer_overhead_seconds",
        "step_overhead_seconds", "collective_latency_seconds", "host_dram_gbps"}  # the CPU's DRAM, 2 ranks' copy
    assert gpu.host_dram_bytes_per_s == pytest.approx(2 * 10.4e9)
    # 256 KiB took 2^18 / 0.12e9 = 2.185 ms; its bytes at the 32 MiB size's 1.1 GB/s take 0.238 ms.
    assert gpu.collective_latency_seconds == pytest.approx(2.18453e-3 - 0.238313e-3, rel=2e-3)
    assert {"memory_gib", "achievable_fraction", "host_gbps", "fp32_tflops"} <= {
        k for k, f in figs.items() if f.source == "catalog"}
    assert gpu.memory_bytes == get_gpu("cpu").memory_bytes and gpu.fp32_flops == get_gpu("cpu").fp32_flops


def test_bus_bandwidth_above_the_catalog_link_becomes_the_link():
    profile = cal.build_profile(base=get_gpu("cpu"), measured=_measured(busbw=5e9))
    assert profile.gpu.intra_node_bytes_per_s == pytest.approx(5e9)
    assert profile.gpu.intra_node_efficiency == 1.0
    assert _by_key(profile)["intra_node_gbps"].source == "measured"


def test_one_rank_keeps_the_catalog_link():
    m = _measured(ranks=1)
    profile = cal.build_profile(base=get_gpu("cpu"), measured=m)
    assert profile.gpu.intra_node_efficiency == get_gpu("cpu").intra_node_efficiency
    assert _by_key(profile)["intra_node_efficiency"].source == "catalog"


def test_gpu_profile_is_relative_to_the_datasheet_peak():
    h200 = get_gpu("h200")
    peak = h200.bf16_flops
    m = _measured(flops=(0.1 * peak, 0.5 * peak, 0.75 * peak), dims=(256, 1024, 8192), tokens=8192, device="cuda",
                  busbw=360e9, ranks=8)
    profile = cal.build_profile(base=h200, measured=m)
    assert profile.gpu.bf16_flops == peak and "bf16_tflops" not in _by_key(profile)
    assert [f for _, f in profile.gpu.gemm_efficiency] == pytest.approx([0.1, 0.5, 0.75])
    assert profile.gpu.intra_node_efficiency == pytest.approx(360e9 / h200.intra_node_bytes_per_s, abs=1e-3)
    assert not profile.warnings


def test_a_gemm_above_the_catalog_peak_raises_it_with_a_warning():
    a10 = get_gpu("a10")
    m = _measured(flops=(0.5 * a10.bf16_flops, 1.5 * a10.bf16_flops), dims=(1024, 8192), tokens=8192, device="cuda")
    profile = cal.build_profile(base=a10, measured=m)
    assert profile.gpu.bf16_flops == pytest.approx(1.5 * a10.bf16_flops)
    assert max(f for _, f in profile.gpu.gemm_efficiency) == 1.0
    assert profile.warnings and "is --gpu a10 this device?" in profile.warnings[0]


def test_slowest_rank_wins():
    rank = {"gemm": [{"m": 512, "n": 64, "k": 64, "flops_per_s": 5e10}], "memory_bytes_per_s": 9e9,
            "op_seconds": 5e-6, "device": "cpu", "layer_steps": {"1": 8e-3, "5": 20e-3}, "layer_overhead_seconds": 3e-3}
    slow = {**rank, "gemm": [{"m": 512, "n": 64, "k": 64, "flops_per_s": 3e10}], "memory_bytes_per_s": 8e9,
            "op_seconds": 9e-6, "layer_steps": {"1": 9e-3, "5": 25e-3}, "layer_overhead_seconds": 4e-3}
    m = cal.from_rank_reports(measure={"precision": "bf16", "world_size": 2, "backend": "gloo", "ranks": [rank, slow]},
                              allreduce=[{"size_bytes": 4, "busbw_bytes_per_s": 1e9, "correct": True}])
    assert m.gemm[0].flops_per_s == 3e10 and m.memory_bytes_per_s == 8e9 and m.op_seconds == 9e-6
    assert m.layer_overhead_seconds == 4e-3 and m.step_fixed_seconds == pytest.approx(5e-3)
    # Without transformers the ranks report no floor: the catalog's stays.
    bare = {**rank, "layer_steps": None, "layer_overhead_seconds": None}
    m = cal.from_rank_reports(measure={"precision": "bf16", "world_size": 1, "backend": "gloo", "ranks": [bare]},
                              allreduce=[])
    assert m.layer_overhead_seconds is None and m.step_fixed_seconds is None
    profile = cal.build_profile(base=get_gpu("cpu"), measured=m)
    assert profile.gpu.layer_overhead_seconds == get_gpu("cpu").layer_overhead_seconds
    assert _by_key(profile)["layer_overhead_seconds"].source == "catalog"


@pytest.mark.parametrize("median_one, warned", [(36.6e-3, True), (6.5e-3, False)])
def test_a_loaded_measurement_is_said(median_one, warned):
    """One rank of two OpenMP threads beside other load (gpu_check.sh --cpu-smoke here): the fastest
    1-layer step 5.2 ms, the median 36.6 ms. The profile keeps the fastest and says why a run now is slower."""
    rank = {"gemm": [{"m": 512, "n": 64, "k": 64, "flops_per_s": 5e10}], "memory_bytes_per_s": 9e9,
            "op_seconds": 5e-6, "device": "cpu", "threads": 2, "layer_overhead_seconds": 2.9e-3,
            "layer_steps": {"1": 5.2e-3, "5": 17e-3, "floor": 2.9e-3, "median": {"1": median_one, "5": 90e-3}}}
    m = cal.from_rank_reports(measure={"precision": "bf16", "world_size": 1, "backend": "gloo", "ranks": [rank]},
                              allreduce=[])
    assert m.step_spread == pytest.approx(median_one / 5.2e-3) and m.threads == 2
    warnings = cal.build_profile(base=get_gpu("cpu"), measured=m).warnings
    assert bool([w for w in warnings if "other load slowed the measurement" in w and "OMP_NUM_THREADS=1" in w]) == warned


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_written_profile_round_trips_through_the_loader(tmp_path, suffix):
    profile = cal.build_profile(base=get_gpu("cpu"), measured=_measured())
    path = tmp_path / f"hw{suffix}"
    text = cal.render_json(profile) if suffix == ".json" else cal.render_yaml(profile, header=("a test",))
    cal.write_profile(str(path), text)
    gpus, _ = load_catalog(path)
    back = gpus["cpu"]
    assert back.gemm_efficiency == profile.gpu.gemm_efficiency
    for name in ("bf16_flops", "hbm_bytes_per_s", "intra_node_efficiency", "intra_node_bytes_per_s", "memory_bytes",
                 "fp32_flops", "achievable_fraction", "name", "layer_overhead_seconds",
                 "step_overhead_seconds"):
        want = getattr(profile.gpu, name)
        assert getattr(back, name) == (pytest.approx(want, rel=1e-3) if isinstance(want, float) else want), name
    if suffix == ".yaml":
        assert ("# measured: bf16_tflops, gemm_efficiency, hbm_gbps, layer_overhead_seconds, step_overhead_seconds, intra_node_efficiency"
                in path.read_text())
        assert "not written here): memory_gib, achievable_fraction" in path.read_text()


def test_guess_gpu_slug():
    assert cal.guess_gpu_slug("NVIDIA H200", cpu=False) == "h200"
    assert cal.guess_gpu_slug("NVIDIA H100 PCIe", cpu=False) == "h100-pcie"
    assert cal.guess_gpu_slug("NVIDIA H100 80GB HBM3", cpu=False) == "h100-sxm"
    assert cal.guess_gpu_slug("NVIDIA A100-SXM4-40GB", cpu=False) == "a100-40gb"
    assert cal.guess_gpu_slug("NVIDIA A10", cpu=False) == "a10"
    assert cal.guess_gpu_slug("Mystery 9000", cpu=False) is None
    assert cal.guess_gpu_slug(None, cpu=True) == "cpu"


def test_measure_rank_on_this_cpu():
    """The rank script's measurements, in-process on the CPU (what each launched rank runs)."""
    import torch

    from dstk.launch.measure import measure_rank

    out = measure_rank(device=torch.device("cpu"), precision="bf16", dims=[32, 128], tokens=256,
                       copy_bytes=8 * 2**20, warmup=1, min_seconds=0.02)
    assert [(g["m"], g["n"], g["k"]) for g in out["gemm"]] == [(256, 32, 32), (256, 128, 128)]
    for g in out["gemm"]:  # forward, input and weight gradients: 3 GEMMs of 2 m n k FLOPs
        assert g["flops_per_s"] == pytest.approx(6 * g["m"] * g["n"] * g["k"] / g["seconds"])
        assert 1e7 < g["flops_per_s"] < 1e14
    assert out["copy_bytes_moved"] == 2 * 8 * 2**20 and 1e8 < out["memory_bytes_per_s"] < 1e13
    # Sanity bounds only: the figures are timings, and a loaded CI machine reorders close ones
    # (5 layers measured faster than 1 under a load average of 15).
    assert 0 < out["op_seconds"] < 0.05
    steps = out["layer_steps"]
    assert steps["1"] > 0 and steps["5"] > 0 and out["layer_overhead_seconds"] == steps["floor"] >= 0


class _LoadedHost:
    """A simulated clock on a shared host: each fn costs its own seconds per call, 300x inside a
    burst of load from other processes (``start``..``end`` seconds), as a bf16 512 x 32 x 32 GEMM
    took 6.9 ms instead of 22 us with two OpenMP threads while another process held a core."""

    def __init__(self, *, start: float, end: float, factor: float = 300.0):
        self.now, self.start, self.end, self.factor = 0.0, start, end, factor

    def timer(self, fn, n: int) -> float:
        t0 = self.now
        for _ in range(n):
            self.now += fn.cost * (self.factor if self.start <= self.now < self.end else 1.0)
        return self.now - t0


def _op(cost: float):
    fn = lambda: None  # noqa: E731
    fn.cost = cost
    return fn


def test_a_burst_of_load_does_not_sink_one_gemm_of_the_sweep():
    """The sweep's shapes timed in interleaved rounds, each its fastest: a burst that outlasts one
    shape's batches leaves its figure alone. Timed back to back (the median of 5 batches of one
    shape, then the next), the shape under the burst came out 300x slow: the curve then priced
    every small GEMM at 0.3% of the peak, and the calibrated plan ~100x too slow."""
    from dstk.launch.measure import time_call, time_interleaved

    costs = (20e-6, 50e-6, 600e-6)  # the d = 32, 128, 512 GEMMs
    # A 30 ms burst from the start: back to back, it holds every batch of the first shape.
    host = _LoadedHost(start=0.0, end=30e-3)
    back_to_back = [time_call(_op(c), timer=host.timer, warmup=2, min_seconds=0.01) for c in costs]
    assert back_to_back[0] / costs[0] > 100 and back_to_back[1:] == pytest.approx(costs[1:])
    host = _LoadedHost(start=0.0, end=30e-3)
    seconds = time_interleaved([_op(c) for c in costs], timer=host.timer, warmup=2, min_seconds=0.01)
    assert seconds == pytest.approx(costs, rel=1e-6)
    # A burst in the middle of the rounds hits one round of each shape: the others are faster.
    host = _LoadedHost(start=0.0, end=0.0)
    time_interleaved([_op(c) for c in costs], timer=host.timer, warmup=2, min_seconds=0.01)
    total = host.now
    host = _LoadedHost(start=0.6 * total, end=0.6 * total + 5e-3)
    seconds = time_interleaved([_op(c) for c in costs], timer=host.timer, warmup=2, min_seconds=0.01)
    assert seconds == pytest.approx(costs, rel=1e-6)
    # A burst over the whole sweep is the machine's speed now: every figure shows it.
    host = _LoadedHost(start=0.0, end=1e9, factor=3.0)
    assert time_interleaved([_op(c) for c in costs], timer=host.timer, warmup=1, min_seconds=0.01) == pytest.approx(
        [3 * c for c in costs])


def test_step_overhead_is_what_the_time_model_leaves_of_the_measured_step():
    """The profile prices the floor's own 1-layer step as the ranks measured it: the step's fixed
    cost excludes the head, the optimizer and the gradient all-reduce, which every plan prices."""
    m = _measured()
    profile = cal.build_profile(base=get_gpu("cpu"), measured=m)
    one = m.step_fixed_seconds + m.layer_overhead_seconds
    priced = cal.priced_floor_step_seconds(gpu=profile.gpu, num_ranks=2, precision="bf16")
    assert priced == pytest.approx(one, rel=2e-3)
    assert 0 < profile.gpu.step_overhead_seconds < m.step_fixed_seconds
    assert "less what the time model prices" in _by_key(profile)["step_overhead_seconds"].note


def test_time_call_measures_seconds_per_call():
    from dstk.launch.measure import time_call

    def timer(fn, n):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return time.perf_counter() - t0

    seconds = time_call(lambda: time.sleep(0.002), timer=timer, warmup=1, min_seconds=0.05)
    assert 0.0019 < seconds < 0.05


# --- bad outputs: refused before anything runs, never a half-written file --------------------

@pytest.mark.parametrize("make, expect", [
    (lambda tmp: tmp, "is a directory"),
    (lambda tmp: tmp / "missing" / "hw.yaml", "does not exist"),
    (lambda tmp: (tmp / "file").write_text("x") and tmp / "file" / "hw.yaml", "does not exist"),
    (lambda tmp: tmp / "hw.txt", "must end in .yaml"),
])
def test_bad_output_is_refused_before_measuring(tmp_path, capsys, make, expect):
    path = make(tmp_path)
    t0 = time.perf_counter()
    rc = main(["doctor", "--calibrate", "--output", str(path)])
    err = capsys.readouterr().err
    assert rc == 1 and expect in err and "fix:" in err
    assert time.perf_counter() - t0 < 5  # no ranks were started
    assert not list(tmp_path.glob("**/*.yaml"))


def test_unknown_gpu_and_remote_hosts_are_refused(tmp_path, capsys):
    assert main(["doctor", "--calibrate", "--gpu", "h2000", "--output", str(tmp_path / "hw.yaml")]) == 1
    assert "did you mean h200" in capsys.readouterr().err
    assert main(["doctor", "--calibrate", "--hosts", "a:1,b:1"]) == 2
    assert "measures this machine" in capsys.readouterr().err
    assert main(["doctor", "--output", str(tmp_path / "hw.yaml")]) == 2
    assert "--output belongs to --calibrate" in capsys.readouterr().err


def test_write_failure_leaves_the_old_file_and_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "hw.yaml"
    path.write_text("gpus: {}\n")

    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(DstkError, match="No space left on device"):
        cal.write_profile(str(path), "gpus:\n  cpu: {base: cpu}\n")
    assert path.read_text() == "gpus: {}\n"
    assert [p.name for p in tmp_path.iterdir()] == ["hw.yaml"]


# --- the real calibration on 2 CPU ranks ------------------------------------------------------

def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "dstk", *args], capture_output=True, text=True, env=ENV,
                          timeout=timeout)
    return proc


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory) -> dict:
    """One real calibration on 2 CPU ranks, the tiny plan generated with it, and that plan
    fine-tuned on the same 2 ranks (the measurement the prediction is compared with)."""
    tmp = tmp_path_factory.mktemp("calibrate")
    hw = tmp / "hardware.yaml"
    t0 = time.perf_counter()
    proc = _run("doctor", "--calibrate", "--quick", "--num-ranks", "2", "--output", str(hw), "--format", "json")
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir, out = tmp / "run", tmp / "ft"
    gen = _run("generate", str(TINY), "--hardware", str(hw), "--output", str(run_dir))
    assert gen.returncode == 0, gen.stderr
    ft = _run("finetune", "--plan", str(run_dir), "--data", str(CORPUS), "--output", str(out), "--steps", "30")
    assert ft.returncode == 0, ft.stdout[-3000:] + ft.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    bench = importlib.util.spec_from_file_location("calibrate_tiny", ROOT / "benchmarks" / "calibrate_tiny.py")
    module = importlib.util.module_from_spec(bench)
    bench.loader.exec_module(module)
    step = module.measure_step(ft_dir=out, steps=12, timeout=300)
    plan_time = json.loads((run_dir / "plan.json").read_text())["time"]
    return {"hw": hw, "report": json.loads(proc.stdout), "seconds": seconds,
            "predicted": plan_time["tokens_per_second"], "predicted_step": plan_time["step_seconds"],
            "measured": summary["tokens"] / summary["seconds"], "step": step}


@pytest.mark.distributed
def test_calibrate_on_two_cpu_ranks_writes_a_profile_plan_reads(calibrated):
    hw, report = calibrated["hw"], calibrated["report"]
    assert report["ok"] and report["output"] == str(hw)
    assert calibrated["seconds"] < 120
    gpu = load_catalog(hw)[0]["cpu"]
    # Plausible: positive figures, fractions in (0, 1], the curve sorted, the best GEMM = 1.
    dims = [d for d, _ in gpu.gemm_efficiency]
    assert dims == sorted(dims) == [32, 128, 512]
    assert all(0 < f <= 1 for _, f in gpu.gemm_efficiency) and max(f for _, f in gpu.gemm_efficiency) == 1.0
    assert 1e9 < gpu.bf16_flops < 1e14
    assert 1e8 < gpu.hbm_bytes_per_s < 1e13
    assert 0 < gpu.intra_node_efficiency <= 1 and gpu.intra_node_bytes_per_s > 0
    assert 1e-5 < gpu.layer_overhead_seconds < 1.0
    sources = {f["key"]: f["source"] for f in report["profile"]["figures"]}
    assert sources["gemm_efficiency"] == sources["hbm_gbps"] == sources["bf16_tflops"] == "measured"
    assert sources["layer_overhead_seconds"] == sources["intra_node_efficiency"] == "measured"
    assert sources["step_overhead_seconds"] == "measured"
    assert sources["memory_gib"] == "catalog"
    text = hw.read_text()
    assert "# measured: bf16_tflops, gemm_efficiency, hbm_gbps" in text and "base: cpu" in text

    plan = json.loads(_run("plan", str(TINY), "--hardware", str(hw), "--format", "json").stdout)
    default = json.loads(_run("plan", str(TINY), "--format", "json").stdout)
    assert plan["plans"][0]["time"]["tokens_per_second"] != default["plans"][0]["time"]["tokens_per_second"]


@pytest.mark.distributed
def test_calibrate_measures_zero_host_work_and_the_zero3_plan_prices_it(calibrated, tmp_path):
    """ZeRO's host work per tensor, measured on the 2 ranks (``dstk.launch.zero_cost``; the catalog's
    cpu entry: 0.05 / 0.6 ms from ``benchmarks/zero_dp1_cost.py --one-rank``), within a sane range,
    and the ZeRO-3 plan's step moves with the figure the profile holds."""
    hw, report = calibrated["hw"], calibrated["report"]
    figures = {f["key"]: f for f in report["profile"]["figures"]}
    assert figures["zero_tensor_seconds"]["source"] == figures["zero3_tensor_seconds"]["source"] == "measured"
    steps = report["profile"]["measurements"]["zero_steps"]
    assert sorted((s["zero_stage"], s["num_layers"]) for s in steps) == [(0, 1), (0, 3), (1, 1), (1, 3), (3, 1), (3, 3)]
    assert all(1e-4 < s["seconds"] < 5.0 for s in steps)
    print(f"\nZeRO steps measured in {report['profile']['measurements']['zero_wall_seconds']:.1f} s: "
          + ", ".join(f"Z{s['zero_stage']} {s['num_layers']}L {s['seconds'] * 1e3:.1f} ms" for s in steps))
    gpu = load_catalog(hw)[0]["cpu"]
    print(f"zero_tensor_seconds {gpu.zero_tensor_seconds * 1e3:.3f} ms, zero3 {gpu.zero3_tensor_seconds * 1e3:.3f} ms")
    # What the time model leaves of ZeRO's step once its collectives are priced with the profile's
    # latency: ZeRO-3 0-2.4 ms a tensor, ZeRO-1 0-1.1 ms over nine calibrations at load 1-6 (0 where
    # load inflated the measured latency, so that the collectives alone priced more than the steps
    # took; the most under the heaviest load, where each collective waits for the slower rank).
    assert 0 <= gpu.zero_tensor_seconds < 5e-3 and 0 <= gpu.zero3_tensor_seconds < 1e-2
    assert gpu.zero3_tensor_seconds == figures["zero3_tensor_seconds"]["value"]
    if gpu.zero3_tensor_seconds == 0:
        assert any("zero3_tensor_seconds: ZeRO-3 added no more" in w for w in report["profile"]["warnings"])
    text = hw.read_text()
    key = f"zero3_tensor_seconds: {json.dumps(figures['zero3_tensor_seconds']['value'])}"
    assert key in text
    more = tmp_path / "more.yaml"
    more.write_text(text.replace(key, f"zero3_tensor_seconds: {gpu.zero3_tensor_seconds + 1e-3}"))
    # The layout pinned (recompute too): where the measured profile leaves full recompute and none within the
    # planner's tie, it prefers full's headroom, and 1 ms a tensor more, which full pays on more gathers, tips
    # the pick to none; the step must move with the figure in one layout.
    plans = [json.loads(_run("plan", str(TINY), "--zero", "3", "--recompute", "none", "--hardware", str(p),
                             "--format", "json").stdout)["plans"][0] for p in (hw, more)]
    assert plans[0]["layout"] == plans[1]["layout"] and plans[0]["layout"]["zero_stage"] == 3
    moved = plans[1]["time"]["step_seconds"] - plans[0]["time"]["step_seconds"]
    # 1 ms more a tensor: the tiny Llama's 21 parameter tensors, each micro-batch.
    assert moved == pytest.approx(21 * plans[0]["layout"]["grad_accum"] * 1e-3, rel=1e-3)


@pytest.mark.distributed
def test_calibrated_tiny_plan_predicts_the_engine_step_within_2x(calibrated):
    """The plan's step time with the profile against DeepSpeed's step of that plan (the fine-tune's
    model and config, forward + backward + step) on the same 2 ranks, timed right after: between
    half the fastest step and twice the median one (the suite runs under load: the median step is
    up to 2-3x the fastest here). Before the fix the calibrated plan was ~100x slow where a burst
    of load sank one GEMM of the sweep, and ~2x fast where the layer floor was measured at hidden
    32 and 32 tokens."""
    predicted, step = calibrated["predicted_step"], calibrated["step"]
    print(f"\ntiny plan predicted {predicted * 1e3:.1f} ms a step; DeepSpeed's step measured "
          f"{step['median_seconds'] * 1e3:.1f} ms median, {step['best_seconds'] * 1e3:.1f} ms fastest")
    assert step["best_seconds"] / 2 < predicted < 2 * step["median_seconds"], (predicted, step)


@pytest.mark.distributed
def test_calibrated_tiny_plan_predicts_the_measured_tokens_per_second_within_5x(calibrated):
    """The plan made with the profile against the fine-tune of that plan on the same 2 ranks."""
    predicted, measured = calibrated["predicted"], calibrated["measured"]
    print(f"\ncalibrate {calibrated['seconds']:.1f} s; tiny plan predicted {predicted:,.0f} tokens/s, "
          f"fine-tune measured {measured:,.0f}")
    # The fine-tune's tokens/s also holds its first steps' warm-up and its own per-step work (loss
    # all-reduce, progress record, CSV): 0.8-2.7x the engine's step here, so the loose bound.
    assert 0.2 < predicted / measured < 5, (predicted, measured)


@pytest.mark.gpu
def test_calibrate_on_one_gpu(tmp_path):
    """On a CUDA machine: the same command, one rank over NCCL; the curve is relative to the
    catalog's datasheet peak of the GPU the device name maps to."""
    hw = tmp_path / "hardware.yaml"
    proc = _run("doctor", "--calibrate", "--quick", "--num-ranks", "1", "--output", str(hw), "--format", "json",
                timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    slug = report["profile"]["slug"]
    gpu, base = load_catalog(hw)[0][slug], get_gpu(slug)
    print(f"\n{slug}: {gpu.gemm_efficiency}, hbm {gpu.hbm_bytes_per_s / 1e9:.0f} GB/s, "
          f"layer floor {gpu.layer_overhead_seconds * 1e3:.2f} ms; warnings {report['profile']['warnings']}")
    assert all(0 < f <= 1 for _, f in gpu.gemm_efficiency)
    assert gpu.gemm_fraction(8192) > gpu.gemm_fraction(512) > 0.05
    assert 1e11 < gpu.hbm_bytes_per_s < 2e13
    assert gpu.bf16_flops >= base.bf16_flops  # the datasheet peak, or raised with a warning


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_hand_written_hardware_file_is_not_overwritten_without_force(tmp_path, capsys, suffix):
    mine = tmp_path / f"mine{suffix}"
    mine.write_text('{"gpus": {"my-gpu": {"base": "a100-80gb", "memory_gib": 64}}}\n' if suffix == ".json"
                    else "gpus:\n  my-gpu: {base: a100-80gb, memory_gib: 64}\n")
    assert main(["doctor", "--calibrate", "--output", str(mine)]) == 1
    assert "--force" in capsys.readouterr().err
    assert "my-gpu" in mine.read_text()
    # One this command wrote may be replaced: that is what re-calibrating does.
    profile = cal.build_profile(base=get_gpu("cpu"), measured=_measured())
    text = cal.render_json(profile) if suffix == ".json" else cal.render_yaml(profile, header=(f"{cal.HEADER}: x",))
    cal.write_profile(str(mine), text)
    assert cal.written_by_calibrate(str(mine))
    cal.check_output_path(str(mine))
    cal.check_output_path(str(tmp_path / f"new{suffix}"))
