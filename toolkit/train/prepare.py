"""The parent side of ``dstk finetune``: check every input, prepare data and tokenizer, write the
rank spec. Everything that can be wrong with the input fails here, before any process starts."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

from dstk.errors import DstkError, UsageError
from dstk.plan import HF_ATTENTION, HF_SUPPORT_FLAG
from dstk.train.spec import TrainSpec


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class FinetuneRequest:
    """The command line of ``dstk finetune``, as data."""

    run_dir: str | None
    """A run directory written by ``dstk generate`` (plan.json, ds_config.json); None with ``intent``."""
    intent: Any = None
    """An intent YAML path, or a ``dstk.intent.Intent`` (from finetune's plan flags): planned as
    ``dstk generate`` does, into OUTPUT/plan, when ``run_dir`` is None."""
    data: tuple[str, ...]
    output_dir: str
    model: str | None = None
    """A preset (``dstk.train.model.PRESETS``), a local HF directory, or None for the plan's model config."""
    steps: int | None = None
    epochs: float | None = None
    eval_split: float = 0.05
    text_field: str = "text"
    prompt_field: str | None = None
    response_field: str | None = None
    seed: int = 0
    save_every: int = 0
    eval_every: int = 0
    log_every: int = 1
    ranks: int | None = None
    """Ranks to launch on this machine; must equal the plan's world size."""
    resume: bool = False
    trainer: str = "native"
    """``native``: dstk's loop on the DeepSpeed engine; ``hf``: transformers' Trainer with ds_config.hf.json."""
    lora_rank: int | None = None
    """``--lora-rank``: train LoRA adapters of this rank on a frozen base (None: a full fine-tune)."""
    lora_alpha: float | None = None
    lora_dropout: float | None = None
    lora_targets: str | None = None
    """``--lora-targets``: comma-separated names (``dstk.train.lora.target_names``) or ``all-linear``."""
    lora_bits: int | None = None
    """4: QLoRA (bitsandbytes NF4 base weights; CUDA only)."""
    merge: bool = False
    """With LoRA: also write the merged model to OUTPUT/model."""
    report_to: tuple[str, ...] | None = None
    """``--report-to`` (``dstk.train.logs.parse_report_to``); None: not given (csv; a resumed run keeps its own)."""


def precision_of(config: dict) -> str:
    if (config.get("bf16") or {}).get("enabled") is True:
        return "bf16"
    if (config.get("fp16") or {}).get("enabled") is True:
        return "fp16"
    return "fp32"


def global_batch_of(config: dict, *, dp: int) -> int:
    micro = int(config.get("train_micro_batch_size_per_gpu", 1))
    accum = int(config.get("gradient_accumulation_steps", 1))
    return micro * accum * dp


def effective_config(config: dict, *, num_steps: int, metrics_dir: str,
                     report_to: tuple[str, ...] = ("csv",)) -> tuple[dict, list[str]]:
    """The plan's config plus DeepSpeed's monitor blocks for ``report_to`` (under ``metrics_dir``,
    ``dstk.train.logs.monitor_blocks``), with the scheduler's length set to the run's
    step count. Returns (config, notes) -- each change is said, none is silent."""
    from dstk.train.logs import monitor_blocks

    out, notes = copy.deepcopy(config), []
    out.update(monitor_blocks(report_to, logs_dir=metrics_dir))
    params = (out.get("scheduler") or {}).get("params") or {}
    if "total_num_steps" in params and params["total_num_steps"] != num_steps:
        notes.append(f"scheduler.params.total_num_steps {params['total_num_steps']} -> {num_steps} "
                     f"(the run's step count, so the schedule ends with the run)")
        params["total_num_steps"] = num_steps
    warm = params.get("warmup_num_steps")
    # A warm-up as long as the run would leave the learning rate below its peak throughout: clip it
    # to a tenth of the run, and say so; at least 1 (WarmupCosineLR and WarmupDecayLR raise on 0,
    # deepspeed/runtime/lr_schedules.py:734 and :875), so a run under 10 steps warms up for 1.
    clipped = max(1, num_steps // 10)
    if isinstance(warm, int) and not isinstance(warm, bool) and warm >= num_steps and warm != clipped:
        notes.append(f"scheduler.params.warmup_num_steps {warm} -> {clipped} (the plan warms up for {warm} "
                     f"steps but the run has {num_steps}: a tenth of the run; plan --warmup-steps to choose)")
        params["warmup_num_steps"] = clipped
    return out, notes


def hf_attention(plan: dict) -> str | None:
    """The ``attn_implementation`` the ranks request: the kernel the plan priced (``training.attention``),
    or None for a plan.json without one (a run directory from before it was written: transformers'
    default, as those runs had)."""
    kernel = (plan.get("training") or {}).get("attention")
    if kernel is None:
        return None
    if kernel not in HF_ATTENTION:
        raise DstkError(f"plan.json training.attention: {kernel!r} is not one of {', '.join(HF_ATTENTION)}",
                        hint="regenerate the run directory with `dstk generate ... --attention sdpa`")
    return HF_ATTENTION[kernel]


def check_attention_loads(attn_implementation: str | None, *, model_type: str | None) -> None:
    """Refuse, before any rank starts, a kernel transformers would refuse on every rank at
    ``from_pretrained``/``from_config``: ``flash_attention_2`` without the ``flash_attn`` package
    (``PreTrainedModel._flash_attn_can_dispatch`` raises; with the ``kernels`` package installed it
    fetches a hub kernel instead, which needs a network), and a kernel the model's HF class does
    not declare (``_supports_sdpa`` / ``_supports_flash_attn``: an explicit request raises where the
    default falls back to eager; ``get_correct_attn_implementation`` in transformers 5.25)."""
    import importlib.util

    if attn_implementation is None:
        return
    kernel = next(k for k, v in HF_ATTENTION.items() if v == attn_implementation)
    if attn_implementation == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        raise DstkError("the plan priced FlashAttention-2 (training.attention: flash) but the flash_attn package is "
                        "not installed here: transformers refuses attn_implementation=\"flash_attention_2\" without it",
                        hint="install it (pip install flash-attn --no-build-isolation), or re-plan with "
                             "`dstk generate ... --attention sdpa` (or `dstk finetune ... --attention sdpa`)")
    flag = HF_SUPPORT_FLAG.get(kernel)
    if flag is None or model_type is None:
        return
    try:
        import transformers
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        cls = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    except (KeyError, AttributeError, ImportError):  # a class dstk cannot name: transformers decides on the ranks
        return
    if not getattr(cls, flag, False):
        raise DstkError(f"the plan priced {kernel} attention but transformers' {cls.__name__} has none (no {flag}): "
                        f"from_pretrained(attn_implementation=\"{attn_implementation}\") raises",
                        hint="re-plan with `dstk generate ... --attention eager` (what transformers runs for it)")


def _check_plan(req: FinetuneRequest) -> tuple[dict, dict]:
    from dstk.launch.rundir import read_plan

    plan = read_plan(req.run_dir)
    cfg_path = Path(req.run_dir) / "ds_config.json"
    try:
        config = json.loads(cfg_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{cfg_path}: no ds_config.json", hint="write the run directory with `dstk generate`") from None
    except ValueError as exc:
        raise DstkError(f"{cfg_path}: not JSON: {exc}", hint="regenerate it with `dstk generate`") from None
    cluster = plan["cluster"]
    world = int(cluster["num_nodes"]) * int(cluster["gpus_per_node"])
    if int(cluster["num_nodes"]) > 1:
        raise DstkError(f"the plan is for {cluster['num_nodes']} nodes; dstk finetune starts ranks on this machine only",
                        hint="plan for one node (--nodes 1), or run the worker with `dstk launch` on the cluster")
    if req.ranks is not None and req.ranks != world:
        raise DstkError(f"the plan is for {world} ranks but --ranks {req.ranks} would be launched",
                        hint=f"launch {world} ranks, or plan for {req.ranks}: dstk generate ... --gpus-per-node {req.ranks}")
    if cluster.get("gpu") == "cpu" and precision_of(config) == "fp16":
        raise DstkError("fp16 does not train on CPU ranks (DeepSpeed's CPU accelerator has bf16 and fp32)",
                        hint="plan with --precision bf16 or fp32")
    return plan, config


def prepare(req: FinetuneRequest, *, log=lambda s: print(s, file=sys.stderr)) -> Path:
    """Check and prepare; return the spec file the ranks read."""
    out = Path(req.output_dir)
    spec_path = out / "finetune.json"
    if req.resume:
        if not spec_path.is_file():
            raise UsageError(f"--resume: {spec_path} not found", hint="resume in the --output of an earlier run")
        spec = TrainSpec.load(spec_path)
        check_attention_loads(spec.attn_implementation, model_type=_model_type(spec.model_source))
        elastic = req.ranks is not None and req.ranks != spec.world_size
        _check_plan(dataclasses.replace(req, run_dir=spec.run_dir, ranks=None if elastic else req.ranks))
        if req.steps is not None and req.steps != spec.num_steps:
            raise DstkError(f"--steps {req.steps} differs from the run being resumed ({spec.num_steps})",
                            hint="drop --steps to resume as planned, or start a new --output")
        _check_resume_lora(req, spec)
        if req.report_to is not None and tuple(req.report_to) != spec.report_to:
            raise DstkError(f"--report-to {','.join(req.report_to) or 'none'} differs from the run being resumed "
                            f"({','.join(spec.report_to) or 'none'})",
                            hint="drop --report-to to resume as the run started, or start a new --output")
        if elastic:  # --gpus/--ranks N: re-plan, convert the checkpoint (dstk.train.elastic)
            from dstk.train.elastic import resume_on

            log(f"resuming the {spec.world_size}-rank run in {out} on {req.ranks} rank(s)")
            spec = resume_on(spec, num_ranks=req.ranks, log=log)
        log(f"resuming with the settings in {spec_path}")
        spec = dataclasses.replace(spec, resume=True)
        spec.dump(spec_path)
        return spec_path
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"--output {out} exists and is not empty",
                         hint="pass --resume to continue that run, or choose a new --output")
    existed = out.exists()
    try:
        if req.run_dir is None:
            req = dataclasses.replace(req, run_dir=str(_plan_into(req.intent, out / "plan", log=log)))
        return _prepare_new(req, out, log=log)
    except BaseException:
        # The directory was new or empty: leave it so, not half-prepared.
        import shutil

        if existed:
            for child in out.iterdir():
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        else:
            shutil.rmtree(out, ignore_errors=True)
        raise


def _lora_settings(req: FinetuneRequest, *, family: str):
    from dstk.train.lora import settings_from_flags

    if req.merge and req.lora_rank is None:
        raise UsageError("--merge without --lora-rank", hint="--merge folds LoRA adapters into the base; a full "
                         "fine-tune's OUTPUT/model is already the whole model")
    return settings_from_flags(family=family, rank=req.lora_rank, alpha=req.lora_alpha, dropout=req.lora_dropout,
                               targets=req.lora_targets, bits=req.lora_bits)


def _check_resume_lora(req: FinetuneRequest, spec: TrainSpec) -> None:
    """--resume takes the run's LoRA settings from finetune.json; flags that say otherwise are refused."""
    given = req.lora_rank is not None or req.merge or any(
        v is not None for v in (req.lora_alpha, req.lora_dropout, req.lora_targets, req.lora_bits))
    if not given:
        return
    family = json.loads((Path(spec.model_source) / "config.json").read_text(encoding="utf-8"))["model_type"]
    wanted = _lora_settings(req, family=family)
    if wanted != spec.lora or req.merge != spec.merge:
        raise DstkError("the LoRA flags differ from the run being resumed (its settings are in finetune.json)",
                        hint="drop the --lora-* and --merge flags to resume as the run started, or start a new --output")


def _model_type(model_source: str) -> str | None:
    try:
        return json.loads((Path(model_source) / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError):
        return None


def _plan_into(intent_path: str | None, run_dir: Path, *, log) -> Path:
    """The best plan for the intent, written as a run directory (the same code as `dstk generate`)."""
    from dstk import plan as planner
    from dstk.intent import load_intent
    from dstk.render import write_files

    if not intent_path:
        raise UsageError("no plan", hint="pass --plan RUN_DIR (from `dstk generate`), --intent INTENT.yaml, "
                         "or plan flags (--gpus 2 --zero 2 ...)")
    intent = load_intent(intent_path) if isinstance(intent_path, (str, Path)) else intent_path
    if not isinstance(intent_path, (str, Path)):
        intent_path = "the plan flags"
    ctx = planner.resolve(intent)
    result = planner.plan_intent(ctx, top=None)
    if not result.plans:
        fixes = planner.suggest_fixes(intent)
        raise DstkError(planner.nothing_fits_message(ctx, result),
                        hint="; ".join(fixes) if fixes else "no change dstk tried makes it fit")
    files = planner.run_dir_files(ctx, result, index=0)
    write_files(run_dir, files, force=False)
    planner.check_written(run_dir, files)
    log(f"planned {intent_path} -> {run_dir}/ (the best plan; `dstk explain {run_dir}` says why)")
    return run_dir


def _describe_lora(lora, *, cfg: dict) -> str:
    """One line: the adapters, and their parameter count next to the base's (``lora_size``)."""
    from dstk.models import family_module
    from dstk.train.lora_size import num_lora_params

    model = family_module(str(cfg["model_type"])).read(cfg, name="model")
    count = num_lora_params(model=model, rank=lora.rank, targets=lora.targets)
    qlora = ", 4-bit base (QLoRA)" if lora.bits else ""
    return (f"LoRA: rank {lora.rank}, alpha {lora.alpha:g}, dropout {lora.dropout:g} on "
            f"{', '.join(lora.targets)}{qlora}: {count:,} trainable parameters "
            f"({100 * count / model.num_params:.2f}% of the frozen {model.num_params:,})")


def _check_lora_layout(req: FinetuneRequest, lora, *, tp: int, pp: int, zero_stage: int, pretrained: bool) -> None:
    """LoRA runs on the native loop over data parallelism and ZeRO 0-3 (frozen base weights are
    partitioned by ZeRO-3 like the rest); the pipeline engine and AutoTP rebuild the model's
    layers and do not know peft's LoRA layers."""
    from dstk.train.lora import check_qlora

    if req.trainer != "native":
        raise DstkError("--lora-rank runs on the native trainer only", hint="drop --trainer hf")
    if pp > 1 or tp > 1:
        raise DstkError(f"LoRA with {'pipeline' if pp > 1 else 'tensor'} parallelism (pp {pp}, tp {tp}) is not "
                        "supported: DeepSpeed's pipeline engine and AutoTP rebuild the layers peft wraps",
                        hint="plan with --tp 1 --pp 1 and ZeRO-3 to spread the frozen base (dstk finetune ... "
                             "--tp 1 --pp 1 --zero 3)")
    check_qlora(lora, pretrained=pretrained)
    if lora.bits and zero_stage == 3:
        raise DstkError("--lora-bits 4 with ZeRO-3: DeepSpeed cannot partition bitsandbytes' 4-bit weights",
                        hint="plan with --zero 2 (the 4-bit base is a quarter of the bf16 size; the adapters are "
                             "what ZeRO shards)")


UNSAVED_SECONDS = 600.0
"""A run planned to take longer than this with ``--save-every 0`` (a checkpoint only at the end) is told so at its
start: a stop (Ctrl-C, a lost node, a job's time limit) before the end would keep nothing of it."""


def unsaved_note(*, step_seconds: float | None, num_steps: int) -> str | None:
    """The note for a run whose only checkpoint is its last: ``num_steps`` x the plan's ``step_seconds``
    (``plan.json`` ``time.step_seconds``, dstk's estimate for the plan's GPUs) above ``UNSAVED_SECONDS``;
    None when it is shorter or the plan has no estimate."""
    if not step_seconds or step_seconds * num_steps <= UNSAVED_SECONDS:
        return None
    total = step_seconds * num_steps
    every = max(1, int(UNSAVED_SECONDS / step_seconds))
    return (f"the plan puts this run at about {total / 60:.0f} min ({step_seconds:.3g} s/step x {num_steps} steps), "
            f"with a checkpoint only at the end (--save-every 0): a stop before then keeps nothing; "
            f"--save-every {every} saves about every {UNSAVED_SECONDS / 60:.0f} min")


_PLAN_DIMS = (("num_layers", ("num_hidden_layers", "n_layer")), ("hidden_size", ("hidden_size", "n_embd")),
              ("num_heads", ("num_attention_heads", "n_head")), ("ffn_hidden_size", ("intermediate_size", "n_inner")),
              ("vocab_size", ("vocab_size",)))
"""plan.json's model dimensions and the HF config keys that hold them (Llama-style names, then GPT-2's)."""


def model_differences(plan_model: dict, hf_config: dict) -> list[str]:
    """``FIELD HF vs PLAN`` for each dimension the run's HF config gives and the plan's model has otherwise:
    a ``--plan`` run directory priced one model, and ``--model HF_DIR`` may train another."""
    differ = []
    for field, keys in _PLAN_DIMS:
        theirs = next((hf_config[k] for k in keys if hf_config.get(k) is not None), None)
        ours = plan_model.get(field)
        if theirs is not None and ours is not None and int(theirs) != int(ours):
            differ.append(f"{field} {int(theirs)} vs {int(ours)}")
    return differ


def _prepare_new(req: FinetuneRequest, out: Path, *, log) -> Path:
    from dstk.train import data as D
    from dstk.train import model as M

    spec_path = out / "finetune.json"
    plan, config = _check_plan(req)
    layout = plan["layout"]
    tp, pp = int(layout.get("tp", 1)), int(layout.get("pp", 1))
    seq_len = int(plan["training"]["seq_len"])
    cfg, local_dir = M.resolve_config(req.model, plan=plan, seq_len=seq_len)
    if req.model is not None and (differ := model_differences(plan.get("model") or {}, cfg)):
        log(f"warning: --model {req.model} is not the model the plan in {req.run_dir} priced "
            f"({', '.join(differ)}): its memory and step-time figures are for the plan's model, not this one; "
            f"to plan for this one, drop --plan and give the plan flags (dstk finetune --model {req.model} --gpus N "
            f"--output DIR ...)")
    attn_implementation = hf_attention(plan)
    check_attention_loads(attn_implementation, model_type=cfg.get("model_type"))
    lora = _lora_settings(req, family=str(cfg["model_type"]))
    if lora is not None:
        _check_lora_layout(req, lora, tp=tp, pp=pp, zero_stage=int((config.get("zero_optimization") or {}).get("stage", 0)),
                           pretrained=bool(local_dir and M.has_weights(local_dir)))
        log(_describe_lora(lora, cfg=cfg))
    ds = D.load_records(list(req.data), text_field=req.text_field, prompt_field=req.prompt_field,
                        response_field=req.response_field)
    if req.steps is not None and req.epochs is not None:
        raise UsageError("--steps and --epochs exclude each other", hint="give one of them")
    for name in ("save_every", "eval_every"):
        if getattr(req, name) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 0", hint="0 means never")

    from transformers import AutoTokenizer
    import torch

    prepared = out / "prepared"
    prepared.mkdir(parents=True, exist_ok=True)
    tok_dir = prepared / "tokenizer"
    if local_dir and M.has_tokenizer(local_dir):
        tokenizer = AutoTokenizer.from_pretrained(local_dir)
        tokenizer.save_pretrained(str(tok_dir))
    else:
        texts = [D.render(r, tokenizer=None, text_field=req.text_field, prompt_field=req.prompt_field,
                          response_field=req.response_field) for r in ds]
        vocab = int(cfg["vocab_size"])
        log(f"training a {vocab}-token byte-level BPE tokenizer on the data -> {tok_dir}")
        from dstk.train.tokenizer import train_tokenizer

        tokenizer = train_tokenizer(texts, vocab_size=vocab, output_dir=tok_dir)
    if len(tokenizer) > int(cfg["vocab_size"]):
        raise DstkError(f"the tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {cfg['vocab_size']}",
                        hint="use the model's own tokenizer, or a model with a larger vocabulary")
    blocks = D.tokenize_dataset(ds, tokenizer=tokenizer, seq_len=seq_len, text_field=req.text_field,
                                prompt_field=req.prompt_field, response_field=req.response_field)
    train_idx, eval_idx = D.split_indices(len(blocks), eval_fraction=req.eval_split, seed=req.seed)
    tensor = torch.tensor(blocks, dtype=torch.long)
    torch.save(tensor[train_idx].clone(), prepared / "train.pt")
    if eval_idx:
        torch.save(tensor[eval_idx].clone(), prepared / "eval.pt")

    dp = int(layout["dp"])
    gb = global_batch_of(config, dp=dp)
    if req.steps is not None:
        steps = req.steps
    elif req.epochs is not None:
        steps = max(1, math.ceil(req.epochs * len(train_idx) / gb))
    else:
        steps = plan["training"].get("train_steps")
        if not steps:
            raise UsageError("no step count: the plan has no train_steps", hint="pass --steps N or --epochs E")
    if steps < 1:
        raise UsageError(f"--steps {steps}: expected >= 1", hint="e.g. --steps 20")
    if not req.save_every and (note := unsaved_note(step_seconds=(plan.get("time") or {}).get("step_seconds"),
                                                      num_steps=int(steps))):
        log(f"note: {note}")
    report_to = ("csv",) if req.report_to is None else tuple(req.report_to)
    effective, notes = effective_config(config, num_steps=int(steps), metrics_dir=str((out / "logs").resolve()),
                                        report_to=report_to)
    for note in notes:
        log(f"note: {note}")
    from dstk.launch.run import write_atomic

    write_atomic(out / "ds_config.json", json.dumps(effective, indent=2) + "\n")
    hf_config_path = None
    if req.trainer == "hf":
        if pp > 1:
            raise DstkError("transformers' Trainer cannot run DeepSpeed's pipeline engine (the plan has pp > 1)",
                            hint="use --trainer native, or plan with --pp 1")
        src = Path(req.run_dir) / "ds_config.hf.json"
        if not src.is_file():
            raise UsageError(f"{src}: not found", hint="regenerate the run directory with `dstk generate`")
        hf_cfg = json.loads(src.read_text(encoding="utf-8"))
        if "csv_monitor" in effective:  # the Trainer reports to tensorboard/wandb itself (hf_worker)
            hf_cfg["csv_monitor"] = effective["csv_monitor"]
        hf_config_path = out / "ds_config.hf.json"
        write_atomic(hf_config_path, json.dumps(hf_cfg, indent=2) + "\n")
    if local_dir:
        source = local_dir
    else:
        M.write_config(cfg, prepared / "model_config")
        source = str((prepared / "model_config").resolve())
    log(f"data: {len(blocks)} blocks of {seq_len} tokens ({len(train_idx)} train, {len(eval_idx)} eval); "
        f"{steps} steps of {gb} sequences ({gb * seq_len} tokens)")
    spec = TrainSpec(
        output_dir=str(out.resolve()), ds_config=str((out / "ds_config.json").resolve()), model_source=source,
        pretrained=bool(local_dir and M.has_weights(local_dir)), tokenizer_dir=str(tok_dir.resolve()),
        train_blocks=str((prepared / "train.pt").resolve()),
        eval_blocks=str((prepared / "eval.pt").resolve()) if eval_idx else None,
        num_steps=int(steps), seed=req.seed, tp=tp, pp=pp, world_size=dp * tp * pp,
        precision=precision_of(config), save_every=req.save_every, eval_every=req.eval_every,
        log_every=req.log_every, resume=False, trainer=req.trainer, run_dir=str(Path(req.run_dir).resolve()),
        hf_ds_config=str(hf_config_path.resolve()) if hf_config_path else None, lora=lora, merge=req.merge,
        report_to=report_to, attn_implementation=attn_implementation,
    )
    spec.dump(spec_path)
    return spec_path


def launch(spec_path: Path, *, master_port: int | None = None, quiet_stdout: bool = False, sink=None) -> int:
    """Start the ranks on the deepspeed runner through dstk.launch (rank-prefixed output, a non-zero
    exit when any rank fails). ``quiet_stdout``: the ranks' output goes to stderr (``--format json``
    keeps stdout for the summary); ``sink(stream, line)``: every line goes there instead (``dstk demo``)."""
    from dstk.launch import run_launch, spec_from_run_dir

    train_spec = TrainSpec.load(spec_path)
    script = "dstk.train.hf_worker" if train_spec.trainer == "hf" else "dstk.train.worker"
    spec = spec_from_run_dir(train_spec.run_dir, script=script, module=True, script_args=[str(spec_path)],
                             config_arg=None, master_port=master_port,
                             env={"TOKENIZERS_PARALLELISM": "false"})
    if sink is not None:
        return run_launch(spec, sink=sink)
    if quiet_stdout:
        return run_launch(spec, sink=lambda _stream, line: (sys.stderr.write(line), sys.stderr.flush()))
    return run_launch(spec)
