"""``-`` for the foreign file of ``dstk import -`` and ``--from -``, and ``doctor --calibrate --output -``.

Standard input has no file name, so the format is told from the content alone; the answer must be the
same as for the file read by path."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dstk.cli import main

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "import"
LLAMAFACTORY = DATA / "llamafactory_full_sft.yaml"
MEGATRON = DATA / "megatron_gpt.args"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "COLUMNS": "100"}


def _dstk(argv, *, stdin: bytes = b"", cwd=None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dstk", *argv], input=stdin, capture_output=True, cwd=cwd,
                          timeout=timeout, env=ENV)


def _stdin(monkeypatch, text: str) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode()), encoding="utf-8"))


@pytest.mark.parametrize("source, extra", [(MEGATRON, []), (DATA / "run_clm.sh", []), (LLAMAFACTORY, []),
                                           (DATA / "training_args.json", ["--model", "tiny-llama"])])
def test_import_dash_in_a_pipe_gives_the_intent_of_the_file(source, extra):
    # run where the tool would run: a relative DeepSpeed path in the file is found in the working directory
    piped = _dstk(["import", "-", "--format", "json", *extra], stdin=source.read_bytes(), cwd=DATA)
    assert piped.returncode == 0, piped.stderr
    by_path = _dstk(["import", str(source), "--format", "json", *extra], cwd=DATA)
    assert by_path.returncode == 0, by_path.stderr
    a, b = json.loads(piped.stdout), json.loads(by_path.stdout)
    assert a["kind"] == b["kind"] and a["intent"] == b["intent"] and a["source"] == "<stdin>"
    assert yaml.safe_load(a["intent_yaml"]) == yaml.safe_load(b["intent_yaml"])
    # the same report, line for line, with the file's name replaced by <stdin>
    assert a["lines"] == [{k: v.replace(str(source), "<stdin>") if isinstance(v, str) else v for k, v in line.items()}
                          for line in b["lines"]]
    assert not (DATA / "-").exists()


def test_import_dash_writes_the_intent_to_stdout_and_the_report_to_stderr(tmp_path):
    proc = _dstk(["import", "-"], stdin=MEGATRON.read_bytes(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout)["model"]["num_layers"] == 24
    assert proc.stderr.decode().startswith("<stdin>: megatron")


@pytest.mark.parametrize("text", ["learning_rate_typo: 1\nfoo: bar\n", "just some words\n"])
def test_a_format_that_cannot_be_told_names_the_kind_flag(monkeypatch, capsys, text):
    _stdin(monkeypatch, text)
    assert main(["import", "-"]) == 2
    err = capsys.readouterr().err
    assert "<stdin>: cannot tell the format" in err and "--kind" in err and "megatron" in err
    _stdin(monkeypatch, text)
    assert main(["plan", "--from", "-"]) == 2
    assert "dstk import - --kind" in capsys.readouterr().err


def test_kind_reads_what_detection_cannot(monkeypatch, capsys):
    # Only TrainingArguments keys detection does not look for: hf-args by --kind.
    _stdin(monkeypatch, json.dumps({"num_train_epochs": 2, "bf16": True}))
    assert main(["import", "-", "--kind", "hf-args", "--model", "tiny-llama", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "hf-args" and data["intent"]["training"]["precision"] == "bf16"


def test_empty_stdin_is_a_usage_error(monkeypatch, capsys):
    _stdin(monkeypatch, "")
    assert main(["import", "-"]) == 2
    assert "standard input is empty" in capsys.readouterr().err


def test_a_relative_deepspeed_path_from_stdin_is_looked_up_in_the_working_directory(tmp_path, monkeypatch, capsys):
    (tmp_path / "ds.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": 2,
                                                  "zero_optimization": {"stage": 3}}))
    text = "model_name_or_path: meta-llama/Meta-Llama-3-8B\ncutoff_len: 256\ndeepspeed: ds.json\n"
    monkeypatch.chdir(tmp_path)
    _stdin(monkeypatch, text)
    assert main(["import", "-", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["followed"] == ["ds.json"] and data["intent"]["constraints"]["zero_stage"] == 3
    monkeypatch.chdir(ROOT)
    _stdin(monkeypatch, text)
    assert main(["import", "-"]) == 1
    assert "standard input has no directory" in capsys.readouterr().err


def _from_both(monkeypatch, capsys, argv: list[str]) -> tuple[str, str]:
    """The command's stdout with --from FILE and with --from - fed the same bytes, in the file's directory
    (where LLaMA-Factory runs: the DeepSpeed config it names is relative)."""
    monkeypatch.chdir(DATA)
    assert main([*argv[:1], "--from", str(LLAMAFACTORY), *argv[1:]]) == 0
    by_path = capsys.readouterr().out
    _stdin(monkeypatch, LLAMAFACTORY.read_text())
    assert main([*argv[:1], "--from", "-", *argv[1:]]) == 0
    return by_path, capsys.readouterr().out


@pytest.mark.parametrize("argv", [["plan", "--format", "json", "--top", "2"], ["estimate", "--format", "json"],
                                  ["explain", "--format", "json"]])
def test_from_dash_equals_from_the_file(monkeypatch, capsys, argv):
    by_path, piped = _from_both(monkeypatch, capsys, argv)
    assert json.loads(piped) == json.loads(by_path)


def test_generate_from_dash(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(DATA)
    _stdin(monkeypatch, LLAMAFACTORY.read_text())
    assert main(["generate", "--from", "-", "-o", str(tmp_path / "piped")]) == 0
    assert main(["generate", "--from", str(LLAMAFACTORY), "-o", str(tmp_path / "file")]) == 0
    for name in ("ds_config.json", "plan.json"):
        piped = json.loads((tmp_path / "piped" / name).read_text())
        by_path = json.loads((tmp_path / "file" / name).read_text())
        piped.pop("generated_by", None), by_path.pop("generated_by", None)
        assert piped == by_path or name == "plan.json" and piped["layout"] == by_path["layout"]


def test_finetune_plans_from_dash(monkeypatch):
    """finetune --from (a path or -) plans the imported setup (it used to be ignored without another plan flag)."""
    from dstk.cli import build_parser
    from dstk.commands.finetune import plan_intent

    parser = build_parser("finetune")
    _stdin(monkeypatch, MEGATRON.read_text())
    args = parser.parse_args(["finetune", "--from", "-", "--data", "x.txt", "-o", "out", "--gpu", "a100-80gb"])
    intent = plan_intent(args, log=lambda s: None)
    assert intent.model.num_layers == 24 and intent.model.hidden_size == 2048
    args = parser.parse_args(["finetune", "--from", str(MEGATRON), "--plan", "run", "--data", "x.txt", "-o", "out"])
    with pytest.raises(Exception, match="--from given with --plan"):
        plan_intent(args, log=lambda s: None)


def test_intent_and_from_both_from_stdin_is_refused(monkeypatch, capsys):
    _stdin(monkeypatch, LLAMAFACTORY.read_text())
    assert main(["plan", str(ROOT / "examples" / "intents" / "tiny-llama-cpu.yaml"), "--from", "-"]) == 2
    assert "not both" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["human", "json"])
def test_calibration_report_goes_to_stderr_when_the_profile_goes_to_stdout(capsys, fmt):
    import argparse

    from dstk.commands.doctor import _print_calibration
    from dstk.launch.doctor import Check

    checks = [Check(name="versions@localhost", status="ok", detail="torch 2.13"),
              Check(name="calibrate", status="fail", detail="no result", hint="run it again")]
    assert _print_calibration(argparse.Namespace(format=fmt, output="-"), checks, None, None) == 1
    out, err = capsys.readouterr()
    assert out == "" and "calibrate" in err and "doctor: some checks failed" in err
    assert _print_calibration(argparse.Namespace(format=fmt, output="hw.yaml"), checks, None, None) == 1
    out, err = capsys.readouterr()
    assert "calibrate" in out and err.strip() == "doctor: some checks failed"


@pytest.mark.distributed
def test_calibrate_output_dash_writes_only_the_profile_to_stdout(tmp_path):
    from dstk.hardware import load_catalog

    proc = _dstk(["doctor", "--calibrate", "--quick", "--num-ranks", "2", "--output", "-"], cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout.decode()[-2000:] + proc.stderr.decode()[-2000:]
    profile = tmp_path / "hw.yaml"
    profile.write_bytes(proc.stdout)
    gpus, _ = load_catalog(profile)  # stdout is the profile and nothing else: it loads as --hardware FILE
    assert "cpu" in gpus and gpus["cpu"].layer_overhead_seconds > 0
    err = proc.stderr.decode()
    assert "OK   calibrate" in err and "-> <stdout>" in err  # the report went to stderr
    assert not (tmp_path / "-").exists() and not (tmp_path / "hardware.yaml").exists()
    plan = _dstk(["plan", str(ROOT / "examples" / "intents" / "tiny-llama-cpu.yaml"), "--hardware", str(profile),
                  "--format", "json", "--top", "1"], cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
