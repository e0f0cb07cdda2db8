"""LoRA in the planner and the plan commands: one set of ``--lora-*`` flags for plan, generate,
estimate and finetune; a 70B LoRA plan on one 8-GPU node against a full fine-tune; what generate
writes and ``finetune --plan`` reads back; layouts LoRA cannot run on are refused with a fix."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from dstk import plan as planner
from dstk.cli import main
from dstk.commands import estimate as estimate_cmd
from dstk.commands import finetune as finetune_cmd
from dstk.commands import plan as plan_cmd
from dstk.errors import DstkError
from dstk.intent import intent_from_dict

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "intents" / "tiny-llama-cpu.yaml"
CORPUS = ROOT / "templates" / "corpus" / "harbour-notes.txt"
LORA_FLAGS = ("--lora-rank", "--lora-alpha", "--lora-targets", "--lora-dropout", "--lora-bits")


def _actions(configure) -> dict[str, list[argparse.Action]]:
    parser = argparse.ArgumentParser()
    configure(parser)
    out: dict[str, list[argparse.Action]] = {}
    for action in parser._actions:
        for option in action.option_strings:
            out.setdefault(option, []).append(action)
    return out


def test_lora_flags_are_one_definition_on_plan_generate_estimate_and_finetune():
    """Same names, dests, metavars, choices and help everywhere (the help is the intent field's docstring), each
    defined once on finetune (no second copy of its own)."""
    from dstk.commands import generate as generate_cmd

    commands = {"plan": plan_cmd.configure, "generate": generate_cmd.configure, "estimate": estimate_cmd.configure,
                "finetune": finetune_cmd.configure}
    seen = {name: _actions(configure) for name, configure in commands.items()}
    for flag in LORA_FLAGS:
        defs = {name: actions[flag] for name, actions in seen.items()}
        assert all(len(d) == 1 for d in defs.values()), flag
        shapes = {(d[0].dest, d[0].help, d[0].metavar, tuple(d[0].choices or ())) for d in defs.values()}
        assert len(shapes) == 1, (flag, shapes)
        dest, help_text, *_ = shapes.pop()
        assert dest == "i_training__" + flag[2:].replace("-", "_") and help_text
    assert len(seen["finetune"]["--merge"]) == 1


def test_schema_intent_shows_the_lora_fields(capsys):
    assert main(["schema", "--intent"]) == 0
    training = json.loads(capsys.readouterr().out)["properties"]["training"]["properties"]
    assert {"lora_rank", "lora_alpha", "lora_targets", "lora_dropout", "lora_bits"} <= set(training)
    assert "frozen base" in training["lora_rank"]["description"]


def test_intent_lora_fields_are_checked():
    base = {"model": {"name": "llama-2-7b"}}
    with pytest.raises(DstkError, match="training.lora_alpha: set without training.lora_rank"):
        intent_from_dict({**base, "training": {"lora_alpha": 16}})
    with pytest.raises(DstkError, match="lora_dropout"):
        intent_from_dict({**base, "training": {"lora_rank": 8, "lora_dropout": 1.0}})
    lora = intent_from_dict({**base, "training": {"lora_rank": 8}}).training.to_training().lora
    assert (lora.rank, lora.alpha, lora.targets, lora.dropout, lora.bits) == (8, 16.0, "all-linear", 0.0, None)


# --- the 70B contrast ---------------------------------------------------------------------------

def _plan(**training):
    intent = intent_from_dict({"model": {"name": "llama-3-70b"}, "cluster": {"num_nodes": 1, "gpus_per_node": 8},
                               "training": {"seq_len": 4096, "global_batch": 64, **training}})
    return planner.plan_intent(planner.resolve(intent), top=3)


def test_70b_lora_on_one_node_plans_very_differently_from_a_full_fine_tune():
    """Full fine-tune of 70B on 8 x 80 GB: 16 B/param is 141 GB per GPU even under ZeRO-3, so
    optimizer states must leave for the CPU. LoRA: the frozen bf16 base (17.6 GB per GPU under
    ZeRO-3) and 0.3% of trainable parameters fit on the GPUs, no offload, a faster step; the why
    lines say so and give the full fine-tune's figure for the same layout."""
    full, lora = _plan().plans[0], _plan(lora_rank=16).plans[0]
    assert full.layout.offload_optimizer == "cpu"
    assert lora.layout.offload_optimizer == "none" and lora.layout.offload_params == "none"
    assert lora.layout.zero_stage == 3 and lora.layout.tp == lora.layout.pp == 1
    assert lora.estimate.time.step_seconds < 0.8 * full.estimate.time.step_seconds
    why = lora.why[0]
    assert why.startswith("LoRA: 0.29% of parameters train (rank 16, all-linear); base weights frozen in bf16: "
                          "no gradients or optimizer states for them, partitioned by ZeRO-3")
    need = float(why.rsplit("would need ", 1)[1].split(" GiB")[0])
    assert need > 80 > lora.estimate.memory.per_gpu.total_bytes / 2**30
    assert not any(line.startswith("LoRA") for line in full.why)


def test_lora_layouts_are_data_parallel_only_and_qlora_avoids_zero3():
    result = _plan(lora_rank=8, lora_bits=4)
    assert result.plans and all(p.layout.tp == p.layout.pp == 1 for p in result.plans)
    assert all(p.layout.zero_stage < 3 for p in result.plans)
    assert "4-bit NF4 (QLoRA)" in result.plans[0].why[0]


@pytest.mark.parametrize("argv, words", [
    (["--tp", "2"], "AutoTP and the pipeline engine"),
    (["--engine", "megatron"], "deepspeed engine"),
    (["--lora-bits", "4", "--zero", "3"], "cannot partition bitsandbytes' 4-bit"),
    (["--lora-targets", "q,wq"], "choose from q, k, v, o"),
    (["--lora-dropout", "0.5"], None),
])
def test_plan_refuses_what_finetune_cannot_run(argv, words, capsys):
    rc = main(["plan", "--model", "llama-2-7b", "--gpus", "8", "--lora-rank", "8", *argv])
    err = capsys.readouterr().err
    if words is None:
        assert rc == 0
    else:
        assert rc in (1, 2) and words in err, err


# --- generate -> plan.json -> finetune --plan ---------------------------------------------------

def test_generate_writes_lora_and_finetune_reads_it_back(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["generate", str(EXAMPLE), "--precision", "fp32", "--lora-rank", "4", "--lora-targets", "q,v",
                 "--lora-dropout", "0.05", "--output", str(run)]) == 0
    plan = json.loads((run / "plan.json").read_text())
    assert plan["training"]["lora"] == {"rank": 4, "alpha": 8.0, "targets": "q,v", "dropout": 0.05, "bits": None}
    assert plan["why"][0].startswith("LoRA: 1.3% of parameters train (rank 4, q,v)")
    out = tmp_path / "ft"
    assert main(["finetune", "--plan", str(run), "--data", str(CORPUS), "--output", str(out), "--prepare-only"]) == 0
    spec = json.loads((out / "finetune.json").read_text())
    assert spec["lora"]["rank"] == 4 and spec["lora"]["targets"] == ["self_attn.q_proj", "self_attn.v_proj"]
    assert spec["lora"]["dropout"] == 0.05 and spec["lora"]["alpha"] == 8.0
    capsys.readouterr()
    rc = main(["finetune", "--plan", str(run), "--data", str(CORPUS), "--output", str(tmp_path / "x"),
               "--lora-rank", "8", "--prepare-only"])
    assert rc == 2 and "the run directory's plan has LoRA rank 4" in capsys.readouterr().err


def test_finetune_plans_lora_from_flags_into_its_plan(tmp_path):
    """Without --plan, the --lora-* flags are intent flags: OUTPUT/plan/plan.json carries them."""
    out = tmp_path / "ft"
    assert main(["finetune", "--intent", str(EXAMPLE), "--precision", "fp32", "--data", str(CORPUS),
                 "--output", str(out), "--lora-rank", "4", "--prepare-only"]) == 0
    assert json.loads((out / "plan" / "plan.json").read_text())["training"]["lora"]["rank"] == 4
    assert json.loads((out / "finetune.json").read_text())["lora"]["rank"] == 4


def test_estimate_takes_the_lora_flags(capsys):
    argv = ["estimate", "--model", "llama-3-70b", "--gpus", "8", "--zero", "3", "--seq-len", "4096",
            "--recompute", "full", "--format", "json"]
    assert main(argv) == 0
    full = json.loads(capsys.readouterr().out)
    assert main([*argv, "--lora-rank", "16"]) == 0
    lora = json.loads(capsys.readouterr().out)
    assert lora["training"]["lora"]["rank"] == 16
    assert lora["memory"]["per_gpu"]["optimizer_bytes"] < full["memory"]["per_gpu"]["optimizer_bytes"] / 100
    assert main(["estimate", "--model", "llama-3-70b", "--gpus", "8", "--tp", "2", "--lora-rank", "16"]) == 1  # as plan
    assert "AutoTP" in capsys.readouterr().err
