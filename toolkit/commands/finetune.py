"""``dstk finetune``: fine-tune an HF causal LM on local data with the plan's DeepSpeed layout."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HELP = "fine-tune an HF model on local data with a run directory's plan (progress, checkpoints, resume, HF export)"
DESCRIPTION = (
    "Check the inputs, train a tokenizer when the model has none, tokenize and pack the data, then start the "
    "plan's ranks on the deepspeed runner. Progress (loss, tokens/s, lr, ETA): one line redrawn in place on a "
    "terminal, a line every --log-every steps in logs and pipes; DeepSpeed's and torch's INFO/WARNING lines go "
    "to OUTPUT/logs/launch.log (--verbose shows them); metrics go to OUTPUT/logs/ through DeepSpeed's monitor "
    "(--report-to); checkpoints go to OUTPUT/checkpoints (complete or absent); "
    "the trained model is exported to OUTPUT/model (save_pretrained + tokenizer). Exit 0 on success, 1 on "
    "invalid input or a failed rank, 2 on usage errors."
)


def configure(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--plan", metavar="RUN_DIR",
                       help="run directory from `dstk generate` (plan.json + ds_config.json)")
    where.add_argument("--intent", metavar="INTENT.yaml",
                       help="plan this intent first (as `dstk generate` does) into OUTPUT/plan")
    parser.add_argument("--model", metavar="PRESET|HF_DIR",
                        help="tiny-llama, small-llama, or a local HF checkpoint directory "
                             "(default: the plan's model config, random weights)")
    parser.add_argument("--data", nargs="+", default=(), metavar="FILE",
                        help="local json/jsonl/csv/parquet/txt files (not needed with --resume)")
    parser.add_argument("--output", "-o", required=True, metavar="DIR", help="new directory for the run's files")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--steps", type=int, help="optimizer steps (default: the plan's train_steps)")
    length.add_argument("--epochs", type=float, help="passes over the training blocks")
    parser.add_argument("--eval-split", type=float, default=0.05, metavar="FRACTION",
                        help="fraction of blocks held out for eval loss/perplexity (default 0.05)")
    parser.add_argument("--text-field", default="text", help="column with plain text (default: text)")
    parser.add_argument("--prompt-field", help="column with prompts (with --response-field)")
    parser.add_argument("--response-field", help="column with responses (with --prompt-field)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the init, the split and the data order")
    parser.add_argument("--save-every", type=int, default=0, metavar="N",
                        help="checkpoint every N steps (always at the end)")
    parser.add_argument("--eval-every", type=int, default=0, metavar="N", help="eval every N steps (always at the end)")
    parser.add_argument("--log-every", type=int, default=1, metavar="N", help="progress line every N steps")
    parser.add_argument("--ranks", type=int, help="ranks to launch; must equal the plan's world size (with "
                        "--resume, another number re-plans the run for it, as --gpus N does)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --output from its newest complete checkpoint; with --gpus N on another "
                             "number of GPUs (same global batch, DeepSpeed's universal checkpoint)")
    parser.add_argument("--trainer", choices=["native", "hf"], default="native",
                        help="native: dstk's loop on the DeepSpeed engine; hf: transformers' Trainer with the "
                             "run directory's ds_config.hf.json")
    # --lora-rank/-alpha/-targets/-dropout/-bits are intent flags (add_intent_arguments below), the same
    # as plan's and generate's: the plan prices the adapters and plan.json carries them to the ranks.
    lora = parser.add_argument_group("LoRA (peft): adapters on a frozen base; only they train")
    lora.add_argument("--merge", action="store_true",
                      help="also write the base with the adapters merged into OUTPUT/model (the adapter always "
                           "goes to OUTPUT/adapter)")
    parser.add_argument("--report-to", metavar="csv,tensorboard,wandb|none",
                        help="metric backends, a comma list (default: csv), writing under OUTPUT/logs/ through "
                             "DeepSpeed's monitor (the Trainer's report_to with --trainer hf); wandb runs offline "
                             "unless WANDB_MODE is set")
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="also print DeepSpeed's and torch's INFO/WARNING lines (always kept in "
                             "OUTPUT/logs/launch.log)")
    parser.add_argument("--master-port", type=int, help="rendezvous port (default: a free one)")
    parser.add_argument("--prepare-only", action="store_true",
                        help="check and prepare everything, print the spec file, start nothing")
    parser.add_argument("--format", choices=["human", "json"], default="human")
    from dstk.commands.plan import add_intent_arguments

    # Every flag of `dstk plan`/`generate` (cluster, training goal, pinned layout): with them, or with
    # --intent, finetune plans into OUTPUT/plan first. --model names both the weights and the plan's model.
    add_intent_arguments(parser, positional=False, skip=("--model",))


_DIMS = {"num_hidden_layers": "num_layers", "hidden_size": "hidden_size", "num_attention_heads": "num_heads",
         "num_key_value_heads": "num_kv_heads", "intermediate_size": "ffn_hidden_size", "vocab_size": "vocab_size"}


def _flag_names(args: argparse.Namespace) -> list[str]:
    from dstk.commands.plan import _FLAGS

    by_dest = {f"i_{section}__{field}": flag for flag, section, field, _ in _FLAGS}
    by_dest.update(i_gpus="--gpus", i_constraints__offload="--no-offload",
                   i_constraints__tp_across_nodes="--tp-across-nodes")
    return [by_dest.get(k, k) for k, v in vars(args).items()
            if k.startswith("i_") and v is not None and k not in LORA_DESTS]


LORA_DESTS = {f"i_training__lora_{name}": name for name in ("rank", "alpha", "targets", "dropout", "bits")}
"""The ``--lora-*`` flags' argparse dests -> ``FinetuneRequest.lora_*``: with ``--plan`` they are not plan
flags (a run directory planned without LoRA still trains adapters), so ``_flag_names`` leaves them out."""


def lora_request(args: argparse.Namespace, *, intent) -> dict:
    """``FinetuneRequest``'s ``lora_*`` fields. With ``--plan``: plan.json's ``training.lora`` (what
    ``dstk generate --lora-rank`` wrote), or the flags when the plan has none; flags that contradict a
    LoRA plan are refused (the plan priced other adapters). With an intent (flags applied over it):
    its ``training.lora_*``. On ``--resume``: the flags, which ``prepare`` checks against the run."""
    from dstk.errors import UsageError

    flags = {field: getattr(args, dest, None) for dest, field in LORA_DESTS.items()}
    if args.plan and not args.resume:
        from dstk.launch.rundir import read_plan

        planned = (read_plan(args.plan).get("training") or {}).get("lora")
        if planned is None:
            return {f"lora_{k}": v for k, v in flags.items()}
        differ = [f"--lora-{k} {v}" for k, v in flags.items() if v is not None and v != planned[k]]
        if differ:
            raise UsageError(f"{', '.join(differ)}: the run directory's plan has LoRA rank {planned['rank']}, "
                             f"alpha {planned['alpha']:g}, {planned['targets']}, dropout {planned['dropout']:g}"
                             + (", 4-bit base" if planned["bits"] else ""),
                             hint="drop the --lora-* flags to train as planned, or plan again with them "
                                  "(dstk generate ... --lora-rank R)")
        return {f"lora_{k}": planned[k] for k in flags}
    if intent is not None and not isinstance(intent, str):
        t = intent.training
        return dict(lora_rank=t.lora_rank, lora_alpha=t.lora_alpha, lora_targets=t.lora_targets,
                    lora_dropout=t.lora_dropout, lora_bits=t.lora_bits)
    return {f"lora_{k}": v for k, v in flags.items()}


def plan_intent(args: argparse.Namespace, *, log=lambda s: print(s, file=sys.stderr)):
    """The intent finetune plans from when there is no ``--plan``: ``--intent`` with the plan flags
    over it; ``--model`` (a preset or a local HF directory) sets the plan's model; without a GPU
    here and no ``--gpu``, the plan is for CPU ranks. None when there is nothing to plan from."""
    from dstk.commands.plan import intent_from_args
    from dstk.errors import UsageError

    flags = _flag_names(args) + (["--from"] if getattr(args, "from_file", None) else [])
    if args.plan:
        if flags:
            raise UsageError(f"{', '.join(flags)} given with --plan: the run directory's plan is fixed",
                             hint="drop --plan to plan with these flags, or drop the flags")
        return None
    if not args.intent and not flags:
        return None
    if args.model is not None and args.i_model__num_layers is None:
        from dstk.train.model import PRESETS

        if args.model in PRESETS:
            for hf_key, field in _DIMS.items():
                setattr(args, f"i_model__{field}", PRESETS[args.model][hf_key])
        else:
            args.i_model__name = args.model
    if args.steps is not None and args.i_training__train_steps is None:
        args.i_training__train_steps = args.steps
    if args.i_cluster__gpu is None and not args.intent and args.i_cluster__hardware is None:
        import torch

        if not torch.cuda.is_available():
            args.i_cluster__gpu = "cpu"
            log("planning for CPU ranks (no GPU on this machine; --gpu TYPE to plan for another)")
    intent = intent_from_args(args, path=args.intent)
    if args.intent:
        return intent
    # The intent's defaults (2,048 tokens x 512 sequences) are a pre-training step: a million tokens,
    # minutes per step on CPU ranks. A fine-tune planned from flags alone starts from a fine-tune's.
    from dstk.intent import with_overrides

    ranks = intent.cluster.num_nodes * intent.cluster.gpus_per_node
    cpu = intent.cluster.gpu == "cpu"
    chosen = {}
    if args.i_training__seq_len is None:
        chosen["seq_len"] = 128 if cpu else 1024
    if args.i_training__global_batch is None and args.i_training__global_batch_tokens is None:
        chosen["global_batch"] = (4 if cpu else 8) * ranks
    if chosen:
        log("fine-tune defaults: " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in chosen.items())
            + " (pass them to choose)")
        intent = with_overrides(intent, {"training": chosen})
    return intent


def run(args: argparse.Namespace) -> int:
    from dstk.commands.generate import refuse_stdout_dir
    from dstk.errors import require_train_stack

    refuse_stdout_dir(args.output, what="the run's directory", hint="give a directory name, e.g. -o ft1")
    require_train_stack("finetune")
    from dstk.train.logs import check_report_to, launch_logged, parse_report_to
    from dstk.train.prepare import FinetuneRequest, prepare

    report_to = None if args.report_to is None else parse_report_to(args.report_to)
    check_report_to(report_to or ())
    if args.resume:
        from dstk.train.integrity import check_resume

        # Before any rank starts: a damaged checkpoint or settings file is named (with the previous
        # complete checkpoint), and a copied run directory is rebased to resume into itself.
        check_resume(args.output, log=lambda s: print(f"dstk: {s}", file=sys.stderr))

    intent = args.intent if args.resume else (plan_intent(args) or args.intent)
    ranks = args.ranks
    if args.resume and args.i_gpus is not None:  # resume on N GPUs: re-plan for N (dstk.train.elastic)
        from dstk.errors import UsageError

        if ranks is not None and ranks != args.i_gpus:
            raise UsageError(f"--gpus {args.i_gpus} and --ranks {ranks} disagree", hint="give one of them")
        ranks = args.i_gpus
    req = FinetuneRequest(
        run_dir=args.plan, intent=intent, data=tuple(args.data), output_dir=args.output, model=args.model, steps=args.steps,
        epochs=args.epochs, eval_split=args.eval_split, text_field=args.text_field, prompt_field=args.prompt_field,
        response_field=args.response_field, seed=args.seed, save_every=args.save_every, eval_every=args.eval_every,
        log_every=args.log_every, ranks=ranks, resume=args.resume, trainer=args.trainer,
        merge=args.merge, **lora_request(args, intent=intent), report_to=report_to,
    )
    spec_path = prepare(req)
    if args.prepare_only:
        print(spec_path)
        return 0
    import signal

    # Slurm's `--signal=USR1@N` reaches every process of a step (`srun dstk finetune ...`), and SIGUSR1's default
    # action kills: ignored here and, inherited, by the runner, launch.py and the rank wrappers; the ranks set a
    # handler of their own and save a checkpoint (dstk.train.worker.StopRequest).
    usr1 = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    try:
        rc = launch_logged(spec_path, output_dir=args.output, verbose=args.verbose,
                           ranks_to_stderr=args.format == "json", master_port=args.master_port, append=args.resume)
    except KeyboardInterrupt:  # Ctrl-C: the ranks stopped; say what was kept (the CLI then exits 130)
        _say_what_was_kept(spec_path, output_dir=args.output)
        raise
    finally:
        signal.signal(signal.SIGUSR1, usr1)
    if rc != 0:  # stopped by a signal, or a rank failed
        _say_what_was_kept(spec_path, output_dir=args.output)
    summary = Path(args.output) / "summary.json"
    if args.format == "json" and rc == 0 and summary.is_file():
        json.dump(json.loads(summary.read_text()), sys.stdout, indent=2)
        sys.stdout.write("\n")
    return rc


def _say_what_was_kept(spec_path, *, output_dir: str) -> None:
    """After a run that did not finish: its newest complete checkpoint and the command that goes on from it,
    or that there is none (``dstk.train.checkpoint.stopped_note``), on stderr."""
    from dstk.train.checkpoint import stopped_note
    from dstk.train.spec import TrainSpec

    spec = TrainSpec.load(spec_path)
    print("dstk: " + stopped_note(output_dir, num_steps=spec.num_steps, save_every=spec.save_every,
                                  trainer=spec.trainer), file=sys.stderr)
