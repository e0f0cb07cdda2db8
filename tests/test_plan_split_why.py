"""Follow-ups of the stage split (issue 11) and of ``dstk export``'s writer:

- ``dstk plan`` says, in one why line of the picked layout, how an uneven pipeline split puts the
  layers (``plan.split_line``), true to what ``dstk generate`` writes (plan.json's per-stage layers,
  ``megatron.args``), for the deepspeed engine (``to_pipeline``'s balanced cut) and for Megatron;
- ``choose_buffers`` caps the bucket at the parameters of the fullest stage as the engine splits it,
  the count the estimate prices (it used the even split);
- ``dstk export --force`` replaces an earlier export whole, atomically; without it a non-empty
  ``--output`` is still refused.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_hardening_files import MAKE_CHECKPOINT, _tree

from dstk import plan as planner
from dstk.cli import main
from dstk.estimate import _model_facts, estimate, rank_params, stage_layers
from dstk.estimate.buckets import choose_buffers
from dstk.hardware import Cluster, get_gpu, get_interconnect
from dstk.layout import Layout, Training
from dstk.models import family_module, get_model

LLAMA3_PP4 = ["--model", "llama-3-8b", "--gpus", "4", "--gpu", "a100-80gb", "--seq-len", "2048",
              "--global-batch", "64", "--pp", "4"]
LLAMA3_PP8 = ["--model", "llama-3-8b", "--gpus", "8", "--gpu", "a100-80gb", "--seq-len", "2048",
              "--global-batch", "64", "--pp", "8"]
DIMS30_PP4_MEGATRON = ["--num-layers", "30", "--hidden-size", "4096", "--num-heads", "32", "--vocab-size", "32000",
                       "--gpus", "8", "--gpu", "a100-80gb", "--seq-len", "2048", "--global-batch", "64", "--pp", "4",
                       "--engine", "megatron"]


def _plan(capsys, argv) -> dict:
    assert main(["plan", *argv, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def _split_lines(why) -> list[str]:
    return [w for w in why if w.startswith("pipeline stages ")]


def _generate(capsys, tmp_path, argv, *extra) -> tuple[dict, list[str]]:
    out = tmp_path / "run"
    assert main(["generate", *argv, "--output", str(out), *extra]) == 0, capsys.readouterr().err
    capsys.readouterr()
    doc = json.loads((out / "plan.json").read_text())
    return doc, (out / "megatron.args").read_text().splitlines()


def _args_of(line: str) -> list[str]:
    """``--name value`` pairs named in a why line."""
    words = line.replace("(", " ").replace(")", " ").replace(":", " ").split()
    return [f"{w} {words[i + 1]}" for i, w in enumerate(words) if w.startswith("--")]


@pytest.mark.parametrize("argv, counts, args, cause", [
    (LLAMA3_PP4, [8, 9, 9, 6],
     ["--decoder-first-pipeline-num-layers 8", "--decoder-last-pipeline-num-layers 6"], "to_pipeline's balanced cut"),
    (LLAMA3_PP8, [4, 4, 4, 4, 4, 5, 5, 2],
     ["--pipeline-model-parallel-layout Etttt|tttt|tttt|tttt|tttt|ttttt|ttttt|ttL"], "to_pipeline's balanced cut"),
    (DIMS30_PP4_MEGATRON, [7, 8, 8, 7],
     ["--decoder-first-pipeline-num-layers 7", "--decoder-last-pipeline-num-layers 7"],
     "30 layers do not split evenly over 4 stages"),
], ids=["deepspeed-first-last", "deepspeed-layout-string", "megatron-first-last"])
def test_an_uneven_split_gets_one_why_line_true_to_what_generate_writes(capsys, tmp_path, argv, counts, args,
                                                                         cause):
    data = _plan(capsys, argv)
    best = data["plans"][0]
    assert [s["num_layers"] for s in best["memory"]["per_stage"]] == counts
    lines = _split_lines(best["why"])
    assert len(lines) == 1, best["why"]
    line = lines[0]
    assert line.startswith(f"pipeline stages {'/'.join(map(str, counts))} layers") and cause in line, line
    assert _args_of(line) == args, line
    # the other plans carry only why they lost
    assert all(not _split_lines(p["why"]) for p in data["plans"][1:])

    doc, megatron = _generate(capsys, tmp_path, argv)
    assert _split_lines(doc["why"]) == [line]  # plan.json and the README's why say the same
    assert f"- {line}" in (tmp_path / "run" / "README.md").read_text().splitlines()
    assert [s["num_layers"] for s in doc["memory"]["per_stage"]] == counts
    split_args = [a for a in megatron
                  if a.startswith(("--decoder-first", "--decoder-last", "--pipeline-model-parallel-layout"))]
    assert split_args == args  # exactly what megatron.args carries for the split, no more, no less
    if "--engine" not in argv:  # the deepspeed engine's cut: to_pipeline's, which the estimate priced
        model = get_model("llama-3-8b")
        assert stage_layers(model.num_layers, len(counts), facts=_model_facts(model), seq_len=2048) == counts


def test_an_even_split_or_no_pipeline_gets_no_split_line(capsys):
    even = _plan(capsys, [*LLAMA3_PP4, "--engine", "megatron"])  # 32 layers on 4 stages: 8 each
    assert {s["num_layers"] for s in even["plans"][0]["memory"]["per_stage"]} == {8}
    assert not _split_lines(even["plans"][0]["why"])
    flat = _plan(capsys, ["--model", "llama-3-8b", "--gpus", "8", "--gpu", "a100-80gb", "--seq-len", "2048",
                          "--global-batch", "64", "--pp", "1"])
    assert not _split_lines(flat["plans"][0]["why"])


def test_a_picked_plan_keeps_its_split_line(capsys, tmp_path):
    data = _plan(capsys, LLAMA3_PP4)
    second = data["plans"][1]
    doc, _ = _generate(capsys, tmp_path, LLAMA3_PP4, "--pick", "2")
    assert doc["layout"] == second["layout"]
    counts = "/".join(str(s["num_layers"]) for s in doc["memory"]["per_stage"])
    assert [w.split(" layers")[0] for w in _split_lines(doc["why"])] == [f"pipeline stages {counts}"]


def test_long_pipelines_name_runs_of_equal_stages():
    """Llama-3.1-405B's 126 layers on pp 16 x 2 chunks (``stage_splits``): first 6, then 15 stages of 8."""
    layout = Layout(dp=1, tp=8, pp=16, virtual_stages=2, micro_batch=1, grad_accum=32, first_stage_layers=6,
                    sequence_parallel=True)
    cluster = Cluster(num_nodes=16, gpus_per_node=8, gpu=get_gpu("h100-sxm"), interconnect=get_interconnect("ib-ndr"))
    est = estimate(model=get_model("llama-3.1-405b"), layout=layout, cluster=cluster, engine="megatron",
                   training=Training(seq_len=4096, global_batch=32, precision="bf16"))
    assert [s.num_layers for s in est.memory.per_stage] == [6] + [8] * 15
    line = planner.split_line(layout, est, engine="megatron")
    assert line.startswith("pipeline stages 6, 15 x 8 layers (--decoder-first-pipeline-num-layers 6): "
                           "126 layers do not split evenly over 16 stages x 2 chunks"), line


# --- buckets: the fullest stage as the engine splits it ---------------------------------------------------

PP_HF = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 8, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 4096, "max_position_embeddings": 4096,
         "tie_word_embeddings": False}


@pytest.mark.parametrize("engine, tp", [("deepspeed", 1), ("megatron", 1), ("megatron", 2)])
def test_bucket_holds_the_fullest_stage_the_estimate_prices(engine, tp):
    """8 layers, a 4096 vocabulary, seq 256 on pp 2: the balanced cut is 5 + 3 (the output layer and its
    logits weigh like layers); the even split 4 + 4 would cap the bucket below the first stage's
    parameters, leaving a second call of 1 ms on gloo. Megatron splits 4 + 4 and shards the
    vocabulary by tp (``tp_style="megatron"``), which AutoTP does not."""
    model = family_module("llama").read(dict(PP_HF), name="pp-tiny")
    layout = Layout(dp=1, tp=tp, pp=2, zero_stage=1, micro_batch=1, grad_accum=8, sequence_parallel=tp > 1)
    training = Training(seq_len=256, global_batch=8, precision="bf16")
    cluster = Cluster(num_nodes=1, gpus_per_node=2 * tp, gpu=get_gpu("cpu"))
    buffers, why = choose_buffers(model=model, layout=layout, training=training, cluster=cluster, engine=engine)
    est = estimate(model=model, layout=layout, training=training, cluster=cluster, buffers=buffers, engine=engine)
    counts = [s.num_layers for s in est.memory.per_stage]
    assert counts == ([5, 3] if engine == "deepspeed" else [4, 4])
    tp_style = "megatron" if engine == "megatron" else "autotp"
    fullest = max(rank_params(model, layout, stage=i, seq_len=256, tp_style=tp_style) for i in range(2))
    assert fullest == max(s.params_bytes for s in est.memory.per_stage) / 2  # bf16: the estimate's own count
    assert buffers.reduce_bucket_size == fullest + fullest % 2  # one bucket, exactly the fullest stage
    assert "capped by all" in why[0]


def test_plan_writes_the_bucket_of_the_fullest_stage(capsys, tmp_path):
    argv = ["--num-layers", "8", "--hidden-size", "64", "--num-heads", "4", "--vocab-size", "4096", "--gpus", "2",
            "--gpu", "cpu", "--seq-len", "256", "--global-batch", "8", "--pp", "2", "--zero", "1"]
    out = tmp_path / "run"
    assert main(["generate", *argv, "--output", str(out)]) == 0, capsys.readouterr().err
    doc = json.loads((out / "plan.json").read_text())
    ds = json.loads((out / "ds_config.json").read_text())
    stages = doc["memory"]["per_stage"]
    assert [s["num_layers"] for s in stages] == [5, 3]
    assert ds["zero_optimization"]["reduce_bucket_size"] == max(s["params_bytes"] for s in stages) // 2


# --- dstk export --force ------------------------------------------------------------------------------------

MAKE = MAKE_CHECKPOINT + r"""
old = Path(sys.argv[2])
torch.manual_seed(1)  # an older export of other weights, in shards (model-0000k-of-0000n + index)
LlamaForCausalLM(cfg).save_pretrained(old, max_shard_size="8KB")
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    pytest.importorskip("transformers")
    base = tmp_path_factory.mktemp("h5export")
    subprocess.run([sys.executable, "-c", MAKE, str(base / "ckpt"), str(base / "old")], check=True, timeout=300)
    return base


def test_force_replaces_an_earlier_export_whole(exported, tmp_path, capsys):
    ckpt, old = exported / "ckpt", _tree(exported / "old")
    assert len([n for n in old if n.endswith(".safetensors")]) > 1 and "model.safetensors.index.json" in old
    fresh = tmp_path / "fresh"
    assert main(["export", str(ckpt), "--output", str(fresh)]) == 0, capsys.readouterr().err
    reference = _tree(fresh)
    assert "model.safetensors" in reference and "model.safetensors.index.json" not in reference

    out = tmp_path / "hf"
    out.mkdir()
    for name, data in old.items():
        (out / name).write_bytes(data)
    capsys.readouterr()
    assert main(["export", str(ckpt), "--output", str(out)]) == 2  # still refused without --force
    err = capsys.readouterr().err
    assert "not empty" in err and "--force" in err
    assert _tree(out) == old

    assert main(["export", str(ckpt), "--output", str(out), "--force"]) == 0, capsys.readouterr().err
    assert _tree(out) == reference  # exactly the new files: no old shard or index beside them
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh", "hf"]  # no temporary sibling left
    # and again over itself (the export just written is an earlier export now)
    assert main(["export", str(ckpt), "--output", str(out), "--force"]) == 0
    assert _tree(out) == reference


@pytest.mark.parametrize("case", ["not-an-export", "has-subdirectories", "holds-the-checkpoint"])
def test_force_refuses_what_is_not_an_earlier_export(exported, tmp_path, capsys, case):
    import shutil

    ckpt = exported / "ckpt"
    if case == "holds-the-checkpoint":
        out = tmp_path / "work"
        shutil.copytree(ckpt, out / "ckpt")
        (out / "config.json").write_text((ckpt / "config.json").read_text())
        ckpt = out / "ckpt"
        words = "holds the checkpoint"
    else:
        out = tmp_path / "hf"
        out.mkdir()
        (out / "notes.txt").write_text("mine\n")
        words = "has no config.json"
        if case == "has-subdirectories":
            (out / "config.json").write_text((ckpt / "config.json").read_text())
            (out / "src").mkdir()
            (out / "src" / "main.py").write_text("print()\n")
            words = "holds directories (src)"
    before = _tree(out)
    assert main(["export", str(ckpt), "--output", str(out), "--force"]) == 2
    err = capsys.readouterr().err
    assert words in err and "fix:" in err, err
    assert _tree(out) == before
