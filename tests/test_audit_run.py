"""A user's stopped fine-tune: what it says it kept, what a terminal shows after Ctrl-C, and exporting it.

Found by using ``dstk finetune`` as an ML engineer does (a tiny HF model directory with its tokenizer, 2 CPU
ranks):

- Ctrl-C on a terminal printed 143 lines: every rank's and the runner's ``KeyboardInterrupt`` traceback (5),
  then ``interrupted``, and nothing about what was kept. Now the ranks' KeyboardInterrupt tracebacks stay in
  the log (``RunSink``), and a stopped or failed run says its newest complete checkpoint and the command that
  goes on from it, or that there is none (``--save-every`` defaults to 0: checkpoints only at the end).
- SIGTERM (``kill``, a CI job's cancel) printed the log's last 20 lines, as after a failure, though nothing
  failed: now only a failure does.
- ``dstk export OUT/checkpoints`` of a run started from ``--model HF_DIR`` and stopped before its end said
  "no HF config.json found": the config is in HF_DIR (finetune.json's ``model_source``), now read from there.
  ``dstk export OUT`` (the run directory) said the same and now exports OUT/checkpoints; a missing checkpoint
  directory had no fix line; a LoRA run's checkpoints failed with a fix (``--config``) that could not work.
- ``--resume`` of a finished run said "continuing at step 401" of 400, then nothing.
- ``--plan RUN --model HF_DIR`` trained another model than the plan priced without a word.
- A .jsonl syntax error was "DatasetGenerationError: An error occurred while generating the dataset".
- A long run with ``--save-every 0`` (the default) was not told that a stop keeps nothing.
- ``dstk upgrade LINK --write`` replaced the symbolic link by a file and left its target on the old keys.
- ``--launcher slurm`` without hosts did not say how to get them inside an allocation.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dstk.cli import main
from dstk.train import checkpoint as ckpt
from dstk.train.logs import RunSink
from tests.launch_support import hangup_default, run_env, save_tiny_hf_model

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "templates" / "corpus" / "harbour-notes.txt"


def _publish(out: Path, *steps: int) -> None:
    root = out / "checkpoints"
    for step in steps:
        (root / ckpt.temp_tag_for(step)).mkdir(parents=True)
        ckpt.publish(root, step=step, meta={})


@pytest.mark.parametrize("steps, save_every, words", [
    ((), 0, ["no complete checkpoint in", "only at the end (--save-every 0)", "trains again from step 1",
             "--save-every N"]),
    ((), 50, ["no complete checkpoint in", "the first was due at step 50 (--save-every 50)"]),
    ((100, 200), 100, ["the newest complete checkpoint is step 200 of 3000", "step-000200",
                       "`dstk finetune --resume --output OUT` goes on from step 201"]),
    ((1000, 3000), 1000, ["the run trained all 3000 steps", "step-003000", "evaluates and exports it"]),
], ids=["none-save-every-0", "none-yet", "mid-run", "all-steps"])
def test_stopped_note_names_the_newest_complete_checkpoint_and_the_command(tmp_path, steps, save_every, words):
    out = tmp_path / "OUT"
    _publish(out, *steps)
    (out / "checkpoints" / ckpt.temp_tag_for(2900)).mkdir(parents=True, exist_ok=True)  # a half-written one
    note = ckpt.stopped_note(out, num_steps=3000, save_every=save_every).replace(str(out), "OUT")
    for w in words:
        assert w in note, note
    assert "2900" not in note


def test_stopped_note_reads_the_hf_trainers_checkpoints(tmp_path):
    root = tmp_path / "OUT" / "checkpoints"
    (root / "checkpoint-40").mkdir(parents=True)
    (root / "checkpoint-40" / "trainer_state.json").write_text("{}")
    (root / "checkpoint-60").mkdir()  # no trainer_state.json: the Trainer was stopped while writing it
    note = ckpt.stopped_note(tmp_path / "OUT", num_steps=100, save_every=20, trainer="hf")
    assert "step 40 of 100" in note and "checkpoint-40" in note and "from step 41" in note, note
    assert "no complete checkpoint" in ckpt.stopped_note(tmp_path / "none", num_steps=100, save_every=20,
                                                         trainer="hf")


TRACEBACK = ["[rank 0] [rank0]: Traceback (most recent call last):\n",
             '[rank 0] [rank0]:   File "worker.py", line 350, in main\n',
             "[rank 0] [rank0]:     batch = train[idx].to(device)\n",
             "[rank 0] [rank0]:             ^^^^^^^^^^^^^^^^^^^^^\n",
             "[rank 0] \n"]


def _sink(verbose: bool = False) -> tuple[RunSink, io.StringIO, io.StringIO, io.StringIO]:
    log, out, err = io.StringIO(), io.StringIO(), io.StringIO()
    return RunSink(log=log, verbose=verbose, live=False, out=out, err=err), log, out, err


def test_a_ranks_keyboard_interrupt_traceback_stays_in_the_log():
    sink, log, out, err = _sink()
    for line in TRACEBACK + ["[rank 0] [rank0]: KeyboardInterrupt\n"]:
        sink("stderr", line)
    sink("stderr", "dstk: stopped\n")
    sink.close()
    assert err.getvalue() == "dstk: stopped\n" and out.getvalue() == ""
    assert log.getvalue().count("Traceback") == 1 and "KeyboardInterrupt" in log.getvalue()


def test_any_other_traceback_is_shown_whole_and_in_order():
    sink, log, out, err = _sink()
    sink("stderr", "[rank 1] step 3 loss 5.0\n")
    for line in TRACEBACK:
        sink("stderr", line)
    sink("stderr", "[rank 1] [rank1]: other rank's line\n")  # another rank's lines are not held
    assert "Traceback" not in err.getvalue() and "other rank's line" in err.getvalue()
    sink("stderr", "[rank 0] [rank0]: RuntimeError: CUDA out of memory\n")
    sink("stderr", "[rank 0] more of the message\n")
    assert err.getvalue().endswith("".join(TRACEBACK) + "[rank 0] [rank0]: RuntimeError: CUDA out of memory\n"
                                   "[rank 0] more of the message\n")
    # a traceback cut short (the rank died while printing it) is shown when the launch ends
    sink("stderr", TRACEBACK[0])
    sink("stderr", TRACEBACK[1])
    assert err.getvalue().count("Traceback") == 1
    sink.close()
    assert err.getvalue().count("Traceback") == 2 and err.getvalue().endswith(TRACEBACK[1])


def test_verbose_shows_every_line_as_it_comes_and_interrupt_hides_the_ranks_lines():
    sink, _, _, err = _sink(verbose=True)
    for line in TRACEBACK + ["[rank 0] [rank0]: KeyboardInterrupt\n"]:
        sink("stderr", line)
    assert err.getvalue() == "".join(TRACEBACK) + "[rank 0] [rank0]: KeyboardInterrupt\n"
    sink, log, _, err = _sink()
    sink.interrupt()  # dstk.launch.run calls it on KeyboardInterrupt: the runner's traceback comes later
    sink("stderr", "Traceback (most recent call last):\n")
    sink("stderr", '  File "runner.py", line 634, in main\n')
    sink("stderr", "KeyboardInterrupt\n")
    sink("stderr", "dstk: the newest complete checkpoint is step 2\n")
    assert err.getvalue() == "dstk: the newest complete checkpoint is step 2\n"
    assert "runner.py" in log.getvalue()


def test_only_dstks_own_stop_line_marks_a_run_stopped_not_failed():
    sink, *_ = _sink()
    sink("stderr", "[rank 0] dstk: stopped by SIGTERM: a rank's own print\n")
    assert not sink.stopped
    sink("stderr", "dstk: stopped by SIGTERM: stopped this run's processes on this machine (5 processes)\n")
    assert sink.stopped


def test_export_refuses_a_missing_checkpoint_directory_with_a_fix(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nope"), "--output", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert "nope does not exist" in err and "fix: " in err and "OUTPUT/checkpoints" in err and "Traceback" not in err


def test_finetune_model_config_is_the_runs_model_source_only_where_nothing_else_is(tmp_path):
    from dstk.train.integrity import finetune_model_config

    model, out = tmp_path / "hf", tmp_path / "OUT"
    model.mkdir()
    (model / "config.json").write_text("{}")
    _publish(out, 10)
    assert finetune_model_config(out / "checkpoints") is None  # no finetune.json: not a finetune run
    (out / "finetune.json").write_text(json.dumps({"model_source": str(model)}))
    assert finetune_model_config(out / "checkpoints") == str(model)
    (out / "prepared" / "model_config").mkdir(parents=True)
    (out / "prepared" / "model_config" / "config.json").write_text("{}")  # a preset's run: export finds this one
    assert finetune_model_config(out / "checkpoints") is None


# --- a real run: 2 CPU ranks ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory) -> Path:
    """A tiny Llama saved with save_pretrained, with a tokenizer of its own: what a user's --model HF_DIR is."""
    return save_tiny_hf_model(tmp_path_factory.mktemp("hf-model"))


def _env() -> dict:
    return run_env()


def _stop_at(argv: list[str], *, step: int, stop) -> tuple[int, str]:
    """Start ``dstk finetune`` (``argv``) in a session of its own, read its output until the progress line
    of ``step`` or later, call ``stop(proc)``, and return (exit code, everything it printed)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(), cwd=ROOT,
                            start_new_session=True, preexec_fn=hangup_default)
    text = ""
    try:
        for line in proc.stdout:
            text += line
            m = re.search(r" (\d+)/100000 loss", line)
            if m and int(m.group(1)) >= step:
                break
        stop(proc)
        text += proc.stdout.read()
        return proc.wait(timeout=120), text
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.distributed
def test_ctrl_c_says_where_to_resume_then_export_and_resume_go_on_from_there(hf_model, tmp_path):
    """Ctrl-C (SIGINT to the whole group, as a terminal sends it) once step 250 has printed, with a checkpoint
    every 100 steps: exit 130, no traceback on the terminal, the note names the newest checkpoint (step 200,
    or 300 when the ranks save it before the signal reaches them); ``dstk export OUT`` of the stopped run
    loads with from_pretrained; ``--resume`` goes on from the step after it, and a SIGTERM past the next save
    names that one."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / "out"
    argv = [sys.executable, "-m", "dstk.cli", "finetune", "--model", str(hf_model), "--data", str(CORPUS),
            "--gpus", "2", "--zero", "2", "--output", str(out), "--steps", "100000", "--save-every", "100",
            "--log-every", "50"]
    rc, text = _stop_at(argv, step=250, stop=lambda proc: os.killpg(proc.pid, signal.SIGINT))  # as Ctrl-C
    assert rc == 130, text[-4000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-4000:]
    # after the last progress line only dstk's own lines (the runner's chained traceback says "During handling")
    after = text[text.rindex("/100000 loss"):].splitlines()[1:]
    assert after and all(line.startswith("dstk: ") or line == "interrupted" for line in after), text[-4000:]
    # The ranks go on while the signal travels: under load they may save step 300 before they stop. The
    # note must name the newest checkpoint there is, whichever that is.
    m = re.search(r"dstk: the newest complete checkpoint is step (\d+) of 100000 \((.+?)\); "
                  r"`dstk finetune --resume --output (.+?)` goes on from step (\d+)\n", text)
    assert m, text[-4000:]
    saved = int(m.group(1))
    assert saved >= 200 and saved % 100 == 0 and int(m.group(4)) == saved + 1, text[-4000:]
    assert m.group(2) == f"{out}/checkpoints/step-{saved:06d}" and m.group(3) == str(out), text[-4000:]
    assert max(int(d.name.removeprefix("step-")) for d in (out / "checkpoints").glob("step-*")) >= saved
    assert "Traceback" in (out / "logs" / "launch.log").read_text()  # kept in the log

    done = subprocess.run([sys.executable, "-m", "dstk.cli", "export", str(out), "--output", str(tmp_path / "hf")],
                          capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"the model config: {hf_model}" in done.stderr and f"step-{saved:06d}" in done.stdout
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert model.config.hidden_size == 64

    # resume, then stop again by SIGTERM to dstk alone (kill): no failure tail, the note moves on
    rc, text = _stop_at([sys.executable, "-m", "dstk.cli", "finetune", "--output", str(out), "--resume"],
                        step=saved + 150,  # past the next save (saved + 100)
                        stop=lambda proc: proc.send_signal(signal.SIGTERM))
    assert rc == 143, text[-4000:]
    assert (f"resumed from {out}/checkpoints/step-{saved:06d} (step {saved}); continuing at step {saved + 1}"
            in text), text[-4000:]
    assert "the last 20 lines" not in text, text[-4000:]
    m = re.search(r"dstk: the newest complete checkpoint is step (\d+) of 100000 .*goes on from step (\d+)\n", text)
    assert m and int(m.group(1)) > saved and int(m.group(2)) == int(m.group(1)) + 1, text[-4000:]


@pytest.mark.parametrize("nodes", [1, 2])
def test_launcher_slurm_without_hosts_says_how_to_make_them_from_the_allocation(nodes, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["generate", str(ROOT / "examples" / "intents" / "tiny-llama-cpu.yaml"), "--nodes", str(nodes),
                 "--output", str(run)]) == 0
    capsys.readouterr()
    assert main(["launch", str(run), "--launcher", "slurm", "--dry-run", "--", "train.py"]) == 1
    err = capsys.readouterr().err
    assert ("scontrol show hostnames \"$SLURM_JOB_NODELIST\" | sed 's/$/ slots=2/' > hosts, then --hostfile hosts"
            in err), err
    # the hint's hostfile is one the launch takes
    (tmp_path / "hosts").write_text("".join(f"w{i} slots=2\n" for i in range(nodes)))
    assert main(["launch", str(run), "--launcher", "slurm", "--hostfile", str(tmp_path / "hosts"), "--dry-run",
                 "--", "train.py"]) == 0
    assert "--launcher slurm" in capsys.readouterr().out


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("tiny") / "run"
    assert main(["generate", str(ROOT / "examples" / "intents" / "tiny-llama-cpu.yaml"), "--output", str(run)]) == 0
    return run


@pytest.mark.parametrize("name, content, code, words", [
    ("bad.jsonl", '{"text": "a"}\n\n{"text": broken}\n', 1, "bad.jsonl:3:10: not a JSON object (Expecting value)"),
    ("bad.jsonl", '{"text": "a"}\n"just a string"\n', 1, "bad.jsonl:2: a JSON str, not an object"),
    ("bad.json", '[{"text": "a"},\n {"text": b}]\n', 1, "bad.json:2:11: not valid JSON (Expecting value)"),
    ("ddir", None, 2, "ddir: a directory, not a data file"),
], ids=["jsonl-syntax", "jsonl-not-an-object", "json-array", "a-directory"])
def test_a_bad_data_file_is_named_with_its_line(tiny_run, tmp_path, capsys, name, content, code, words):
    """datasets said only "DatasetGenerationError: An error occurred while generating the dataset" (and a
    directory was "data file not found")."""
    data = tmp_path / name
    if content is None:
        data.mkdir()
    else:
        data.write_text(content)
    capsys.readouterr()
    assert main(["finetune", "--plan", str(tiny_run), "--data", str(data), "--output", str(tmp_path / "out"),
                 "--prepare-only"]) == code
    err = capsys.readouterr().err
    assert words in err and "fix: " in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_json_problem_passes_what_datasets_reads(tmp_path):
    from dstk.train.data import json_problem

    (tmp_path / "a.jsonl").write_text('{"text": "a"}\n\n{"text": "b"}\n')
    (tmp_path / "b.json").write_text('[{"text": "a"}, {"text": "b"}]')
    (tmp_path / "c.json").write_text('{"text": "a"}\n{"text": "b"}\n')  # JSON lines in a .json file
    (tmp_path / "d.txt").write_text("not json at all\n")
    assert [json_problem(tmp_path / n) for n in ("a.jsonl", "b.json", "c.json", "d.txt")] == [None] * 4


def test_export_of_a_lora_runs_checkpoints_says_what_to_use_instead(tmp_path, capsys):
    """It failed with "the checkpoint does not match LlamaForCausalLM: missing [...], unexpected
    ['base_model.model.lm_head.weight', ...]" and "fix: pass --config", which cannot work."""
    out = tmp_path / "OUT"
    _publish(out, 20)
    (out / "finetune.json").write_text(json.dumps({"model_source": str(tmp_path), "lora": {"rank": 8}}))
    assert main(["export", str(out), "--output", str(tmp_path / "hf")]) == 1
    err = capsys.readouterr().err
    assert "holds a LoRA run's checkpoints" in err and f"dstk finetune --resume --output {out}" in err, err
    (out / "adapter").mkdir()
    (out / "adapter" / "adapter_config.json").write_text("{}")
    assert main(["export", str(out / "checkpoints"), "--output", str(tmp_path / "hf")]) == 1
    assert f"fix: use what the run exported: {out / 'adapter'}\n" in capsys.readouterr().err
    (out / "finetune.json").write_text(json.dumps({"model_source": str(tmp_path), "lora": None}))
    main(["export", str(out), "--output", str(tmp_path / "hf")])
    assert "LoRA" not in capsys.readouterr().err


def test_upgrade_write_through_a_symlink_rewrites_its_target_and_keeps_the_link(tmp_path, capsys):
    """``os.replace`` on the link swapped it for a plain file: the target, which other users of the link
    read, stayed on the old keys while dstk said it wrote the file."""
    real, link = tmp_path / "shared" / "ds_config.json", tmp_path / "ds_config.json"
    real.parent.mkdir()
    original = json.dumps({"train_batch_size": 8, "zero_optimization": {"stage": 2, "cpu_offload": True}}, indent=2)
    real.write_text(original)
    link.symlink_to(real)
    assert main(["upgrade", str(link), "--write"]) == 0
    assert link.is_symlink() and link.resolve() == real
    assert json.loads(real.read_text())["zero_optimization"] == {"stage": 2, "offload_optimizer": {"device": "cpu"}}
    assert (real.parent / "ds_config.json.bak").read_text() == original
    assert f"wrote {real} (through the link {link})" in capsys.readouterr().err


def test_summary_of_a_process_that_trained_no_step_says_so():
    from dstk.train.progress import format_summary

    text = format_summary(num_steps=0, first_loss=None, last_loss=None, eval_loss=4.5, tokens=0, elapsed_seconds=0.1,
                          export_dir="out/model", checkpoint=None)
    assert text.splitlines()[0] == "no step left to train: the checkpoint resumed from had every step"
    assert "eval loss 4.5000" in text and "exported HF model: out/model" in text


@pytest.mark.distributed
def test_resume_of_a_finished_run_says_it_had_every_step(tmp_path):
    """It said "resumed from .../step-000004 (step 4); continuing at step 5" of a 4-step run, then nothing
    but the log line: no eval, no export line, no word that the run had already finished."""
    out = tmp_path / "out"
    base = [sys.executable, "-m", "dstk.cli", "finetune", "--output", str(out)]
    done = subprocess.run(base + ["--model", "tiny-llama", "--data", str(CORPUS), "--gpus", "2", "--steps", "4"],
                          capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=600, start_new_session=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    done = subprocess.run(base + ["--resume"], capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=600,
                          start_new_session=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said = done.stdout
    assert (f"resumed from {out}/checkpoints/step-000004 (step 4); that was the last of its 4 steps: evaluating and "
            "exporting it again") in said, said[-3000:]
    assert "continuing at step 5" not in said and "no step left to train" in said, said[-3000:]
    assert "eval loss " in said and f"exported HF model: {out}/model" in said, said[-3000:]


def test_a_model_other_than_the_plans_is_said(tiny_run, tmp_path, capsys):
    """``--plan RUN --model HF_DIR`` trained HF_DIR's model (here 4 x 256, 16x the parameters) on a plan priced
    for RUN's (2 x 64) without a word: its memory figure, the one that says the run fits, is another model's."""
    from transformers import LlamaConfig

    big = tmp_path / "big"
    LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2).save_pretrained(big)
    same = tmp_path / "same"
    LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2).save_pretrained(same)
    capsys.readouterr()
    for model, out in ((big, "o1"), (same, "o2")):
        assert main(["finetune", "--plan", str(tiny_run), "--model", str(model), "--data", str(CORPUS),
                     "--output", str(tmp_path / out), "--prepare-only"]) == 0
        err = capsys.readouterr().err
        if model == big:
            assert (f"warning: --model {big} is not the model the plan in {tiny_run} priced (num_layers 4 vs 2, "
                    "hidden_size 256 vs 64, ffn_hidden_size 512 vs 128)") in err, err
        else:
            assert "warning" not in err, err


def test_model_differences_reads_gpt2_names_and_skips_what_is_not_given():
    from dstk.train.prepare import model_differences

    plan = {"num_layers": 12, "hidden_size": 768, "num_heads": 12, "ffn_hidden_size": 3072, "vocab_size": 50257}
    assert model_differences(plan, {"n_layer": 12, "n_embd": 768, "n_head": 12, "n_inner": None,
                                    "vocab_size": 50257}) == []
    assert model_differences(plan, {"n_layer": 24, "n_embd": 1024, "vocab_size": 50257}) == [
        "num_layers 24 vs 12", "hidden_size 1024 vs 768"]


def test_upgrade_says_when_a_pin_memory_setting_stops_applying(tmp_path, capsys):
    """``cpu_offload_use_pin_memory: true`` next to an explicit ``offload_optimizer`` block: DeepSpeed 0.19.8
    reads it nowhere (``set_new_param: False``) and upgrade removes it; the line says how to keep pinning. Next to
    ``cpu_offload: true`` it moves into the written block, and the line says so."""
    explicit = tmp_path / "explicit.json"
    explicit.write_text(json.dumps({"train_batch_size": 8, "zero_optimization": {
        "stage": 3, "offload_optimizer": {"device": "cpu"}, "cpu_offload_use_pin_memory": True}}))
    assert main(["upgrade", str(explicit)]) == 0
    err = capsys.readouterr().err
    assert 'offload_optimizer runs unpinned: add "pin_memory": true there to pin' in err, err
    legacy = tmp_path / "legacy.json"
    legacy.write_text(json.dumps({"train_batch_size": 8, "zero_optimization": {
        "stage": 3, "cpu_offload": True, "cpu_offload_use_pin_memory": True}}))
    assert main(["upgrade", str(legacy)]) == 0
    err = capsys.readouterr().err
    assert ('deprecated form of \'offload_optimizer: {"device": "cpu", "pin_memory": true}\' (with '
            "cpu_offload_use_pin_memory's true)") in err and "unpinned" not in err, err


def test_a_long_run_without_checkpoints_is_told_at_its_start(tiny_run, tmp_path, capsys):
    """``--save-every`` defaults to 0 (a checkpoint only at the end): a 33-minute run stopped at minute 30 kept
    nothing, and nothing said so before it started."""
    import shutil

    from dstk.train.prepare import unsaved_note

    assert unsaved_note(step_seconds=0.03, num_steps=1000) is None and unsaved_note(step_seconds=None,
                                                                                  num_steps=10**6) is None
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    plan = json.loads((run / "plan.json").read_text())
    plan["time"]["step_seconds"] = 2.0  # as if the plan were for a slower machine
    (run / "plan.json").write_text(json.dumps(plan))
    capsys.readouterr()
    base = ["finetune", "--plan", str(run), "--data", str(CORPUS), "--steps", "1000", "--prepare-only"]
    assert main(base + ["--output", str(tmp_path / "o1")]) == 0
    assert ("note: the plan puts this run at about 33 min (2 s/step x 1000 steps), with a checkpoint only at the end "
            "(--save-every 0): a stop before then keeps nothing; --save-every 300 saves about every 10 min"
            ) in capsys.readouterr().err
    assert main(base + ["--output", str(tmp_path / "o2"), "--save-every", "100"]) == 0
    assert "keeps nothing" not in capsys.readouterr().err


def test_what_cpython_prints_when_a_second_interrupt_cuts_the_first_traceback_stays_in_the_log():
    """Seen in 2 of 6 real Ctrl-C runs under load: the rank wrapper's forwarded SIGINT (and launch.py's
    SIGTERM) hit a rank while it printed its KeyboardInterrupt, and CPython fell back to an object dump."""
    sink, log, out, err = _sink()
    lines = ["[rank 0] Error in sys.excepthook:\n", "[rank 0] \n", "[rank 0] Original exception was:\n",
             "[rank 1] object address  : 0x7fd4d7c552a0\n", "[rank 1] object refcount : 3\n",
             "[rank 1] object type     : 0x7fd51ba521e0\n", "[rank 1] object type name: KeyboardInterrupt\n",
             "[rank 1] object repr     : KeyboardInterrupt()\n", "[rank 1] lost sys.stderr\n",
             "[rank 0] Traceback (most recent call last):\n", '[rank 0]   File "worker.py", line 353, in main\n',
             "[rank 0] KeyboardInterrupt\n", "[rank 0] \n", "dstk: the newest complete checkpoint is step 200\n"]
    for line in lines:
        sink("stderr", line)
    sink.close()
    assert err.getvalue() == "dstk: the newest complete checkpoint is step 200\n", err.getvalue()
    assert log.getvalue() == "".join(lines)
    # the same dump for another exception is shown, whole
    sink, _, _, err = _sink()
    dump = ["[rank 1] object address  : 0x7f\n", "[rank 1] object type name: RuntimeError\n",
            "[rank 1] lost sys.stderr\n"]
    for line in dump:
        sink("stderr", line)
    assert err.getvalue() == "".join(dump)
