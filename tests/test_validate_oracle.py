"""DeepSpeed's own parser as the oracle for the hardening of ``dstk validate`` (one child process for all
cases, as in tests/test_validate_corpus.py): comment keys in every section, non-finite and huge numbers,
unterminated comments, ZenFlow and autocast values; and ``--deepspeed`` itself (the file is handed over,
no process group at data-parallel size 1, a rejection exits 1)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dstk.cli import main
from dstk.validate import load_schema, read_document, validate_config, validate_document
from dstk.validate.deepspeed_check import parse_many

pytest.importorskip("deepspeed")

BASE = {"train_micro_batch_size_per_gpu": 1}


def _sections() -> list[tuple[str, ...]]:
    """Every closed object of the schema (a section DeepSpeed reads), as a key path."""
    out = []

    def walk(node: dict, path: tuple[str, ...]) -> None:
        for key, sub in node.get("properties", {}).items():
            if isinstance(sub, dict) and "properties" in sub and sub.get("additionalProperties") is False:
                if key == "bfloat16":
                    continue  # the legacy name: same model as bf16
                out.append(path + (key,))
                walk(sub, path + (key,))

    walk(load_schema(), ())
    return out


SECTIONS = _sections()


def _with_comment(path: tuple[str, ...]) -> dict:
    config = json.loads(json.dumps(BASE))
    node = config
    for key in path:
        node = node.setdefault(key, {})
    node["_comment"] = "a note"
    return config


FILES = {  # text -> what it is; DeepSpeed must reject each and dstk must report an error
    # (on a line of its own hjson reads NaN as the string "NaN", which the parse keeps: a trap, also an error)
    "nan": '{"train_micro_batch_size_per_gpu": 1, "gradient_clipping": NaN}',
    "infinity": '{"train_micro_batch_size_per_gpu": 1, "gradient_clipping": Infinity}',
    "overflow": '{"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e400}}}',
    "digits": '{"train_micro_batch_size_per_gpu": 1, "steps_per_print": ' + "9" * 5000 + "}",
    "unterminated": '{"train_micro_batch_size_per_gpu": 1 /* never closed',
}

VALUES = [  # (config, dstk and DeepSpeed agree on it)
    {"zero_optimization": {"stage": 2, "zenflow": {"select_strategy": "xx"}}},
    {"zero_optimization": {"stage": 2, "zenflow": {"select_strategy": "epoch"}}},
    {"zero_optimization": {"stage": 2, "zenflow": {"update_interval": 0}}},
    {"zero_optimization": {"stage": 2, "zenflow": {"update_interval": "often"}}},
    {"zero_optimization": {"stage": 2, "zenflow": {"update_interval": 4, "select_interval": "auto"}}},
    {"zero_optimization": {"stage": 2, "zenflow": {"select_interval": "often"}}},
    {"torch_autocast": {"enabled": True, "dtype": "xx"}},
    {"torch_autocast": {"enabled": False, "dtype": "xx"}},
    {"torch_autocast": {"enabled": True, "dtype": "bfloat"}},
    {"torch_autocast": {"enabled": True, "dtype": "torch.float16"}},
    {"$schema": "https://example.org/deepspeed.schema.json"},
]


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("oracle")
    jobs, keys = [], []
    for path in SECTIONS:
        jobs.append({"config": _with_comment(path), "dp": 1, "fill": False})
        keys.append(("comment", path))
    for name, text in FILES.items():
        file = tmp / f"{name}.json"
        file.write_text(text)
        jobs.append({"config": str(file), "dp": 1, "fill": False})
        keys.append(("file", name))
    for i, extra in enumerate(VALUES):
        jobs.append({"config": {**BASE, **extra}, "dp": 1, "fill": False})
        keys.append(("value", i))
    out = dict(zip(keys, parse_many(jobs)))
    out["tmp"] = tmp
    return out


def test_comment_key_severity_follows_deepspeeds_verdict_in_every_section(verdicts):
    assert len(SECTIONS) >= 30
    wrong = {}
    for path in SECTIONS:
        verdict = verdicts[("comment", path)]
        found = [(f.code, f.severity) for f in validate_config(_with_comment(path)) if f.code != "DS218"]
        expected = [("DS111", "warning" if verdict.accepted else "error")]
        if found != expected:
            wrong["/".join(path)] = (found, verdict.error)
    assert wrong == {}
    rejected = [p for p in SECTIONS if not verdicts[("comment", p)].accepted]
    assert 10 <= len(rejected) < len(SECTIONS)  # both kinds of section are covered


@pytest.mark.parametrize("name", sorted(FILES))
def test_what_deepspeeds_reader_rejects_dstk_rejects(verdicts, name):
    assert not verdicts[("file", name)].accepted
    findings = validate_document(read_document(verdicts["tmp"] / f"{name}.json"))
    assert [f for f in findings if f.severity == "error"], findings


@pytest.mark.parametrize("index", range(len(VALUES)))
def test_zenflow_autocast_and_schema_values_agree_with_deepspeed(verdicts, index):
    verdict = verdicts[("value", index)]
    errors = [f for f in validate_config({**BASE, **VALUES[index]}) if f.severity == "error"]
    assert (errors == []) == verdict.accepted, (VALUES[index], errors, verdict.error)


def test_deepspeed_flag_hands_over_the_file_and_a_rejection_exits_1(tmp_path, capsys):
    """Duplicate keys exist only in the file (a parsed dict keeps the last): with DS007 ignored, only
    DeepSpeed reading the file itself can reject it."""
    path = tmp_path / "dup.json"
    path.write_text('{"train_micro_batch_size_per_gpu": 1, "train_micro_batch_size_per_gpu": 2}')
    assert main(["validate", str(path), "--no-project", "--ignore", "DS007", "--format", "json"]) == 0
    capsys.readouterr()
    assert main(["validate", str(path), "--no-project", "--ignore", "DS007", "--deepspeed", "--format", "json"]) == 1
    (entry,) = json.loads(capsys.readouterr().out)["files"]
    assert entry["deepspeed"]["accepted"] is False and "Duplicate" in entry["deepspeed"]["error"]
    assert [f["code"] for f in entry["findings"]] == ["DS301"] and entry["valid"] is False


def test_no_process_group_at_data_parallel_size_1(tmp_path):
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(BASE))
    code = ("import sys, torch.distributed as td; from dstk.validate.deepspeed_check import parse_in_process; "
            "v = parse_in_process(sys.argv[1], dp=1); print(v.accepted, td.is_initialized())")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=300,
                         check=True, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert out.stdout.split()[-2:] == ["True", "False"], out.stdout + out.stderr
