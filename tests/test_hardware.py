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
