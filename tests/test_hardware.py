"""The hardware catalog and user overrides."""

from __future__ import annotations

import json

import pytest

from dstk.errors import DstkError
from dstk.hardware import GPUS, INTERCONNECTS, Cluster, get_gpu, get_interconnect, load_catalog

REQUIRED = ("v100-32gb", "a10", "l40s", "a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "b200",
            "mi250x", "mi300x", "cpu")


def test_catalog_has_the_issue_gpus_and_networks():
    assert set(REQUIRED) <= set(GPUS)
    assert {"ib-hdr", "ib-ndr", "roce-400", "eth-100g"} <= set(INTERCONNECTS)
    h100 = get_gpu("H100-SXM")
    assert h100.peak_flops("bf16") == 989e12 and h100.peak_flops("fp32") == 67e12
    assert get_gpu("v100-32gb").bf16_flops is None  # no bf16 tensor cores
    assert get_gpu("a100-80gb").memory_bytes == 80 * 2**30


def test_unknown_slug_suggests_near_ones():
    with pytest.raises(DstkError) as err:
        get_gpu("h100")
    assert "h100-sxm" in err.value.hint
    with pytest.raises(DstkError):
        get_interconnect("infiniband")


def test_user_file_changes_and_adds_entries(tmp_path):
    path = tmp_path / "hw.yaml"
    path.write_text("gpus:\n  h100-sxm: {achievable_fraction: 0.3}\n  my-gpu: {base: a100-80gb, memory_gib: 64}\n"
                    "interconnects:\n  slow: {name: slow, node_gbps: 10}\n")
    gpus, nets = load_catalog(path)
    assert gpus["h100-sxm"].achievable_fraction == 0.3 and gpus["h100-sxm"].memory_bytes == GPUS["h100-sxm"].memory_bytes
    assert gpus["my-gpu"].memory_bytes == 64 * 2**30 and gpus["my-gpu"].bf16_flops == GPUS["a100-80gb"].bf16_flops
    assert nets["slow"].node_bytes_per_s == 10e9
    assert GPUS["h100-sxm"].achievable_fraction != 0.3  # the built-in catalog is untouched
    (tmp_path / "hw.json").write_text(json.dumps({"gpus": {"h200": {"memory_gib": 100}}}))
    assert load_catalog(tmp_path / "hw.json")[0]["h200"].memory_bytes == 100 * 2**30


@pytest.mark.parametrize("text,match", [
    ("gpus:\n  h100-sxm: {memry_gib: 3}\n", "unknown field"),
    ("gpus:\n  new-gpu: {memory_gib: 3}\n", "new-gpu"),
    ("gpus:\n  h100-sxm: {achievable_fraction: 2}\n", "fraction"),
    ("gpu: {}\n", "top-level"),
    # a quoted number is refused before any arithmetic ("8" * GiB would be a 3 GB string)
    ("gpus:\n  cpu: {memory_gib: '8'}\n", "gpus.cpu.memory_gib: expected a number"),
    ("gpus:\n  cpu: {zero3_tensor_seconds: abc}\n", "gpus.cpu.zero3_tensor_seconds: expected a number"),
    ("gpus:\n  new-gpu: {memory_gib: 3}\n", "needs bf16_tflops, fp16_tflops"),
])
def test_bad_user_file(tmp_path, text, match):
    path = tmp_path / "hw.yaml"
    path.write_text(text)
    with pytest.raises(DstkError, match=match):
        load_catalog(path)


def test_cluster_checks():
    gpu = get_gpu("a100-80gb")
    assert Cluster(num_nodes=2, gpus_per_node=8, gpu=gpu, interconnect=get_interconnect("ib-hdr")).world_size == 16
    with pytest.raises(ValueError, match="interconnect"):
        Cluster(num_nodes=2, gpus_per_node=8, gpu=gpu)
    with pytest.raises(ValueError, match="gpus_per_node"):
        Cluster(num_nodes=1, gpus_per_node=0, gpu=gpu)


def test_gemm_curves_and_hbm_in_the_catalog():
    """Every entry has a sustained HBM bandwidth and a GEMM curve that rises with the GEMM's
    smallest dimension towards the measured MAMF share (A100 SXM 85.9%, H100 SXM 80.1%)."""
    for gpu in GPUS.values():
        assert gpu.hbm_bytes_per_s and gpu.gemm_efficiency, gpu.slug
        fractions = [f for _, f in gpu.gemm_efficiency]
        assert fractions == sorted(fractions) and fractions[-1] <= 1
        assert gpu.gemm_fraction(128) < gpu.gemm_fraction(1024) <= gpu.gemm_fraction(8192)
    assert get_gpu("a100-80gb").gemm_fraction(1e6) == pytest.approx(0.859, abs=0.02)
    assert get_gpu("h100-sxm").gemm_fraction(1e6) == pytest.approx(0.801, abs=0.02)
    assert get_gpu("h100-sxm").hbm_bytes_per_s == pytest.approx(3350e9 * 0.9)


def test_roofline_curve_is_half_the_asymptote_at_the_knee():
    from dstk.hardware import roofline_curve

    knee = 0.8 * 1000e12 / (2000e9 * 0.9)
    curve = dict(roofline_curve(peak_tflops=1000, hbm_gbps=2000, mamf=0.8, dims=(knee, 1e9)))
    assert curve[knee] == pytest.approx(0.4, abs=1e-3) and curve[1e9] == pytest.approx(0.8, abs=1e-3)


def test_gemm_fraction_reads_log_linearly():
    gpu = get_gpu("a100-80gb").replace(gemm_efficiency=((100, 0.2), (10000, 0.8)))
    assert gpu.gemm_fraction(1000) == pytest.approx(0.5)
    assert gpu.gemm_fraction(10) == 0.2 and gpu.gemm_fraction(1e6) == 0.8


def test_user_file_sets_the_time_model_fields(tmp_path):
    path = tmp_path / "hw.yaml"
    path.write_text("gpus:\n  h100-sxm: {hbm_gbps: 3000, gemm_efficiency: [[256, 0.5], [4096, 0.75]],"
                    " layer_overhead_seconds: 0.001}\n")
    gpu = load_catalog(path)[0]["h100-sxm"]
    assert gpu.hbm_bytes_per_s == 3000e9 and gpu.gemm_fraction(4096) == 0.75 and gpu.layer_overhead_seconds == 0.001
    path.write_text("gpus:\n  h100-sxm: {gemm_efficiency: [[4096, 0.5], [256, 0.75]]}\n")
    with pytest.raises(DstkError, match="gemm_efficiency"):
        load_catalog(path)
