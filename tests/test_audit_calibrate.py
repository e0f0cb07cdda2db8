"""An outside user's audit of the calibration path (issue 11, "Calibrate from measured hardware"):
``dstk doctor --calibrate``, the profile it writes, that profile edited by hand, and
``plan``/``estimate``/``generate``/``gpus --hardware PROFILE``. Each test is a defect found by
using them and fails on the code before its fix; the last one runs the real calibration on 2 CPU
ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dstk import __version__
from dstk import calibrate as cal
from dstk.cli import main
from dstk.hardware import Cluster, get_gpu, load_catalog

ROOT = Path(__file__).resolve().parents[1]
GPT2 = ["--model", "gpt2", "--gpus", "2", "--seq-len", "1024"]
PROFILE = ("# dstk hardware profile: `dstk doctor --calibrate` on box7, 2026-12-01 10:00 UTC (dstk {version})\n"
           "gpus:\n  cpu:\n    base: cpu\n    name: \"CPU rank (gloo), calibrated\"\n    hbm_gbps: 20\n"
           "    bf16_tflops: 0.43\n{extra}")


def _run(capsys, argv):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def _profile(tmp_path, *, version: str = __version__, extra: str = "") -> Path:
    path = tmp_path / "hw.yaml"
    path.write_text(PROFILE.format(version=version, extra=extra))
    return path


@pytest.mark.parametrize("text, said, fix", [
    # -5 GiB was reported as "memory_bytes ... got -5368709120", with no fix
    ("gpus:\n  h100-sxm: {memory_gib: -5}\n",
     ":2: gpus.h100-sxm.memory_gib: expected a positive number, got -5", "fix: e.g. memory_gib: 79.6"),
    ("gpus:\n  h100-sxm: {memry_gib: 70}\n", ":2: gpus.h100-sxm.memry_gib: unknown field", "did you mean memory_gib"),
    ("gpus:\n  mine: {base: h100, memory_gib: 40}\n", ":2: gpus.mine.base: unknown GPU 'h100'",
     "did you mean h100-sxm or h100-pcie"),
    ("gpus:\n  h100: {memory_gib: 40}\n", ":2: gpus.h100: a new entry needs", "did you mean h100-sxm or h100-pcie"),
    # the field's own line, not the entry's
    ("gpus:\n  h100-sxm:\n    hbm_gbps: fast\n", ":3: gpus.h100-sxm.hbm_gbps: expected a number, got 'fast'",
     "fix: write a bare number, e.g. hbm_gbps: 3015"),
    # a bare number for a curve was an internal error (exit 3, "a bug in dstk")
    ("gpus:\n  h100-sxm:\n    gemm_efficiency: 0.5\n", ":3: gpus.h100-sxm.gemm_efficiency: expected [dim, fraction]",
     "fix: e.g. gemm_efficiency: [[16, "),
    ("gpus:\n  h100-sxm:\n    name: 5\n", ":3: gpus.h100-sxm.name: expected text, got 5", 'fix: quote it: name: "5"'),
    ("gpu:\n  h100-sxm: {}\n", ":1: unknown top-level key 'gpu'", "fix: did you mean gpus?"),
    ("", ": empty: expected top-level keys gpus and/or interconnects", "fix: give a YAML or JSON file"),
    ("cpu:\n  hbm_gbps: 20\n", ":1: unknown top-level key 'cpu'", "fix: an entry goes under gpus: or interconnects: "
     "(gpus: then cpu: indented below it)"),
])
def test_a_hand_edited_hardware_file_is_refused_once_in_its_own_words(tmp_path, capsys, text, said, fix):
    """The file named once (it was "hw.yaml: hw.yaml: expected top-level keys"), the field's line,
    the value in the units the file gives it, a did-you-mean for a misspelt key or slug; exit 1."""
    path = tmp_path / "hw.yaml"
    path.write_text(text)
    for command in ("plan", "estimate"):
        code, _, err = _run(capsys, [command, "--model", "gpt2", "--gpus", "8", "--gpu", "h100-sxm",
                                     "--hardware", str(path)])
        assert code == 1, err
        assert f"error: {path}{said}" in err and fix in err, err
        assert err.count(str(path)) == 1 and "internal error" not in err and "5368709120" not in err, err


def test_a_missing_hardware_file_is_a_usage_error_as_a_missing_intent(tmp_path, capsys):
    missing = str(tmp_path / "nope.yaml")
    for command in ("plan", "estimate"):
        code, _, err = _run(capsys, [command, *GPT2, "--hardware", missing])
        assert code == 2 and f"{missing}: no such hardware file" in err, err
        assert f"dstk doctor --calibrate --output {missing}" in err
    assert _run(capsys, ["plan", str(tmp_path / "nope-intent.yaml")])[0] == 2


def test_a_profile_from_another_dstk_release_says_so(tmp_path, capsys):
    """A field this dstk does not know, in a profile another release wrote, was only "unknown field"."""
    path = _profile(tmp_path, version="0.0.1", extra="    zero4_tensor_seconds: 0.001\n")
    code, _, err = _run(capsys, ["plan", *GPT2, "--hardware", str(path)])
    assert code == 1 and "gpus.cpu.zero4_tensor_seconds: unknown field" in err
    assert f"written by dstk 0.0.1 and this is dstk {__version__}: recalibrate with `dstk doctor --calibrate`" in err
    path = _profile(tmp_path, extra="    zero4_tensor_seconds: 0.001\n")  # this release's: a typo, not a version
    code, _, err = _run(capsys, ["plan", *GPT2, "--hardware", str(path)])
    assert code == 1 and "written by dstk" not in err
    assert "did you mean zero_tensor_seconds or zero3_tensor_seconds" in err


def test_the_profile_is_used_without_gpu_and_an_unused_one_is_said(tmp_path, capsys):
    """The profile's header says `dstk plan INTENT --hardware hw.yaml`; without --gpu that planned
    for the catalog's H100 and silently ignored the measured CPU figures."""
    path = _profile(tmp_path)
    code, out, err = _run(capsys, ["estimate", *GPT2, "--hardware", str(path), "--format", "json"])
    assert code == 0 and not err
    assert json.loads(out)["cluster"]["gpu"] == "cpu"
    run = tmp_path / "run"
    assert _run(capsys, ["generate", *GPT2, "--hardware", str(path), "--output", str(run)])[0] == 0
    assert json.loads((run / "plan.json").read_text())["cluster"]["gpu"] == "cpu"
    for command in ("plan", "estimate"):  # another GPU named: the catalog's figures, said
        code, _, err = _run(capsys, [command, *GPT2, "--gpu", "a100-80gb", "--hardware", str(path)])
        assert code == 0
        assert (f"warning: --hardware {path} describes cpu, not a100-80gb: the catalog's a100-80gb figures are "
                "used; give --gpu cpu to use the file's") in err, err
    code, _, err = _run(capsys, ["plan", *GPT2, "--gpu", "cpu", "--hardware", str(path)])
    assert code == 0 and "warning" not in err


def test_generate_records_the_profile_and_estimate_asks_for_it(tmp_path, capsys):
    """plan.json and the README did not say that a --hardware file priced the plan, so an estimate of
    the run directory's ds_config.json priced it with the catalog's figures and said nothing."""
    path = _profile(tmp_path)
    run = tmp_path / "run"
    assert _run(capsys, ["generate", *GPT2, "--hardware", str(path), "--output", str(run)])[0] == 0
    plan = json.loads((run / "plan.json").read_text())
    record = plan["cluster"]["hardware"]
    assert record["file"] == str(path) and record["gpu"] == "cpu"
    assert record["profile"].startswith("dstk hardware profile: `dstk doctor --calibrate` on box7")
    assert record["gpu_fields"]["hbm_gbps"] == 20 and record["gpu_fields"]["bf16_tflops"] == 0.43
    assert [w for w in plan["why"] if w.startswith("GPU: cpu (CPU rank (gloo), calibrated) with the figures of "
                                                     f"--hardware {path} (`dstk doctor --calibrate` on box7")]
    readme = (run / "README.md").read_text()
    assert f"Hardware figures from `{path}`" in readme and "hbm_gbps" in readme
    config = str(run / "ds_config.json")
    code, out, _ = _run(capsys, ["estimate", "--config", config, *GPT2, "--format", "json"])
    notes = [n for n in json.loads(out)["notes"] if "plan.json" in n]
    assert code == 0 and notes and f"--gpu cpu --hardware {path}" in notes[0], notes
    code, out, _ = _run(capsys, ["estimate", "--config", config, *GPT2, "--gpu", "cpu", "--hardware", str(path),
                                 "--format", "json"])
    est = json.loads(out)
    assert code == 0 and not [n for n in est["notes"] if "plan.json" in n]
    assert est["time"]["step_seconds"] == plan["time"]["step_seconds"]
    # without a file: no record, no README line
    plain = tmp_path / "plain"
    assert _run(capsys, ["generate", *GPT2, "--gpu", "cpu", "--output", str(plain)])[0] == 0
    assert json.loads((plain / "plan.json").read_text())["cluster"]["hardware"] is None
    assert "Hardware figures" not in (plain / "README.md").read_text()


@pytest.mark.parametrize("flags", [["--tp", "3"], ["--zero", "3", "--pp", "2"], ["--gpus-per-node", "3"]])
def test_the_same_bad_value_exits_the_same_in_every_fast_command(tmp_path, capsys, flags):
    """`dstk estimate --tp 3` on 8 GPUs exited 2 where `dstk plan` exited 1 (README, "Exit codes")."""
    base = ["--model", "llama-3-8b", "--gpus", "8", "--gpu", "h100-sxm", *flags]
    codes = {command: _run(capsys, [command, *base, *(["--output", str(tmp_path / "g")] if command == "generate"
                                                      else [])])[0]
             for command in ("estimate", "plan", "generate")}
    assert codes == {"estimate": 1, "plan": 1, "generate": 1}


def _cpu_measured(ranks: int = 2) -> cal.Measurements:
    return cal.Measurements(
        precision="bf16", num_ranks=ranks, device="cpu", backend="gloo",
        gemm=tuple(cal.GemmPoint(m=512, n=d, k=d, flops_per_s=f) for d, f in ((64, 60e9), (256, 150e9))),
        memory_bytes_per_s=10.4e9, op_seconds=7e-6, layer_overhead_seconds=3.5e-3, step_fixed_seconds=5e-3,
        allreduce=(cal.BusPoint(size_bytes=2**18, busbw_bytes_per_s=0.12e9),
                   cal.BusPoint(size_bytes=2**25, busbw_bytes_per_s=1.1e9)))


def test_a_cpu_profile_measures_the_dram_its_offloaded_optimizer_steps_on(tmp_path):
    """CPU Adam under offload was priced at a DGX A100's 222 GB/s of DRAM on a calibrated CPU host
    that copied at 10 GB/s a rank: the profile left host_dram_gbps out and did not list it."""
    profile = cal.build_profile(base=get_gpu("cpu"), measured=_cpu_measured())
    figures = {f.key: f for f in profile.figures}
    assert figures["host_dram_gbps"].source == "measured" and figures["host_dram_gbps"].value == pytest.approx(20.8)
    path = tmp_path / "hw.yaml"
    path.write_text(cal.render_yaml(profile))
    gpu = load_catalog(path)[0]["cpu"]
    assert gpu.host_dram_bytes_per_s == pytest.approx(20.8e9)
    assert Cluster(num_nodes=1, gpus_per_node=2, gpu=gpu).host_dram_bytes_per_s == pytest.approx(20.8e9)
    # A GPU's copy times its HBM, not the host: the profile says the node figure is the catalog's.
    gpu_profile = cal.build_profile(base=get_gpu("h100-pcie"), measured=_cpu_measured().__class__(
        **{**{f: getattr(_cpu_measured(), f) for f in cal.Measurements.__dataclass_fields__},
           "device": "cuda", "backend": "nccl", "memory_bytes_per_s": 1.8e12,
           "gemm": (cal.GemmPoint(m=8192, n=8192, k=8192, flops_per_s=500e12),)}))
    node = {f.key: f for f in gpu_profile.figures}["host_dram_gbps"]
    assert node.source == "catalog" and "assumed" in node.note and "set host_dram_gbps" in node.note
    assert gpu_profile.gpu.host_dram_bytes_per_s is None


def test_gpus_shows_a_calibrated_cpu_peak_and_which_entries_the_file_changed(tmp_path, capsys):
    """`dstk gpus --hardware PROFILE` printed the calibrated CPU's 0.43 TFLOP/s as 0."""
    path = _profile(tmp_path)
    code, out, _ = _run(capsys, ["gpus", "--hardware", str(path)])
    row = next(line for line in out.splitlines() if line.startswith("cpu")).split()
    assert code == 0 and row[0] == "cpu*" and row[3] == "0.43", row
    assert f"(*: added or changed by {path}" in out
    assert not [line for line in out.splitlines() if line.startswith("h100-sxm*")]


@pytest.mark.distributed
def test_a_real_calibration_is_used_as_its_header_says(tmp_path):
    """`dstk doctor --calibrate --quick` on 2 CPU ranks, then the profile's own "use it" line: the
    plan uses the measured CPU (without --gpu), and the profile names its dstk release and the
    node DRAM it measured."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    hw = tmp_path / "hardware.yaml"
    proc = subprocess.run([sys.executable, "-m", "dstk", "doctor", "--calibrate", "--quick", "--num-ranks", "2",
                           "--output", str(hw)], capture_output=True, text=True, env=env, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = hw.read_text()
    assert text.splitlines()[0].endswith(f"(dstk {__version__})")
    assert f"use it: dstk plan INTENT --hardware {hw}" in text
    assert "measured host_dram_gbps" in proc.stdout
    gpu = load_catalog(hw)[0]["cpu"]
    assert gpu.host_dram_bytes_per_s == pytest.approx(2 * gpu.hbm_bytes_per_s, rel=1e-3)
    est = subprocess.run([sys.executable, "-m", "dstk", "estimate", *GPT2, "--hardware", str(hw), "--format", "json"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert est.returncode == 0 and json.loads(est.stdout)["cluster"]["gpu"] == "cpu", est.stderr
