"""dstk finetune, unit tier: data order, packing, split, checkpoint publishing, progress text, and
bad input refused before any process starts (the real datasets/tokenizers/transformers, no ranks)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dstk.cli import main
from dstk.train import checkpoint as ckpt
from dstk.train.data import epoch_order, pack, rank_micro_batches, split_indices, step_blocks
from dstk.train.prepare import effective_config
from dstk.train.progress import format_progress

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "intents" / "tiny-llama-cpu.yaml"
CORPUS = ROOT / "templates" / "corpus" / "harbour-notes.txt"


def test_pack_joins_documents_with_eos_and_drops_the_tail():
    blocks = pack([[1, 2, 3], [], [4, 5]], seq_len=2, eos_id=0)
    assert blocks == [[1, 2], [3, 0], [4, 5]]  # stream 1 2 3 0 4 5 0: the last 0 does not fill a block


def test_split_is_seeded_disjoint_and_keeps_one_of_each():
    train, ev = split_indices(100, eval_fraction=0.05, seed=3)
    assert len(ev) == 5 and not set(train) & set(ev) and sorted(train + ev) == list(range(100))
    assert (train, ev) == split_indices(100, eval_fraction=0.05, seed=3)
    assert split_indices(100, eval_fraction=0.05, seed=4) != (train, ev)
    assert split_indices(2, eval_fraction=0.01, seed=0)[1] != []
    assert split_indices(1, eval_fraction=0.5, seed=0) == ([0], [])


def test_step_order_is_a_function_of_the_step_and_covers_each_epoch_once():
    n, gb = 10, 4
    stream = [b for s in range(5) for b in step_blocks(s, num_blocks=n, global_batch=gb, seed=7)]
    assert sorted(stream[:10]) == list(range(10)) and sorted(stream[10:20]) == list(range(10))
    assert stream[:10] == epoch_order(n, epoch=0, seed=7)
    # resuming at step 3 gives the batch the uninterrupted run had at step 3
    assert step_blocks(3, num_blocks=n, global_batch=gb, seed=7) == stream[12:16]


def test_micro_batches_partition_the_step_over_ranks():
    blocks = list(range(12))
    parts = [rank_micro_batches(blocks, dp_rank=r, dp=2, micro_batch=3, grad_accum=2) for r in range(2)]
    flat = sorted(b for p in parts for mb in p for b in mb)
    assert flat == blocks and all(len(mb) == 3 for p in parts for mb in p)


def test_checkpoint_is_complete_or_absent(tmp_path):
    assert ckpt.newest_complete(tmp_path) is None
    (tmp_path / ckpt.temp_tag_for(5)).mkdir()
    ckpt.publish(tmp_path, step=5, meta={"world_size": 2})
    assert ckpt.newest_complete(tmp_path) == (5, "step-000005")
    assert (tmp_path / "latest").read_text() == "step-000005"
    # a crash while writing step 10: its temporary tag exists, unmarked; step 5 stays the newest
    (tmp_path / ckpt.temp_tag_for(10)).mkdir()
    (tmp_path / ckpt.temp_tag_for(10) / "mp_rank_00_model_states.pt").write_bytes(b"half")
    assert ckpt.newest_complete(tmp_path) == (5, "step-000005")
    # a renamed tag without the marker (never produced by publish) is not trusted either
    (tmp_path / "step-000020").mkdir()
    assert ckpt.newest_complete(tmp_path) == (5, "step-000005")
    assert [p.name for p in ckpt.remove_partial(tmp_path)] == [".tmp-step-000010"]


def test_progress_line_has_loss_throughput_lr_and_eta():
    line = format_progress(step=5, num_steps=10, loss=4.32109, tokens_per_second=1234.0, lr=1e-3,
                           elapsed_seconds=30)
    assert line == "[##########..........] 5/10 loss 4.3211 1.2k tok/s lr 1.00e-03 00:30<00:30"


def test_effective_config_adds_the_monitor_and_says_what_it_changed(tmp_path):
    base = {"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 20, "warmup_num_steps": 2}}}
    out, notes = effective_config(base, num_steps=40, metrics_dir=str(tmp_path))
    assert out["csv_monitor"] == {"enabled": True, "output_path": str(tmp_path), "job_name": "csv"}
    assert out["scheduler"]["params"]["total_num_steps"] == 40 and base["scheduler"]["params"]["total_num_steps"] == 20
    assert len(notes) == 1 and "20 -> 40" in notes[0]


def test_a_warm_up_longer_than_the_run_is_clipped_and_said():
    """A generated plan warms up for 100 steps; `--steps 40` must not fail, nor leave the lr below
    its peak for the whole run: the warm-up becomes a tenth of the run, with a note."""
    base = {"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 1000, "warmup_num_steps": 100}}}
    out, notes = effective_config(base, num_steps=40, metrics_dir="m")
    assert out["scheduler"]["params"]["warmup_num_steps"] == 4
    assert base["scheduler"]["params"]["warmup_num_steps"] == 100
    assert any("warmup_num_steps 100 -> 4" in n for n in notes), notes
    out, notes = effective_config(base, num_steps=1000, metrics_dir="m")
    assert out["scheduler"]["params"]["warmup_num_steps"] == 100 and not any("warmup" in n for n in notes)
    # Under 10 steps a tenth is 0, which DeepSpeed's warm-up schedulers reject: 1 step.
    out, notes = effective_config(base, num_steps=5, metrics_dir="m")
    assert out["scheduler"]["params"]["warmup_num_steps"] == 1 and any("100 -> 1 " in n for n in notes)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan") / "run"
    assert main(["generate", str(EXAMPLE), "--output", str(out)]) == 0
    return out


def _finetune(run_dir, out, *extra, data=(str(CORPUS),)):
    return main(["finetune", "--plan", str(run_dir), "--data", *data, "--output", str(out), *extra])


@pytest.mark.parametrize("case", ["missing", "empty", "column", "model-no-config", "more-ranks", "mixed"])
def test_bad_input_is_refused_before_any_rank_starts(case, run_dir, tmp_path, capsys):
    out = tmp_path / "out"
    extra, data = [], [str(CORPUS)]
    if case == "missing":
        data, code, words = [str(tmp_path / "nope.jsonl")], 2, "not found"
    elif case == "empty":
        (tmp_path / "empty.jsonl").write_text("")
        data, code, words = [str(tmp_path / "empty.jsonl")], 1, "is empty"
    elif case == "column":
        (tmp_path / "d.jsonl").write_text(json.dumps({"body": "hello there"}) + "\n")
        data, extra, code, words = [str(tmp_path / "d.jsonl")], ["--text-field", "text"], 1, "no column 'text'"
    elif case == "model-no-config":
        (tmp_path / "ckpt").mkdir()
        extra, code, words = ["--model", str(tmp_path / "ckpt")], 1, "no config.json"
    elif case == "more-ranks":
        extra, code, words = ["--ranks", "1"], 1, "plan is for 2 ranks"
    else:
        (tmp_path / "d.csv").write_text("text\nhi\n")
        data, code, words = [str(CORPUS), str(tmp_path / "d.csv")], 2, "mixes file types"
    assert _finetune(run_dir, out, *extra, data=data) == code
    err = capsys.readouterr().err
    assert words in err and "fix:" in err and "Traceback" not in err
    assert not out.exists()  # nothing was prepared, nothing handed to ranks


def test_hf_trainer_refuses_a_pipeline_plan(tmp_path, capsys):
    run = tmp_path / "pp"
    assert main(["generate", str(EXAMPLE), "--pp", "2", "--output", str(run)]) == 0
    assert _finetune(run, tmp_path / "o", "--trainer", "hf", "--prepare-only") == 1
    assert "pipeline engine" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # refused after tokenizing: the half-prepared directory is gone


def test_multi_node_plan_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["generate", str(EXAMPLE), "--nodes", "2", "--gpus-per-node", "1", "--output", str(out)]) == 0
    assert _finetune(out, tmp_path / "o") == 1
    assert "2 nodes" in capsys.readouterr().err


def test_prepare_only_writes_a_spec_the_ranks_can_read(run_dir, tmp_path, capsys):
    out = tmp_path / "out"
    (tmp_path / "pr.jsonl").write_text("".join(
        json.dumps({"q": f"What is {i} plus {i}?", "a": f"It is {2 * i}."}) + "\n" for i in range(200)))
    assert _finetune(run_dir, out, "--prompt-field", "q", "--response-field", "a", "--epochs", "1",
                     "--prepare-only", data=[str(tmp_path / "pr.jsonl")]) == 0
    import torch

    from dstk.train.spec import TrainSpec

    spec = TrainSpec.load(out / "finetune.json")
    train = torch.load(spec.train_blocks)
    assert train.shape[1] == 64 and spec.world_size == 2 and spec.precision == "bf16"
    assert spec.num_steps == math.ceil(train.shape[0] / 8)  # one epoch of 8-sequence steps
    ds = json.loads(Path(spec.ds_config).read_text())
    assert ds["csv_monitor"]["enabled"] and ds["scheduler"]["params"]["total_num_steps"] == spec.num_steps
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(spec.tokenizer_dir)
    text = tok.decode(train[0].tolist())
    assert "plus" in text and len(tok) <= 512
    assert _finetune(run_dir, out, "--prepare-only", data=[str(tmp_path / "pr.jsonl")]) == 2  # not over a run
    assert "--resume" in capsys.readouterr().err


def test_intent_is_planned_into_the_output_and_resume_needs_only_the_output(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["finetune", "--intent", str(EXAMPLE), "--data", str(CORPUS), "--output", str(out),
                 "--steps", "5", "--prepare-only"]) == 0
    from dstk.train.spec import TrainSpec

    spec = TrainSpec.load(out / "finetune.json")
    assert Path(spec.run_dir) == (out / "plan").resolve()
    assert json.loads((out / "plan" / "plan.json").read_text())["layout"]["dp"] == 2
    assert main(["finetune", "--output", str(out), "--resume", "--prepare-only"]) == 0
    assert TrainSpec.load(out / "finetune.json").resume is True
    assert main(["finetune", "--output", str(out), "--resume", "--steps", "9", "--prepare-only"]) == 1
    assert "differs" in capsys.readouterr().err


def test_bundled_corpus_is_shipped_small_and_one_paragraph_a_line():
    from dstk.train.data import bundled_corpus

    path = bundled_corpus()
    lines = path.read_text(encoding="utf-8").splitlines()
    assert path.samefile(CORPUS) and 50 <= len(lines) and path.stat().st_size < 300_000
    assert all(line.strip() for line in lines)


def test_prompt_response_uses_the_chat_template_when_the_tokenizer_has_one(tmp_path):
    from dstk.train.data import render
    from dstk.train.tokenizer import train_tokenizer

    tok = train_tokenizer(["hello there, how are you today"] * 20, vocab_size=300, output_dir=tmp_path / "tok")
    record = {"q": "Where is the pier?", "a": "Past the slipway."}
    assert render(record, tokenizer=tok, text_field="text", prompt_field="q", response_field="a") == \
        "Where is the pier?\n\nPast the slipway."
    tok.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}")
    assert render(record, tokenizer=tok, text_field="text", prompt_field="q", response_field="a") == \
        "<|user|>Where is the pier?\n<|assistant|>Past the slipway.\n"
    ids = tok("Where is the pier?")["input_ids"]
    assert tok.decode(ids) == "Where is the pier?" and max(ids) < 300


def test_plan_flags_on_finetune_plan_into_the_output(tmp_path, capsys):
    """`dstk finetune --model tiny-llama --data D --gpus 2 --zero 2 --output O` plans as `generate`
    would (CPU ranks here), with fine-tune-sized defaults said on stderr, and the plan's warm-up
    clipped to the run."""
    out = tmp_path / "out"
    assert main(["finetune", "--model", "tiny-llama", "--data", str(CORPUS), "--gpus", "2", "--zero", "2",
                 "--output", str(out), "--steps", "40", "--prepare-only"]) == 0
    err = capsys.readouterr().err
    assert "CPU ranks" in err and "--seq-len 128 --global-batch 8" in err, err
    plan = json.loads((out / "plan" / "plan.json").read_text())
    assert plan["layout"]["dp"] == 2 and plan["layout"]["zero_stage"] == 2, plan["layout"]
    assert plan["cluster"]["gpu"] == "cpu" and plan["training"]["seq_len"] == 128
    assert plan["model"]["num_layers"] == 2 and plan["model"]["hidden_size"] == 64
    ds = json.loads((out / "ds_config.json").read_text())
    assert ds["scheduler"]["params"]["total_num_steps"] == 40
    assert ds["scheduler"]["params"]["warmup_num_steps"] < 40


def test_plan_flags_with_a_fixed_plan_are_refused(run_dir, tmp_path, capsys):
    assert _finetune(run_dir, tmp_path / "o", "--zero", "3", "--gpus", "2", "--prepare-only") == 2
    err = capsys.readouterr().err
    assert "--zero" in err and "--gpus" in err and "drop --plan" in err, err
    assert not (tmp_path / "o").exists()
