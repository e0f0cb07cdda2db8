"""``doctor --calibrate`` measures ZeRO's host work per parameter tensor on CPU ranks.

The ranks time DeepSpeed steps of the floor's Llama under ZeRO 0/1/3 at 1 and 3 layers
(``dstk.launch.zero_cost``); ``calibrate.fit_zero_tensor_seconds`` subtracts ZeRO-0 and the
collectives the time model prices and fits seconds per tensor. Here the steps are made by the time
model itself from known per-tensor figures, so the fit must give those figures back, and the
profile must carry them to the planner. The real measurement on 2 ranks is the ``distributed``
test in ``tests/test_doctor_calibrate.py``.
"""

from __future__ import annotations

import dataclasses

import pytest

from dstk import calibrate as cal
from dstk.hardware import get_gpu

from test_doctor_calibrate import _measured


def _profile_gpu():
    """The CPU entry with the link, latency and floors of a calibration (``_measured``), the ZeRO
    figures at 0: what ``build_profile`` prices the ZeRO steps with."""
    return cal.build_profile(base=get_gpu("cpu"), measured=_measured()).gpu.replace(zero_tensor_seconds=0.0,
                                                                                    zero3_tensor_seconds=0.0)


def _steps(gpu, *, zero1: float, zero3: float, ranks: int = 2, noise: dict | None = None) -> tuple[cal.ZeroStep, ...]:
    """The six steps the ranks report, as the time model prices them with the given per-tensor
    figures (plus ``noise`` seconds per ``(stage, layers)``)."""
    true = gpu.replace(zero_tensor_seconds=zero1, zero3_tensor_seconds=zero3)
    return tuple(cal.ZeroStep(zero_stage=z, num_layers=n,
                              seconds=cal.priced_floor_step_seconds(gpu=true, num_ranks=ranks, precision="bf16",
                                                                    num_layers=n, zero_stage=z)
                              + (noise or {}).get((z, n), 0.0))
                 for z in (0, 1, 3) for n in (1, 3))


@pytest.mark.parametrize("ranks", [1, 2])
def test_the_fit_gives_back_the_per_tensor_figures_the_steps_hold(ranks):
    gpu = _profile_gpu()
    fitted = cal.fit_zero_tensor_seconds(gpu=gpu, steps=_steps(gpu, zero1=8e-5, zero3=4.5e-4, ranks=ranks),
                                         num_ranks=ranks, precision="bf16")
    assert fitted[1][0] == pytest.approx(8e-5, rel=1e-6)
    assert fitted[3][0] == pytest.approx(4.5e-4, rel=1e-6)
    if ranks == 2:  # the collectives ZeRO-3 adds over ZeRO-0 are priced and subtracted, not fitted
        assert "without per-tensor work (collectives)" in fitted[3][1] and "12 tensors" in fitted[3][1] and "30 tensors" in fitted[3][1]


def test_the_fit_is_least_squares_per_tensor_and_never_negative():
    gpu = _profile_gpu()
    # 1 ms more on the 1-layer ZeRO-3 step only (12 tensors; 30 at 3 layers): 12 x 1 ms / (12^2 + 30^2).
    noisy = _steps(gpu, zero1=0.0, zero3=5e-4, noise={(3, 1): 1e-3})
    fitted = cal.fit_zero_tensor_seconds(gpu=gpu, steps=noisy, num_ranks=2, precision="bf16")
    assert fitted[3][0] == pytest.approx(5e-4 + 12 * 1e-3 / (12**2 + 30**2), rel=1e-6)
    # ZeRO-1 measured faster than its priced collectives: 0, not a negative cost.
    fast = _steps(gpu, zero1=0.0, zero3=5e-4, noise={(1, 1): -2e-3, (1, 3): -2e-3})
    assert cal.fit_zero_tensor_seconds(gpu=gpu, steps=fast, num_ranks=2, precision="bf16")[1][0] == 0.0


def test_from_rank_reports_takes_the_slowest_rank_per_step():
    base = {"gemm": [{"m": 512, "n": 64, "k": 64, "flops_per_s": 5e10}], "memory_bytes_per_s": 9e9,
            "op_seconds": 5e-6, "device": "cpu"}
    fast = {**base, "zero_steps": {"layers": [1, 3], "seconds": {"0": [10e-3, 30e-3], "1": [11e-3, 33e-3],
                                                                  "3": [20e-3, 60e-3]}, "wall_seconds": 7.0}}
    slow = {**base, "zero_steps": {"layers": [1, 3], "seconds": {"0": [12e-3, 29e-3], "1": [11e-3, 34e-3],
                                                                  "3": [19e-3, 65e-3]}, "wall_seconds": 8.0}}
    m = cal.from_rank_reports(measure={"precision": "bf16", "world_size": 2, "backend": "gloo", "ranks": [fast, slow]},
                              allreduce=[])
    got = {(s.zero_stage, s.num_layers): s.seconds for s in m.zero_steps}
    assert got == {(0, 1): 12e-3, (0, 3): 30e-3, (1, 1): 11e-3, (1, 3): 34e-3, (3, 1): 20e-3, (3, 3): 65e-3}
    assert m.zero_wall_seconds == 8.0
    # A GPU rank reports none: the catalog's figures stay, and the profile says so.
    m = cal.from_rank_reports(measure={"precision": "bf16", "world_size": 1, "backend": "gloo",
                                       "ranks": [{**base, "zero_steps": None}]}, allreduce=[])
    assert m.zero_steps == ()
    figs = {f.key: f for f in cal.build_profile(base=get_gpu("cpu"), measured=m).figures}
    assert figs["zero3_tensor_seconds"].source == "catalog" and figs["zero3_tensor_seconds"].value == 6e-4


def test_the_profile_writes_the_measured_figures_and_the_planner_reads_them(tmp_path, capsys):
    import json
    from pathlib import Path

    from dstk.cli import main

    gpu = _profile_gpu()
    m = dataclasses.replace(_measured(), zero_steps=_steps(gpu, zero1=1e-4, zero3=1.5e-3), zero_wall_seconds=6.5)
    profile = cal.build_profile(base=get_gpu("cpu"), measured=m)
    figs = {f.key: f for f in profile.figures}
    assert figs["zero3_tensor_seconds"].source == figs["zero_tensor_seconds"].source == "measured"
    assert profile.gpu.zero3_tensor_seconds == pytest.approx(1.5e-3, rel=1e-3)
    assert profile.gpu.zero_tensor_seconds == pytest.approx(1e-4, rel=1e-3)
    assert "6.5 s" in figs["zero3_tensor_seconds"].note
    text = cal.render_yaml(profile, header=(cal.HEADER,))
    hw, hw_zero = tmp_path / "hw.yaml", tmp_path / "hw0.yaml"
    cal.write_profile(str(hw), text)
    assert "zero3_tensor_seconds: 0.0015" in text
    cal.write_profile(str(hw_zero), text.replace("zero3_tensor_seconds: 0.0015", "zero3_tensor_seconds: 0.0"))
    tiny = Path(__file__).resolve().parents[1] / "examples" / "intents" / "tiny-llama-cpu.yaml"

    def plan(path):
        assert main(["plan", str(tiny), "--zero", "3", "--hardware", str(path), "--format", "json"]) == 0
        return json.loads(capsys.readouterr().out)["plans"][0]

    measured, without = plan(hw), plan(hw_zero)
    assert measured["layout"]["zero_stage"] == without["layout"]["zero_stage"] == 3
    assert measured["layout"]["dp"] == without["layout"]["dp"]
    # The ZeRO-3 step moves by the measured 1.5 ms per tensor and micro-batch: the tiny Llama's
    # 21 tensors (2 layers of 9, the embedding, final norm and head) per micro-batch.
    moved = measured["time"]["step_seconds"] - without["time"]["step_seconds"]
    micro_batches = measured["layout"]["grad_accum"]
    assert moved == pytest.approx(21 * micro_batches * 1.5e-3, rel=1e-3)


def test_a_figure_below_1e_4_is_written_so_that_yaml_reads_a_number(tmp_path):
    # json.dumps(2e-05) is "2e-05", a string to PyYAML (YAML 1.1): a calibration that measured ZeRO-1's
    # host work at 20 us per tensor wrote a profile that `plan --hardware` then refused (seen in CI).
    from dstk.hardware import load_catalog

    gpu = _profile_gpu()
    m = dataclasses.replace(_measured(), zero_steps=_steps(gpu, zero1=2e-5, zero3=3e-5), zero_wall_seconds=1.0)
    profile = cal.build_profile(base=get_gpu("cpu"), measured=m)
    assert profile.gpu.zero_tensor_seconds == pytest.approx(2e-5, rel=1e-3)
    path = tmp_path / "hw.yaml"
    cal.write_profile(str(path), cal.render_yaml(profile, header=(cal.HEADER,)))
    text = path.read_text()
    assert "zero_tensor_seconds: 2.0e-05" in text and "zero3_tensor_seconds: 3.0e-05" in text
    read = load_catalog(path)[0][profile.slug]
    assert read.zero_tensor_seconds == profile.gpu.zero_tensor_seconds
    assert read.zero3_tensor_seconds == profile.gpu.zero3_tensor_seconds


@pytest.mark.parametrize("text", ["2e-05", "2E-5", "+2e-05", ".2e-4", "2.e-5"])
def test_a_hand_written_exponent_number_is_a_number(tmp_path, text):
    # What YAML 1.2 and JSON read as a number is one here too, whichever way the user wrote it.
    from dstk.hardware import load_catalog

    path = tmp_path / "hw.yaml"
    path.write_text(f"gpus:\n  cpu:\n    zero_tensor_seconds: {text}\n")
    assert load_catalog(path)[0]["cpu"].zero_tensor_seconds == pytest.approx(2e-5)


def test_a_word_is_still_not_a_number(tmp_path):
    from dstk.errors import DstkError
    from dstk.hardware import load_catalog

    path = tmp_path / "hw.yaml"
    path.write_text("gpus:\n  cpu:\n    zero_tensor_seconds: 2e-05s\n")
    with pytest.raises(DstkError, match="expected a number, got '2e-05s'"):
        load_catalog(path)
