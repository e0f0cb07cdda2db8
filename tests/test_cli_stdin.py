"""``-`` as standard input where a command reads a file, and ``-o -`` refused where a command writes a directory.

The first tests pipe through a real ``dstk`` process, as a shell would; the rest call ``main``
in-process with ``sys.stdin`` replaced by the same bytes."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dstk.cli import main

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "examples" / "intents" / "tiny-llama-cpu.yaml"
BAD_STAGE = '{"train_micro_batch_size_per_gpu": 1,\n "zero_optimization": {"stage": 9}}\n'


def _dstk(argv, *, stdin: bytes, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dstk", *argv], input=stdin, capture_output=True, cwd=cwd,
                          timeout=120, env=dict(os.environ, COLUMNS="100"))


def _stdin(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def test_validate_dash_reads_stdin_in_a_pipe(tmp_path):
    proc = _dstk(["validate", "-"], stdin=BAD_STAGE.encode(), cwd=tmp_path)
    out = proc.stdout.decode()
    assert proc.returncode == 1, proc.stderr
    assert "<stdin>:2:" in out and "DS103" in out and "<stdin>: invalid" in out
    assert not (tmp_path / "-").exists()


def test_plan_dash_reads_the_intent_from_stdin_in_a_pipe(tmp_path):
    proc = _dstk(["plan", "-", "--format", "json", "--top", "3"], stdin=TINY.read_bytes(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    from_pipe = json.loads(proc.stdout)
    proc = _dstk(["plan", str(TINY), "--format", "json", "--top", "3"], stdin=b"", cwd=tmp_path)
    assert json.loads(proc.stdout)["plans"] == from_pipe["plans"]


def test_validate_stdin_next_to_files(tmp_path, monkeypatch, capsys):
    good = tmp_path / "good.json"
    good.write_text('{"train_micro_batch_size_per_gpu": 1}')
    _stdin(monkeypatch, BAD_STAGE.encode())
    assert main(["validate", str(good), "-", "--format", "json", "--no-project"]) == 1
    files = {f["path"]: f for f in json.loads(capsys.readouterr().out)["files"]}
    assert set(files) == {str(good), "<stdin>"}
    assert files[str(good)]["valid"] and not files["<stdin>"]["valid"]
    (finding,) = files["<stdin>"]["findings"]
    assert finding["code"] == "DS103" and finding["line"] == 2


@pytest.mark.parametrize("data, code", [(b"", "DS002"), (b"{\"a\": 1,,}", "DS001"), (b"\x00\x01", "DS004")])
def test_validate_stdin_bad_input_is_a_finding(monkeypatch, capsys, data, code):
    _stdin(monkeypatch, data)
    assert main(["validate", "-", "--format", "json", "--no-project"]) == 1
    (entry,) = json.loads(capsys.readouterr().out)["files"]
    assert entry["path"] == "<stdin>" and entry["findings"][0]["code"] == code


def test_validate_stdin_is_cut_off_past_the_size_limit(monkeypatch):
    from dstk.validate.source import read_stdin

    data, doc = read_stdin(stream=io.BytesIO(b" " * 100 + b"{}"), max_bytes=50)
    assert len(data) == 51 and doc.findings[0].code == "DS005"


def test_validate_stdin_twice_is_a_usage_error(monkeypatch, capsys):
    _stdin(monkeypatch, b"{}")
    assert main(["validate", "-", "-"]) == 2
    assert "more than once" in capsys.readouterr().err


def test_validate_stdin_uses_the_pyproject_of_the_working_directory(tmp_path, monkeypatch, capsys):
    (tmp_path / "pyproject.toml").write_text('[tool.dstk]\nignore = ["DS103"]\n')
    monkeypatch.chdir(tmp_path)
    _stdin(monkeypatch, BAD_STAGE.encode())
    assert main(["validate", "-", "--format", "json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)["files"]
    assert entry["ignored"] == 1 and entry["project"].endswith("pyproject.toml")


@pytest.mark.parametrize("command", ["plan", "explain"])
def test_intent_commands_read_stdin(monkeypatch, capsys, command):
    _stdin(monkeypatch, TINY.read_bytes())
    assert main([command, "-", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)


def test_estimate_intent_dash_reads_stdin(monkeypatch, capsys):
    _stdin(monkeypatch, TINY.read_bytes())
    assert main(["estimate", "--intent", "-", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)


def test_generate_reads_the_intent_from_stdin(tmp_path, monkeypatch, capsys):
    _stdin(monkeypatch, TINY.read_bytes())
    assert main(["generate", "-", "-o", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "ds_config.json").is_file()
    assert json.loads((tmp_path / "run" / "plan.json").read_text())["layout"]


@pytest.mark.parametrize("data, message", [(b"", "standard input is empty"),
                                           (b"model: [\n", "<stdin>:2:1: not valid YAML"),
                                           (b"model: {name: tiny-llama}\ntraining: {seq_lenn: 8}\n", "<stdin>")])
def test_bad_intent_on_stdin_is_one_clear_error(monkeypatch, capsys, data, message):
    _stdin(monkeypatch, data)
    assert main(["plan", "-"]) in (1, 2)
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [["generate", str(TINY), "-o", "-"],
                                  ["demo", "--skip-finetune", "-o", "-"],
                                  ["finetune", "--intent", str(TINY), "--data", str(TINY), "-o", "-"],
                                  ["export", "no-such-checkpoint", "-o", "-"]], ids=lambda a: a[0])
def test_a_directory_output_of_dash_is_refused(tmp_path, monkeypatch, capsys, argv):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "cannot be standard output" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_validate_stdin_with_deepspeed_gives_deepspeed_the_same_bytes(monkeypatch, capsys):
    """--deepspeed hands DeepSpeed a file: for standard input, a copy of the bytes read (hjson and its
    duplicate-key check included), so DeepSpeed's verdict is on what dstk checked."""
    _stdin(monkeypatch, b'{"train_micro_batch_size_per_gpu": 1, // hjson\n "train_micro_batch_size_per_gpu": 2}')
    assert main(["validate", "-", "--deepspeed", "--format", "json", "--no-project"]) == 1
    (entry,) = json.loads(capsys.readouterr().out)["files"]
    assert entry["path"] == "<stdin>" and entry["deepspeed"]["accepted"] is False
    assert "Duplicate keys" in entry["deepspeed"]["error"]
    assert {f["code"] for f in entry["findings"]} >= {"DS007", "DS301"}


def test_upgrade_dash_reads_stdin_and_refuses_write(monkeypatch, capsys):
    old = b'{"train_micro_batch_size_per_gpu": 1, "bfloat16": {"enabled": true}}'
    _stdin(monkeypatch, old)
    assert main(["upgrade", "-", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["config"] == "<stdin>" and data["changes"] and "+++ <stdin> (DeepSpeed" in data["diff"]
    assert '"bf16"' in data["diff"]
    _stdin(monkeypatch, old)
    assert main(["upgrade", "-", "--write"]) == 2
    assert "standard input cannot be rewritten" in capsys.readouterr().err
