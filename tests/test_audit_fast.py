"""An outside user's audit of the fast commands (plan, estimate, generate, validate, explain): each
test is a defect found by using them on intents people run, and fails on the code before its fix."""

from __future__ import annotations

import json
import re

from dstk.cli import main


def _run(capsys, argv):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def _buffer_places(text: str) -> list[str]:
    """The place of every buffer line, e.g. ``gpu`` in ``... = 1.2 GiB (gpu, forward)``."""
    flat = re.sub(r"\s*\n\s*", " ", text)
    return re.findall(r"(?:B|iB) \(([^,()]+)[,)]", flat)


def test_cpu_ranks_buffers_are_not_said_to_live_on_a_gpu(tmp_path, capsys):
    """On CPU ranks every buffer is in host memory: the offload staging buffers read "(gpu, ...)"
    in plan, estimate, generate and explain (last session's note)."""
    outputs = []
    _, out, _ = _run(capsys, ["estimate", "--model", "gpt2", "--gpus", "2", "--gpu", "cpu", "--zero", "2",
                              "--offload-optimizer", "cpu", "--seq-len", "1024"])
    outputs.append(out)
    _, out, _ = _run(capsys, ["plan", "--model", "gpt2", "--gpus", "2", "--gpu", "cpu", "--seq-len", "1024",
                              "--offload-optimizer", "cpu", "--top", "1"])
    outputs.append(out)
    run = tmp_path / "run"
    code, out, _ = _run(capsys, ["generate", "--model", "gpt2", "--gpus", "2", "--gpu", "cpu", "--seq-len", "1024",
                                 "--offload-optimizer", "cpu", "--output", str(run)])
    assert code == 0
    outputs.append(out)
    code, out, _ = _run(capsys, ["explain", str(run)])
    assert code == 0
    outputs.append(out)
    for text in outputs:
        places = _buffer_places(text)
        assert places, text
        assert "gpu" not in places, text
        assert "offload copy" in " ".join(places) and "rank's host memory" in places
    # On a GPU the places stay as they were.
    _, out, _ = _run(capsys, ["estimate", "--model", "gpt2", "--gpus", "2", "--gpu", "a100-80gb", "--zero", "2",
                              "--offload-optimizer", "cpu", "--seq-len", "1024"])
    assert {"gpu", "cpu"} <= set(_buffer_places(out))


def _json(capsys, argv):
    code, out, err = _run(capsys, [*argv, "--format", "json"])
    return code, json.loads(out), err


def test_estimate_of_a_generated_config_reproduces_the_plan_or_says_which_flags_do(tmp_path, capsys):
    """`dstk generate` for Llama-3-70B on 64 H100s (seq 4096) picks ZeRO-3 with full recompute,
    71.5 GiB. `dstk estimate --config` of its ds_config.json with the model and GPUs said 531 GiB,
    DOES NOT FIT: a DeepSpeed config carries neither recompute nor the sequence length, and the
    estimate silently took none and 4096 (its own default, not the plan's). Now the notes name the
    plan.json beside the config and the flags that estimate the planned run, and those flags give
    exactly the plan's figures."""
    run = tmp_path / "run"
    argv = ["--model", "llama-3-70b", "--gpus", "64", "--gpu", "h100-sxm"]
    assert _run(capsys, ["generate", *argv, "--seq-len", "4096", "--output", str(run)])[0] == 0
    plan = json.loads((run / "plan.json").read_text())
    assert plan["layout"]["recompute"] == "full"
    config = str(run / "ds_config.json")
    code, est, _ = _json(capsys, ["estimate", "--config", config, *argv])
    assert code == 0
    notes = est["config"]["notes"]
    said = [n for n in notes if "plan.json" in n]
    assert said and "--seq-len 4096" in said[0] and "--recompute full" in said[0], notes
    assert any(n.startswith("recompute none: a DeepSpeed config does not say") for n in notes), notes
    code, est, _ = _json(capsys, ["estimate", "--config", config, *argv, "--seq-len", "4096", "--recompute", "full"])
    assert code == 0
    assert not [n for n in est["config"]["notes"] if "plan.json" in n]
    assert est["memory"]["per_gpu"]["total_bytes"] == plan["memory"]["per_gpu"]["total_bytes"]
    assert est["time"]["step_seconds"] == plan["time"]["step_seconds"]
    # The human header says what was assumed.
    code, out, _ = _run(capsys, ["estimate", "--config", config, *argv])
    assert re.search(r"seq 2048, bf16,\s+recompute none", out), out[:400]


def test_estimate_defaults_to_plans_sequence_length(capsys):
    """Without --seq-len `dstk plan` plans 2048 tokens; `dstk estimate` took min(positions, 4096),
    so Qwen2.5-7B LoRA on 4 A100-40GB read 64.9 GiB, DOES NOT FIT, for the layout the plan put at
    35.4 GiB. Same default now (never past a model's positions: GPT-2 stays at 1024)."""
    code, plan, _ = _json(capsys, ["plan", "--model", "qwen2.5-7b", "--gpus", "4", "--gpu", "a100-40gb",
                                   "--lora-rank", "16", "--top", "1"])
    assert code == 0
    best = plan["plans"][0]
    lay = best["layout"]
    code, est, _ = _json(capsys, ["estimate", "--model", "qwen2.5-7b", "--gpus", "4", "--gpu", "a100-40gb",
                                  "--lora-rank", "16", "--zero", str(lay["zero_stage"]),
                                  "--micro-batch", str(lay["micro_batch"]),
                                  "--global-batch", str(lay["micro_batch"] * lay["grad_accum"] * lay["dp"])])
    assert code == 0
    assert est["training"]["seq_len"] == 2048
    # The buffers differ (the plan sizes ZeRO's buckets, a bare estimate takes DeepSpeed's 5e8 defaults);
    # the activations are the sequence length's.
    assert est["memory"]["per_gpu"]["activations_bytes"] == best["memory"]["per_gpu"]["activations_bytes"]
    code, est, _ = _json(capsys, ["estimate", "--model", "gpt2", "--gpus", "2", "--gpu", "cpu"])
    assert est["training"]["seq_len"] == 1024
    assert any(n.startswith("seq_len 1,024: the default") for n in est["notes"]), est["notes"]


def test_a_loss_line_never_blames_recompute_the_winner_also_uses(capsys):
    """Llama-3-70B on 64 H100s: the winner is ZeRO-3 with recompute=full, and the best tensor-parallel
    layout's line read "1.16x the winner; it needs recompute=full to fit", which cannot be why it
    is slower. It now names the terms that are larger, with the winner's figures beside them."""
    code, data, _ = _json(capsys, ["plan", "--model", "llama-3-70b", "--gpus", "64", "--gpu", "h100-sxm",
                                   "--seq-len", "4096", "--top", "1"])
    assert code == 0
    best = data["plans"][0]
    assert best["layout"]["recompute"] == "full"
    why = best["why"]
    assert not [line for line in why if "it needs recompute=full to fit" in line], why
    tp = [line for line in why if line.startswith("tensor parallel (")]
    assert tp and "recompute=full" in tp[0], why
    compute = best["time"]["compute_seconds"]
    assert re.search(r"; compute [\d.]+ s.*\(the winner: " + re.escape(f"{compute:.3g}") + " s", tp[0]), tp[0]


def test_the_layout_a_tie_passed_over_is_explained_once(capsys):
    """Qwen2.5-7B LoRA on one A100-40GB: "chosen over dp=1 ZeRO-1 micro 1 x 512 (as fast, within 3%):
    ZeRO-0 instead of ZeRO-1" was followed by "ZeRO-1 (dp=1 ZeRO-1 micro 1 x 512): ... within 3%, and
    ZeRO-0 instead of ZeRO-1 wins the tie", the same layout and reason twice."""
    code, data, _ = _json(capsys, ["plan", "--model", "qwen2.5-7b", "--gpus", "1", "--gpu", "a100-40gb",
                                   "--lora-rank", "16", "--top", "1"])
    assert code == 0
    why = data["plans"][0]["why"]
    chosen = [re.match(r"chosen over (.+?) \(", line).group(1) for line in why if line.startswith("chosen over ")]
    assert chosen, why
    for layout in chosen:
        assert sum(f"({layout})" in line or f"over {layout} (" in line for line in why) == 1, why


def test_a_run_directory_given_as_a_config_names_the_file_in_it(tmp_path, capsys):
    """`dstk validate RUN_DIR` / `dstk estimate --config RUN_DIR` said only "is a directory" with
    "check the path"; a run directory holds the file the user meant."""
    run = tmp_path / "run"
    assert _run(capsys, ["generate", "--model", "gpt2", "--gpus", "2", "--gpu", "cpu", "--seq-len", "1024",
                         "--output", str(run)])[0] == 0
    code, _, err = _run(capsys, ["validate", str(run)])
    assert code == 2 and f"validate {run / 'ds_config.json'}" in err and "Traceback" not in err
    code, _, err = _run(capsys, ["estimate", "--config", str(run), "--model", "gpt2", "--gpus", "2"])
    assert code == 2 and f"--config {run / 'ds_config.json'}" in err and "Traceback" not in err
    # An "auto" batch is said as "auto", not None, when nothing fills it.
    code, _, err = _run(capsys, ["estimate", "--config", str(run / "ds_config.hf.json"), "--model", "gpt2",
                                 "--gpus", "2", "--gpu", "cpu", "--precision", "bf16"])
    assert code == 1 and 'train_micro_batch_size_per_gpu "auto"' in err and "None" not in err, err


def test_why_lines_write_long_steps_without_an_exponent(capsys):
    """GPT-2 on 2 CPU ranks (a step of about 6,500 s at the default batch): the why lines read
    "6.5e+03 s/step" and "6.42e+03 s/step"."""
    code, data, _ = _json(capsys, ["plan", "--model", "gpt2", "--gpus", "2", "--gpu", "cpu", "--seq-len", "1024",
                                   "--top", "1"])
    assert code == 0
    best = data["plans"][0]
    assert best["time"]["step_seconds"] >= 1000  # the case this is about
    why = " ".join(best["why"])
    assert "s/step" in why and not re.search(r"\de[+-]\d+ s", why), why
    assert f"{best['time']['step_seconds']:,.0f} s/step" in why


def test_a_token_batch_under_one_sequence_offers_one_fix_once(capsys):
    """`--global-batch-tokens 1000` at seq 2048 said "fix: nearest: 2048 or 2048"."""
    code, _, err = _run(capsys, ["plan", "--model", "llama-3-8b", "--gpus", "8", "--global-batch-tokens", "1000"])
    assert code == 1 and "nearest: 2048" in err and "2048 or 2048" not in err, err


def test_estimate_of_a_megatron_plans_config_says_it_prices_another_engine(tmp_path, capsys):
    """A Megatron-engine plan (fp32 main grads, distributed optimizer) and `estimate --config` of the
    ds_config.json written beside it differ (Llama-2-7B on 16 H100s: 60.0 vs 55.2 GiB, 4.80 vs
    5.66 s) with no word why: no flag makes the DeepSpeed estimate price Megatron-LM."""
    run = tmp_path / "run"
    argv = ["--model", "llama-2-7b", "--gpus", "16", "--gpu", "h100-sxm", "--seq-len", "4096"]
    assert _run(capsys, ["generate", *argv, "--engine", "megatron", "--output", str(run)])[0] == 0
    code, est, _ = _json(capsys, ["estimate", "--config", str(run / "ds_config.json"), *argv])
    assert code == 0
    assert any("engine deepspeed here, megatron there" in n for n in est["config"]["notes"]), est["config"]["notes"]


def test_explain_pictures_never_replace_files_silently_nor_crash_on_a_file(tmp_path, capsys):
    """`dstk explain RUN --pictures FILE` was an internal error (FileExistsError), and a directory that
    already held memory.png had it replaced without a word."""
    import pytest

    pytest.importorskip("matplotlib")
    run = tmp_path / "run"
    assert _run(capsys, ["generate", "--model", "gpt2", "--gpus", "2", "--gpu", "cpu", "--seq-len", "1024",
                         "--output", str(run)])[0] == 0
    afile = tmp_path / "notes.txt"
    afile.write_text("mine\n")
    for target, said in ((afile, "exists and is not a directory"), (afile / "pics", "is a file")):
        code, _, err = _run(capsys, ["explain", str(run), "--pictures", str(target)])
        assert code == 2 and said in err and "internal error" not in err, err
    assert afile.read_text() == "mine\n"
    pics = tmp_path / "pics"
    pics.mkdir()
    (pics / "memory.png").write_text("mine\n")
    code, _, err = _run(capsys, ["explain", str(run), "--pictures", str(pics)])
    assert code == 2 and "already exist" in err and "--force" in err
    assert (pics / "memory.png").read_text() == "mine\n" and not (pics / "memory.svg").exists()
    code, out, _ = _run(capsys, ["explain", str(run), "--pictures", str(pics), "--force"])
    assert code == 0 and (pics / "memory.png").read_bytes().startswith(b"\x89PNG")


def test_gpus_lists_the_fp16_peak_a_v100_plan_runs_at(capsys):
    """`dstk gpus` showed a V100 as "bf16 TF -" and its fp32 peak only: the 125 TFLOP/s fp16 peak
    that every V100 plan (fp16 by default) is priced at was nowhere."""
    code, out, _ = _run(capsys, ["gpus"])
    assert code == 0
    header, *rows = out.splitlines()
    assert "fp16 TF" in header
    v100 = next(r for r in rows if r.startswith("v100-32gb")).split()
    assert v100[3:5] == ["-", "125"], v100  # slug, 32.0, GiB, bf16, fp16


def test_estimate_layout_refusals_name_the_fix(capsys):
    """`dstk estimate --zero 3 --pp 2` (and offload without ZeRO, ...) printed the refusal with no
    fix line, where `dstk plan` names one."""
    cases = [(["--zero", "3", "--pp", "2"], "use --zero 0 or 1"),
             (["--offload-optimizer", "cpu"], "add --zero 1, 2 or 3"),
             (["--zero", "2", "--offload-params", "cpu"], "add --zero 3"), (["--virtual-stages", "2"], "add --pp"),
             (["--sequence-parallel"], "add --tp")]
    for flags, fix in cases:
        code, _, err = _run(capsys, ["estimate", "--model", "gpt2", "--gpus", "8", *flags])
        assert code == 1 and f"fix: {fix}" in err and "Traceback" not in err, (flags, err)  # values: 1, as plan


def test_estimate_says_when_the_sequence_is_longer_than_the_models_positions(capsys):
    """`dstk plan` says so in a why line; `dstk estimate` of the same model and length said nothing
    (GPT-2 from an intent without seq_len: 2048 tokens on 1024 learned positions)."""
    code, out, _ = _run(capsys, ["estimate", "--model", "llama-2-7b", "--gpus", "8", "--seq-len", "8192"])
    assert code == 0 and "longer than llama-2-7b's 4,096 positions" in re.sub(r"\s+", " ", out)
    code, out, _ = _run(capsys, ["estimate", "--model", "llama-2-7b", "--gpus", "8", "--seq-len", "4096"])
    assert code == 0 and "positions" not in out


def test_generates_next_validate_checks_the_batch_with_the_plans_degrees(tmp_path, capsys):
    """`generate`'s `next: dstk validate DIR/ds_config.json` checked no batch triad (no world size),
    and with the world size added by hand a pipeline plan's file read as wrong ("train_batch_size
    512 != 2 x 64 x 8", fix "set 1024", which would double the batch). The line now carries the
    world size and the plan's TP/PP degrees, and passes."""
    import shlex

    run = tmp_path / "run"
    code, out, _ = _run(capsys, ["generate", "--model", "llama-3-8b", "--gpus", "8", "--gpu", "h100-sxm", "--pp", "2",
                                 "--output", str(run)])
    assert code == 0
    validate = shlex.split(out.strip().splitlines()[-1][len("next: "):].split("; ")[0])
    assert validate[3:] == ["--world-size", "8", "--pipeline-stages", "2"], validate
    code, out, _ = _run(capsys, validate[1:])
    assert code == 0 and "ok (0 errors" in out
    assert "`dstk validate ds_config.json --world-size 8 --pipeline-stages 2`" in (run / "README.md").read_text()


def test_estimate_has_the_engine_flag_the_readme_promises(capsys):
    """README: "`--engine megatron` prices Megatron's own accounting" under `dstk estimate`, which
    answered "unrecognized arguments: --engine megatron". It now prices exactly what
    `dstk plan --engine megatron` does for the same layout, and refuses what Megatron cannot run."""
    model = ["--model", "llama-2-7b", "--gpus", "16", "--gpu", "h100-sxm", "--seq-len", "4096"]
    code, plan, _ = _json(capsys, ["plan", *model, "--engine", "megatron", "--tp", "2", "--top", "1"])
    assert code == 0
    best = plan["plans"][0]
    lay = best["layout"]
    flags = ["--tp", str(lay["tp"]), "--pp", str(lay["pp"]), "--zero", str(lay["zero_stage"]),
             "--micro-batch", str(lay["micro_batch"]), "--recompute", lay["recompute"],
             "--global-batch", str(lay["micro_batch"] * lay["grad_accum"] * lay["dp"])]
    flags += ["--sequence-parallel"] if lay["sequence_parallel"] else []
    code, est, _ = _json(capsys, ["estimate", *model, "--engine", "megatron", *flags])
    assert code == 0
    assert est["memory"]["per_gpu"]["total_bytes"] == best["memory"]["per_gpu"]["total_bytes"]
    assert est["time"]["step_seconds"] == best["time"]["step_seconds"]
    code, _, err = _run(capsys, ["estimate", *model, "--engine", "megatron", "--zero", "3"])
    assert code == 1 and "fix: Megatron-LM shards the optimizer states only" in err  # a value: 1, as plan


def test_a_deepspeed_plans_readme_says_what_megatron_args_costs_where_megatron_cannot_run_it(tmp_path, capsys):
    """Llama-3-70B on 64 H100s: ZeRO-3 dp=64, 71.5 GiB per GPU. The README offered
    `torchrun ... $(cat megatron.args)` with that figure above it, but Megatron-LM has no ZeRO-3: the
    same dp/tp/pp with its distributed optimizer needs about 440 GiB per GPU. The README and
    generate's stderr now say so, with the figure `dstk estimate --engine megatron` gives."""
    run = tmp_path / "run"
    argv = ["--model", "llama-3-70b", "--gpus", "64", "--gpu", "h100-sxm", "--seq-len", "4096"]
    code, _, err = _run(capsys, ["generate", *argv, "--output", str(run)])
    assert code == 0
    plan = json.loads((run / "plan.json").read_text())
    lay = plan["layout"]
    assert lay["zero_stage"] == 3 and (lay["tp"], lay["pp"]) == (1, 1)
    code, est, _ = _json(capsys, ["estimate", *argv, "--engine", "megatron", "--zero", "1",
                                  "--micro-batch", str(lay["micro_batch"]), "--recompute", lay["recompute"],
                                  "--global-batch", str(lay["micro_batch"] * lay["grad_accum"] * lay["dp"])])
    need = f"{est['memory']['per_gpu']['total_bytes'] / 2**30:.1f} GiB per GPU"
    readme = re.sub(r"\s+", " ", (run / "README.md").read_text())
    assert "Not this plan's memory" in readme and "has no ZeRO-3" in readme and need in readme, readme[-1500:]
    assert "does not fit" in readme and "--engine megatron" in readme
    assert need in err and "warning: megatron.args keeps this layout" in err
    # A plan Megatron runs as planned (ZeRO-1, a pipeline) gets no such note.
    run2 = tmp_path / "run2"
    code = _run(capsys, ["generate", "--model", "llama-3-8b", "--gpus", "8", "--pp", "2", "--output", str(run2)])[0]
    assert code == 0
    assert "Not this plan's memory" not in (run2 / "README.md").read_text()


def test_estimate_of_a_qlora_runs_config_names_the_lora_flags(tmp_path, capsys):
    """QLoRA Qwen2.5-7B on one A100-40GB: the plan's 35.9 GiB read back as 44.9 GiB, DOES NOT FIT,
    with `--lora-rank 16` but without `--lora-bits 4`, which the note did not name."""
    run = tmp_path / "run"
    argv = ["--model", "qwen2.5-7b", "--gpus", "1", "--gpu", "a100-40gb"]
    assert _run(capsys, ["generate", *argv, "--lora-rank", "16", "--lora-bits", "4", "--output", str(run)])[0] == 0
    plan = json.loads((run / "plan.json").read_text())
    config = str(run / "ds_config.json")
    code, est, _ = _json(capsys, ["estimate", "--config", config, *argv])
    said = [n for n in est["config"]["notes"] if "plan.json" in n]
    assert said and "add --lora-rank 16 --lora-bits 4" in said[0], est["config"]["notes"]
    code, est, _ = _json(capsys, ["estimate", "--config", config, *argv, "--lora-rank", "16", "--lora-bits", "4"])
    assert code == 0 and not [n for n in est["config"]["notes"] if "plan.json" in n]
    assert est["memory"]["per_gpu"]["total_bytes"] == plan["memory"]["per_gpu"]["total_bytes"]


def test_the_prefetch_why_line_does_not_claim_a_whole_weight_the_cap_cuts(capsys):
    """Mixtral-8x7B on 16 A100-80GB, ZeRO-3: "stage3_prefetch_bucket_size 4.2e8: the next weight
    (9.4e8 elements per GPU) gathers while the current one computes": a bucket under half the
    weight cannot hold it; the cap (1% of the GPU's memory) set the size."""
    code, data, _ = _json(capsys, ["plan", "--model", "mixtral-8x7b", "--gpus", "16", "--gpu", "a100-80gb",
                                   "--zero", "3", "--top", "1"])
    assert code == 0
    line = next(w for w in data["plans"][0]["why"] if w.startswith("stage3_prefetch_bucket_size"))
    bucket, weight = (float(x) for x in re.match(r"stage3_prefetch_bucket_size (\S+): the next weight \((\S+) "
                                                  r"elements", line).groups())
    assert bucket < weight
    assert "gathers while the current one computes" not in line and "is more than the cap" in line, line


def test_a_warmup_the_run_cannot_finish_is_said_not_clipped_silently(tmp_path, capsys):
    """`--num-tokens 2e9 --warmup-steps 5000` on Llama-3-8B is 1,908 steps: every config got
    warmup 1,908 (the whole run warms up, the cosine never decays) without a word."""
    run = tmp_path / "run"
    argv = ["--model", "llama-3-8b", "--gpus", "8", "--num-tokens", "2000000000", "--warmup-steps", "5000"]
    code, _, err = _run(capsys, ["generate", *argv, "--output", str(run)])
    assert code == 0
    steps = json.loads((run / "training_args.json").read_text())["max_steps"]
    assert json.loads((run / "ds_config.json").read_text())["scheduler"]["params"]["warmup_num_steps"] == steps
    said = f"warmup_steps 5,000 is not shorter than the run's {steps:,} steps"
    assert said in err and "the cosine decay never runs" in err
    assert any(said in line for line in json.loads((run / "plan.json").read_text())["why"])
    code, data, _ = _json(capsys, ["plan", *argv[:4], "--num-tokens", "2000000000", "--warmup-steps", "100", "--top", "1"])
    assert code == 0 and not [w for w in data["plans"][0]["why"] if w.startswith("warmup_steps")]


def test_a_refused_training_value_gets_a_fix_not_only_its_description(capsys):
    """`--lr 0` said "fix: lr: Peak learning rate." (the field's help, no fix), and `--min-lr-ratio 2`
    "expected a number in [0.0, 1.000000000001)" (an internal bound)."""
    code, _, err = _run(capsys, ["plan", "--model", "gpt2", "--gpus", "2", "--gpu", "cpu", "--lr", "0"])
    assert code == 1 and "leave it out for the default 0.0003" in err, err
    code, _, err = _run(capsys, ["plan", "--model", "gpt2", "--gpus", "2", "--gpu", "cpu", "--min-lr-ratio", "2"])
    assert code == 1 and "[0.0, 1.0], got 2.0" in err and "1.000000000001" not in err, err
    assert _run(capsys, ["plan", "--model", "gpt2", "--gpus", "2", "--gpu", "cpu", "--min-lr-ratio", "1",
                         "--top", "1"])[0] == 0


ROUND_TRIPS = {
    "llama-3-8b-8xh100-seq8192": ["--model", "llama-3-8b", "--gpus", "8", "--gpu", "h100-sxm", "--seq-len", "8192"],
    "mixtral-16xa100": ["--model", "mixtral-8x7b", "--gpus", "16", "--gpu", "a100-80gb"],
    "qwen2.5-7b-lora-4xa100-40gb": ["--model", "qwen2.5-7b", "--gpus", "4", "--gpu", "a100-40gb", "--lora-rank", "16"],
    "gpt2-cpu": ["--model", "gpt2", "--gpus", "2", "--gpu", "cpu", "--seq-len", "1024"],
    "llama-2-7b-16xv100": ["--model", "llama-2-7b", "--gpus", "16", "--gpu", "v100-32gb", "--seq-len", "4096"],
    "llama-3-8b-pp2": ["--model", "llama-3-8b", "--gpus", "8", "--gpu", "h100-sxm", "--pp", "2"],
    "llama-3-8b-tp2-batch100": ["--model", "llama-3-8b", "--gpus", "8", "--gpu", "h100-sxm", "--tp", "2",
                                "--global-batch", "96"],
}


def _round_trip_flags(plan: dict) -> list[str]:
    """The flags with which `estimate --config` prices the planned run: what a DeepSpeed file
    cannot carry, as the plan.json note names them."""
    lay, tr, cl = plan["layout"], plan["training"], plan["cluster"]
    flags = ["--model", plan["model"]["name"], "--gpus", str(cl["num_nodes"] * cl["gpus_per_node"]),
             "--gpus-per-node", str(cl["gpus_per_node"]), "--gpu", cl["gpu"], "--seq-len", str(tr["seq_len"]),
             "--recompute", lay["recompute"]]
    flags += ["--pp", str(lay["pp"])] if lay["pp"] > 1 else []
    flags += ["--lora-rank", str(tr["lora"]["rank"])] if tr.get("lora") else []
    return flags


def test_each_round_trip_validates_and_estimates_to_the_plans_figures(tmp_path, capsys):
    """generate -> validate (with the next line's flags) -> estimate --config, on the intents of this
    audit: the file validates with no finding and its estimate is the plan's memory and step time."""
    import shlex

    for name, argv in ROUND_TRIPS.items():
        run = tmp_path / name
        code, out, err = _run(capsys, ["generate", *argv, "--output", str(run)])
        assert code == 0, (name, err)
        validate = shlex.split(out.strip().splitlines()[-1][len("next: "):].split("; ")[0])
        code, said, _ = _run(capsys, validate[1:])
        assert code == 0 and "ok (0 errors, 0 warnings)" in said, (name, said)
        plan = json.loads((run / "plan.json").read_text())
        code, est, _ = _json(capsys, ["estimate", "--config", str(run / "ds_config.json"), *_round_trip_flags(plan)])
        assert code == 0 and not [n for n in est["config"]["notes"] if "plan.json" in n], (name, est["config"])
        assert est["memory"]["per_gpu"]["total_bytes"] == plan["memory"]["per_gpu"]["total_bytes"], name
        assert est["time"]["step_seconds"] == plan["time"]["step_seconds"], name


def test_a_bucket_over_one_data_parallel_rank_is_not_said_to_ride_a_ring(capsys):
    """A pipeline over a whole node has dp = 1: its ZeRO-1 bucket line read "a ring over 1 GPUs at
    360 GB/s reaches 90% of the bandwidth", a ring that does not exist."""
    code, out, _ = _run(capsys, ["plan", "--model", "qwen2.5-7b", "--gpus", "8", "--gpu", "h100-sxm", "--seq-len",
                                 "8192", "--global-batch", "128", "--pp", "8", "--zero", "1", "--top", "1"])
    assert code == 0, out
    flat = re.sub(r"\s*\n\s*", " ", out)
    assert "reduce_bucket_size" in flat
    assert "a ring over 1 GPUs" not in flat
    assert "one data-parallel rank: its reductions cross no link" in flat
