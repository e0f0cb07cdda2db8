"""benchmarks/gpu_check.sh, the one prepared GPU check (issue 11), kept working on the CPU: its
``--cpu-smoke`` mode runs the same stages (set-up of the repo into a --target directory, ``dstk
doctor --calibrate`` on one rank, benchmarks/estimate_gpu.py's cases predicted before and after
calibration, the summary) on a CPU rank over gloo with a tiny Llama. The ranks are real DeepSpeed
ones, so these are ``distributed`` tests."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.procs import run_group

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
SMOKE_DIMS = ("--num-layers", "2", "--hidden-size", "64", "--num-heads", "4", "--num-kv-heads", "2",
              "--ffn-hidden-size", "128", "--vocab-size", "512")


def _run(out: Path, *, env: dict | None = None, timeout: float = 400) -> subprocess.CompletedProcess:
    """The script in its own process group, killed whole if it outlives ``timeout``."""
    return run_group(["bash", str(SCRIPT), "--cpu-smoke", "--out", str(out), "--python", sys.executable],
                     stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                     timeout=timeout)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gpu-check")
    # A caller's stale rendezvous (an in-process DeepSpeed test leaves MASTER_PORT at its live store)
    # must not reach the script's own single rank: hold a port and hand it over as if inherited.
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        proc = _run(out, env={"MASTER_PORT": str(held.getsockname()[1]), "RANK": "3", "WORLD_SIZE": "4"})
    assert proc.returncode == 0, proc.stdout[-5000:]
    return {"out": out, "stdout": proc.stdout, "summary": json.loads((out / "gpu_check.json").read_text())}


@pytest.mark.distributed
def test_cpu_smoke_runs_every_stage_and_keeps_the_figures(smoke):
    out, summary, stdout = smoke["out"], smoke["summary"], smoke["stdout"]
    assert sorted(p.name for p in out.iterdir()) == ["attention_gpu.jsonl", "calibrate.json", "estimate_gpu.json",
                                                      "gpu_check.json", "gpu_check.log", "hardware.yaml"]
    # Every stage ran under its timeout and said how long it took.
    stages = summary["stages"]
    assert [s["name"] for s in stages] == ["setup", "calibrate", "estimate", "attention"] and summary["status"] == 0
    assert all(s["rc"] == 0 and 0 < s["seconds"] < s["limit_s"] for s in stages), stages
    for name in ("setup", "calibrate", "estimate", "attention", "summary"):
        assert f"=== stage {name}: ok, " in stdout
    # attention: one measured line per sequence length, with dstk's prediction beside it
    attention = [json.loads(line) for line in (out / "attention_gpu.jsonl").read_text().splitlines()]
    assert [a["seq_len"] for a in attention] == [64, 128] and all(a["tflops"] > 0 for a in attention)
    assert all(0 < a["predicted_sdpa"] <= 1 for a in attention)
    # The log holds what was printed; the repo ran from the copy the set-up installed.
    assert (out / "gpu_check.log").read_text() == stdout
    setup = summary["setup"]
    assert setup["dstk"].endswith("/site/dstk") and not setup["dstk"].startswith(str(ROOT))
    assert setup["accelerator"] == "cpu" and setup["missing_from_image"] == []
    # The calibration: a profile with the measured GEMM curve that the cases read back.
    figures = {f["key"]: f for f in summary["calibrate"]["profile"]["figures"]}
    assert figures["gemm_efficiency"]["source"] == figures["hbm_gbps"]["source"] == "measured"
    assert "gemm_efficiency:" in (out / "hardware.yaml").read_text()
    est = summary["estimate"]
    assert est["hardware"] == str(out / "hardware.yaml") and est["gpus"]["calibrated"]["gemm_efficiency"] == \
        figures["gemm_efficiency"]["value"]
    # Each case: measured once, predicted before and after calibration, one line each.
    assert [(c["zero_stage"], c["recompute"]) for c in est["cases"]] == [(0, "none"), (3, "full")]
    for case in est["cases"]:
        m = case["measured"]
        assert m["peak_bytes"] is None and 0 < m["step_seconds"] < 5 and math.isfinite(m["loss"])
        assert len(m["all_step_seconds"]) == est["steps"]
        cat, cal = case["predicted"]["catalog"], case["predicted"]["calibrated"]
        assert cat["step_seconds"] > 0 and cal["step_seconds"] > 0 and cat["step_seconds"] != cal["step_seconds"]
        assert cat["step_error"] == pytest.approx(cat["step_seconds"] / m["step_seconds"] - 1)
        for source in ("catalog", "calibrated"):
            line = f"ZeRO-{case['zero_stage']} recompute={case['recompute']:<4} {source:<10} memory: predicted"
            assert line in stdout


@pytest.mark.distributed
def test_the_cases_are_priced_as_dstk_estimate_prices_the_config_that_ran(smoke, tmp_path):
    """The prediction is the planner's: ``dstk estimate --config`` of the DeepSpeed config each case
    ran, with and without ``--hardware``, gives the same step time and (less the framework
    overhead, which ``max_memory_allocated`` does not count) the same memory."""
    out, est = smoke["out"], smoke["summary"]["estimate"]
    for case in est["cases"]:
        config = tmp_path / f"ds{case['zero_stage']}.json"
        config.write_text(json.dumps(case["ds_config"]))
        for source, extra in (("catalog", ()), ("calibrated", ("--hardware", str(out / "hardware.yaml")))):
            proc = subprocess.run([sys.executable, "-m", "dstk", "estimate", "--config", str(config), *SMOKE_DIMS,
                                   "--gpus", "1", "--gpu", "cpu", "--seq-len", str(est["seq_len"]), "--recompute",
                                   case["recompute"], *extra, "--format", "json"],
                                  capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0, proc.stderr
            cli = json.loads(proc.stdout)
            predicted = case["predicted"][source]
            assert predicted["step_seconds"] == pytest.approx(cli["time"]["step_seconds"], rel=1e-9)
            per_gpu = cli["memory"]["per_gpu"]
            assert predicted["memory_bytes"] == per_gpu["total_bytes"] - per_gpu["overhead_bytes"]


@pytest.mark.distributed
def test_a_stage_past_its_timeout_is_reported_and_the_cases_still_run(tmp_path):
    """One hang cannot eat the budget: the calibration killed at its limit, the cases run with the
    catalog's figures alone, the summary says which stage timed out, and the exit status is 1."""
    proc = _run(tmp_path, env={"GPU_CHECK_CALIBRATE_S": "3"})
    assert proc.returncode == 1, proc.stdout[-4000:]
    assert "=== stage calibrate: TIMED OUT after 3 s" in proc.stdout
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    stages = {s["name"]: s for s in summary["stages"]}
    assert stages["calibrate"]["rc"] in (124, 137) and stages["calibrate"]["seconds"] < 20
    assert stages["estimate"]["rc"] == 0
    cases = summary["estimate"]["cases"]
    assert cases and all(list(c["predicted"]) == ["catalog"] for c in cases)
    assert "(exit 124, limit 3 s)" in proc.stdout or "(exit 137, limit 3 s)" in proc.stdout


def test_set_up_without_deepspeed_or_wheels_says_how_to_fix(tmp_path):
    """A python that lacks DeepSpeed (the device image) and no carried wheels: the set-up stage
    names what is missing and the --prepare command, and nothing else runs."""
    import site

    # The dev venv's packages minus DeepSpeed, seen by `python -S` (no site-packages of its own).
    farm = tmp_path / "image"
    farm.mkdir()
    packages = next(p for p in site.getsitepackages() if os.path.isdir(os.path.join(p, "torch")))
    for entry in os.listdir(packages):
        if not entry.startswith(("deepspeed", "__editable__", "dstk")) and not entry.endswith(".pth"):
            (farm / entry).symlink_to(os.path.join(packages, entry))
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={farm} exec {sys.executable} -S \"$@\"\n")
    python.chmod(0o755)
    proc = subprocess.run(["bash", str(SCRIPT), "--cpu-smoke", "--out", str(tmp_path / "out"), "--python", str(python)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "GPU_CHECK_WHEELS": str(tmp_path / "no-wheels")})
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "missing from this python: deepspeed" in proc.stdout
    assert "fix: run 'bash benchmarks/gpu_check.sh --prepare'" in proc.stdout
    assert "=== stage setup: FAILED (exit 3)" in proc.stdout and "=== stage calibrate" not in proc.stdout
    summary = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert [s["name"] for s in summary["stages"]] == ["setup"] and summary["status"] == 1


def test_attention_stage_refuses_an_unknown_gpu_with_the_known_ones():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "attention_gpu.py"), "--cpu-smoke", "--gpu", "nope"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "unknown GPU 'nope'" in proc.stderr and "fix: known:" in proc.stderr
    assert "Traceback" not in proc.stderr
