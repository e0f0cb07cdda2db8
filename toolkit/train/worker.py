"""One rank of ``dstk finetune``: ``python -m dstk.train.worker SPEC_JSON`` under the deepspeed runner.

Builds the model (seeded random init, or the local checkpoint), runs the real
``deepspeed.initialize`` with the plan's config, trains ``num_steps`` optimizer steps over a data
order that is a pure function of (seed, step), logs through DeepSpeed's monitor, checkpoints
complete-or-absent, resumes from the newest complete checkpoint and exports an HF directory.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

from dstk.train import checkpoint as ckpt
from dstk.train import elastic
from dstk.train.data import rank_micro_batches
from dstk.train.progress import format_summary, progress_record
from dstk.train.spec import TrainSpec


def _say(text: str) -> None:
    print(text, flush=True)


def _rng_state():
    import numpy as np
    import torch

    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def _set_rng_state(state) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def lm_loss(model, batch):
    """The causal-LM loss of ``batch`` (its own labels). ``use_cache=False``: a transformers model
    otherwise copies every layer's keys and values into a ``DynamicCache`` it never reads in
    training (4 w kv bytes per token and layer, up to 4% of a layer's memory traffic;
    ``benchmarks/eager_bytes.py --cache``), and keeps it alive until the step ends."""
    return model(input_ids=batch, labels=batch, use_cache=False).loss


def attn_kwargs(spec: TrainSpec) -> dict:
    """``{"attn_implementation": ...}`` for ``from_pretrained`` / ``from_config``: the kernel the plan
    priced (``TrainSpec.attn_implementation``); empty for a spec without one (transformers' default)."""
    return {"attn_implementation": spec.attn_implementation} if spec.attn_implementation else {}


def build_model(spec: TrainSpec):
    """The model every trainer path trains (the native loop, the pipeline through ``to_pipeline``,
    transformers' Trainer), with the plan's attention kernel (``attn_kwargs``)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(spec.seed)  # the same random init on every rank (ZeRO/TP shard one model)
    if spec.lora is not None and spec.lora.bits == 4:
        return _qlora_base(spec)
    if spec.pretrained:
        model = AutoModelForCausalLM.from_pretrained(spec.model_source, dtype=torch.float32, **attn_kwargs(spec))
    else:
        config = AutoConfig.from_pretrained(spec.model_source)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, **attn_kwargs(spec))
    if spec.lora is not None:
        from dstk.train import lora

        # After the base's init, so the base is the same as a full fine-tune's with this seed; the
        # adapters' A matrices take the next draws of the (seeded, identical) RNG on every rank.
        model = lora.apply(model, spec.lora)
    return model


def _qlora_base(spec: TrainSpec):
    """QLoRA (Dettmers et al. 2023): the base loaded in 4-bit NF4 with double quantization and
    compute in the run's precision, prepared for k-bit training (peft), then the adapters.
    The parent has checked CUDA, bitsandbytes and real weights. Untested here: no GPU."""
    import torch
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from dstk.train import lora

    compute = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[spec.precision]
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=compute)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    model = AutoModelForCausalLM.from_pretrained(spec.model_source, quantization_config=quant, dtype=compute,
                                                 device_map={"": local}, **attn_kwargs(spec))
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    return lora.apply(model, spec.lora)


def _all_mean(value: float) -> float:
    import torch
    import deepspeed.comm as dist

    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t.item()) / dist.get_world_size()


def evaluate(engine, blocks, *, micro_batch: int) -> float:
    """Mean loss over all eval blocks; every rank runs every batch (ZeRO-3 and TP need all ranks in
    each forward), so the figure is the same on every rank."""
    import torch

    if getattr(engine, "is_pipe_parallel", False):
        # The pipeline's shapes are fixed by training: eval in whole micro-batches, wrapping around.
        n = len(blocks)
        chunks = [blocks[[j % n for j in range(i, i + micro_batch)]] for i in range(0, n, micro_batch)]
        loss = engine.eval_batch(data_iter=iter([(c, c) for c in chunks]), num_micro_batches=len(chunks))
        return float(loss)
    engine.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(blocks), micro_batch):
            batch = blocks[i:i + micro_batch]
            loss = lm_loss(engine, batch)
            total += float(loss) * len(batch)
            count += len(batch)
    engine.train()
    return total / max(count, 1)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
"""The signals that make the ranks save a checkpoint at the end of the current optimizer step and exit
(``StopRequest``): SIGTERM is what Slurm sends at preemption and at ``--time`` (and with ``--signal=TERM@N``
N seconds before), what DeepSpeed's launch.py passes to each rank, and what ``dstk finetune`` forwards;
SIGUSR1 is what Slurm users often pick for ``--signal=USR1@N`` (``dstk.launch.slurm`` keeps it from every
process of a node but the ranks)."""

LAUNCH_GRACE_SECONDS = 30.0
"""SIGTERM to SIGKILL: DeepSpeed 0.19.8's launch.py ``terminate_process_tree`` (``psutil.wait_procs(children,
timeout=30)``, then ``kill``), and Slurm's default ``KillWait`` (30 s, slurm.conf(5)) after its SIGTERM."""


class StopRequest:
    """The signal handler of ``STOP_SIGNALS``: notes the first signal and when it came, nothing else (a
    second SIGTERM -- dstk, the rank wrapper and launch.py each pass one on -- changes nothing, and never
    cuts a save short). ``signum`` is 0 until a signal came. The ranks act on it together (``agree_stop``)."""

    __slots__ = ("signum", "monotonic_seconds")

    def __init__(self) -> None:
        self.signum = 0
        self.monotonic_seconds: float | None = None

    def __call__(self, signum: int, _frame) -> None:
        if not self.signum:
            self.signum, self.monotonic_seconds = signum, time.monotonic()

    def install(self) -> None:
        for signum in STOP_SIGNALS:
            signal.signal(signum, self)


def agree_stop(signum: int) -> int:
    """The largest signal number any rank was sent (0: none), on every rank: one all-reduce (MAX) of one
    number per optimizer step. The ranks get a signal at different moments (launch.py SIGTERMs its ranks one
    after the other, waiting up to 30 s for each; ``kill`` may reach one rank only), so each checks after the
    same step and all save the same one; a rank saving alone would leave the others in the next step's
    collectives."""
    import torch
    import deepspeed.comm as dist

    t = torch.tensor([signum], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def stop_line(*, signum: int, step: int, num_steps: int, checkpoint: str, save_seconds: float,
              since_signal_seconds: float | None, grace_seconds: float = LAUNCH_GRACE_SECONDS) -> str:
    """Rank 0's line after the checkpoint saved on a stop signal (pure): the step, where, how long the save
    took and (when the signal reached rank 0) how long since the signal, against ``grace_seconds``; past it,
    how to give the save more time. ``dstk.train.logs.RunSink`` recognises it (``SIGNAL_SAVED``)."""
    name = signal.Signals(signum).name
    taken = since_signal_seconds if since_signal_seconds is not None else save_seconds
    timing = f"the save took {_seconds(save_seconds)} s" + (
        f", {_seconds(since_signal_seconds)} s after the signal reached rank 0" if since_signal_seconds is not None
        else "")
    if taken <= grace_seconds:
        fits = (f"within the {grace_seconds:g} s that DeepSpeed's launch.py and Slurm's default KillWait leave "
                f"between SIGTERM and SIGKILL")
    else:
        fits = (f"LONGER than the {grace_seconds:g} s that DeepSpeed's launch.py and Slurm's default KillWait leave "
                f"between SIGTERM and SIGKILL: a SIGTERM this late would lose the save; under Slurm ask for "
                f"`#SBATCH --signal=USR1@{max(60, 2 * math.ceil(taken))}` (the ranks save on SIGUSR1 while "
                f"nothing kills them; `dstk launch --slurm` writes it) or save more often (--save-every)")
    return (f"dstk: {name} reached the ranks: saved the checkpoint of step {step} of {num_steps} ({checkpoint}); "
            f"{timing}: {fits}")


def _seconds(value: float) -> str:
    return f"{value:.1f}" if value >= 1 else f"{value:.2f}"


def save(engine, spec: TrainSpec, *, step: int, rank: int, samples: int) -> None:
    """``samples``: training samples read through ``step`` (the data position, ``dstk_samples``)."""
    import torch
    import deepspeed.comm as dist

    root = Path(spec.output_dir) / "checkpoints"
    engine.save_checkpoint(str(root), tag=ckpt.temp_tag_for(step),
                           client_state={"dstk_step": step, "dstk_samples": samples}, save_latest=False)
    torch.save(_rng_state(), root / ckpt.temp_tag_for(step) / f"dstk_rng_rank{rank}.pt")
    dist.barrier()  # every rank's files are written before the tag is published
    if rank == 0:
        ckpt.publish(root, step=step, meta={"world_size": spec.world_size})
    dist.barrier()


def export(engine, model_cls_config, spec: TrainSpec, *, rank: int) -> str | None:
    """Gather full weights (ZeRO-3 partitions, AutoTP shards) and write an HF directory on rank 0."""
    import torch
    from transformers import AutoModelForCausalLM

    if engine.zero_optimization_stage() == 3 or spec.tp > 1:
        state = engine._consolidated_16bit_state_dict()  # collective: every rank calls it
    else:
        state = engine.module.state_dict() if rank == 0 else None
    if rank != 0:
        return None
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[spec.precision]
    model = AutoModelForCausalLM.from_config(model_cls_config, dtype=dtype, **attn_kwargs(spec))
    missing, unexpected = model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    missing = [k for k in missing if k not in tied and not (model.config.tie_word_embeddings and "lm_head" in k)]
    if missing or unexpected:
        raise RuntimeError(f"export: state dict does not match the model: missing {missing}, unexpected {unexpected}")
    tmp = Path(tempfile.mkdtemp(prefix=".model-", dir=spec.output_dir))
    model.save_pretrained(str(tmp))
    return _publish_model(spec, tmp)


def _publish_model(spec: TrainSpec, tmp: Path, *, name: str = "model") -> str:
    """Move a finished export into OUTPUT/<name>; an older export is replaced only once the new one is whole."""
    import shutil

    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(spec.tokenizer_dir).save_pretrained(str(tmp))
    target = Path(spec.output_dir) / name
    if target.exists():
        old = target.with_name(f".{name}-old-{os.getpid()}")
        os.rename(target, old)
        os.rename(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, target)
    return str(target)


def export_lora(engine, model_config, spec: TrainSpec, *, rank: int) -> dict | None:
    """Rank 0: the trained adapters as ``save_pretrained`` of the PEFT model in OUTPUT/adapter;
    for a random-init base (nothing else holds it) the base in OUTPUT/base; with ``merge`` the
    base with the adapters folded in (``merge_and_unload``) in OUTPUT/model. All in the run's
    precision (the engine's weights): one model on rank 0, not an fp32 copy of a large base.

    The adapter's ``base_model_name_or_path`` is the base's absolute path (OUTPUT/base or the
    ``--model`` directory), so peft's ``AutoPeftModelForCausalLM.from_pretrained(OUTPUT/adapter)``
    loads both. ZeRO-3 partitions (frozen ones included) are gathered as for a full export."""
    import torch
    from transformers import AutoModelForCausalLM

    from dstk.train import lora

    if engine.zero_optimization_stage() == 3:
        state = engine._consolidated_16bit_state_dict()  # collective: every rank calls it
    else:
        state = engine.module.state_dict() if rank == 0 else None
    if rank != 0:
        return None
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[spec.precision]
    out = Path(spec.output_dir)
    written = {}
    if spec.pretrained:
        base_path = spec.model_source
    else:
        base_state = {k.removeprefix("base_model.model.").replace(".base_layer.", "."): v
                      for k, v in state.items() if not lora.is_adapter_key(k)}
        base = AutoModelForCausalLM.from_config(model_config, dtype=dtype, **attn_kwargs(spec))
        _load_exact(base, {k: v.to(dtype) for k, v in base_state.items()})
        tmp = Path(tempfile.mkdtemp(prefix=".base-", dir=out))
        base.save_pretrained(str(tmp))
        del base
        base_path = written["base_dir"] = _publish_model(spec, tmp, name="base")
    if spec.lora.bits:
        # QLoRA: the engine's base is 4-bit; the adapters go onto the full-precision source weights
        # (the usual way to merge a QLoRA adapter). Untested here: no GPU.
        model = lora.apply(AutoModelForCausalLM.from_pretrained(spec.model_source, dtype=dtype, **attn_kwargs(spec)),
                           spec.lora)
        missing, unexpected = model.load_state_dict(
            {k: v.to(dtype) for k, v in state.items() if lora.is_adapter_key(k)}, strict=False)
        if unexpected or any(lora.is_adapter_key(k) for k in missing):
            raise RuntimeError(f"export: adapter weights do not match: missing {missing}, unexpected {unexpected}")
    else:
        model = lora.apply(AutoModelForCausalLM.from_config(model_config, dtype=dtype, **attn_kwargs(spec)), spec.lora)
        _load_exact(model, {k: v.to(dtype) for k, v in state.items()})
    written["base_model"] = model.peft_config["default"].base_model_name_or_path = str(Path(base_path).resolve())
    tmp = Path(tempfile.mkdtemp(prefix=".adapter-", dir=out))
    model.save_pretrained(str(tmp))
    written["adapter_dir"] = _publish_model(spec, tmp, name="adapter")
    if spec.merge:
        merged = model.merge_and_unload()
        tmp = Path(tempfile.mkdtemp(prefix=".model-", dir=out))
        merged.save_pretrained(str(tmp))
        written["model_dir"] = _publish_model(spec, tmp)
    return written


def _load_exact(model, state: dict) -> None:
    """``load_state_dict`` that tolerates only a tied lm_head missing."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = getattr(model.config, "tie_word_embeddings", False)
    missing = [k for k in missing if not (tied and "lm_head" in k)]
    if missing or unexpected:
        raise RuntimeError(f"export: state dict does not match the model: missing {missing}, unexpected {unexpected}")


def export_pipeline(spec: TrainSpec, *, rank: int, step: int) -> str | None:
    """Rank 0: the final pipeline checkpoint back to HF names through issue 5's ``export_hf``."""
    if rank != 0:
        return None
    from dstk.models import export_hf

    tmp = Path(spec.output_dir) / f".model-export-{os.getpid()}"
    export_hf(Path(spec.output_dir) / "checkpoints", tmp, config=spec.model_source, tag=ckpt.tag_for(step),
              dtype=spec.precision)
    return _publish_model(spec, tmp)


def main(argv: list[str]) -> int:
    import torch
    import deepspeed
    import deepspeed.comm as dist

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # save_pretrained's shard bar: noise in rank-prefixed logs
    spec = TrainSpec.load(argv[0])
    # Before anything slow: a stop signal from here on saves at the end of a step instead of killing the rank.
    stop = StopRequest()
    stop.install()
    deepspeed.init_distributed(dist_backend="gloo" if not torch.cuda.is_available() else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != spec.world_size:
        raise SystemExit(f"dstk: this run was prepared for {spec.world_size} ranks but {world} started")
    config = json.loads(Path(spec.ds_config).read_text(encoding="utf-8"))
    if "wandb" in spec.report_to:  # DeepSpeed's wandb block has no directory or mode: wandb reads these
        from dstk.train.logs import wandb_env

        os.environ.update(wandb_env(logs_dir=str(Path(spec.output_dir) / "logs")))
    random.seed(spec.seed)
    torch.manual_seed(spec.seed)
    model = build_model(spec)
    # What transformers resolved (the plan's kernel, or its default for a spec without one): said, and in summary.json.
    attention = model.config._attn_implementation
    if rank == 0:
        _say(f"attention: {attention}" + (" (the plan's training.attention)" if spec.attn_implementation else
                                          " (transformers' default: the run directory's plan names no kernel)"))
    train = torch.load(spec.train_blocks)
    evals = torch.load(spec.eval_blocks) if spec.eval_blocks else None
    seq_len = train.shape[1]
    if spec.pp > 1:
        from dstk.models import to_pipeline

        model = to_pipeline(model, num_stages=spec.pp, seq_len=seq_len)
    # Only trainable parameters go to the optimizer: with LoRA the frozen base gets no gradients, no
    # optimizer state and no fp32 master copy (ZeRO-3 still partitions it with the rest of the module).
    trainable = [p for p in model.parameters() if p.requires_grad]
    if spec.lora is not None and rank == 0:
        total = sum(p.numel() for p in model.parameters())
        count = sum(p.numel() for p in trainable)
        _say(f"LoRA: {count:,} trainable parameters of {total:,} ({100 * count / total:.2f}%); the base is frozen")
    root = Path(spec.output_dir) / "checkpoints"
    # On another number of ranks than the checkpoint's, DeepSpeed loads its universal copy (made by
    # `dstk finetune --resume --gpus N`, dstk.train.elastic), which needs checkpoint.load_universal.
    resume_from = elastic.resume_source(root, world_size=world) if spec.resume else None
    if resume_from is not None and resume_from.universal:
        config = elastic.universal_config(config)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=trainable, config=config)
    micro, accum = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    dp = world // (spec.tp * spec.pp)
    # AutoTP groups are consecutive ranks; a pipeline's data-parallel rank comes from its grid.
    dp_rank = engine.grid.get_data_parallel_id() if spec.pp > 1 else rank // spec.tp
    global_batch = micro * accum * dp
    device = engine.device

    start = samples = 0
    if spec.resume:
        if resume_from is not None:
            start, tag = resume_from.step, resume_from.tag
            path, client = engine.load_checkpoint(str(root), tag=resume_from.load_tag)
            if path is None or client.get("dstk_step") != start:
                raise SystemExit(f"dstk: checkpoint {root / resume_from.load_tag} did not load")
            # Checkpoints older than dstk_samples were written with this run's unchanged global batch.
            samples = int(client.get("dstk_samples", start * global_batch))
            rng = root / tag / f"dstk_rng_rank{rank}.pt"
            # A rank the checkpoint did not have takes rank 0's RNG state (every rank is seeded alike).
            rng = rng if rng.is_file() else root / tag / "dstk_rng_rank0.pt"
            _set_rng_state(torch.load(rng, weights_only=False))
            if rank == 0:
                via = (f" (written by {resume_from.saved_world_size} ranks, loaded on {world} through DeepSpeed's "
                       f"universal checkpoint {root / resume_from.load_tag})" if resume_from.universal else "")
                then = (f"continuing at step {start + 1}" if start < spec.num_steps else
                        f"that was the last of its {spec.num_steps} steps: evaluating and exporting it again")
                _say(f"resumed from {root / tag} (step {start}){via}; {then}")
        elif rank == 0:
            _say(f"no complete checkpoint in {root}; starting from step 1")
    if rank == 0:
        for p in ckpt.remove_partial(root):
            _say(f"removed incomplete checkpoint {p}")
        if spec.resume:
            from dstk.train.logs import continue_csv_monitor

            # The steps after the checkpoint are trained again: their csv rows go, and no second header comes.
            continue_csv_monitor(engine.monitor, last_step=start, last_samples=engine.global_samples)
    dist.barrier()

    tokens_per_step = global_batch * seq_len
    first = last = None
    t0 = time.perf_counter()
    monitor = engine.monitor
    for step in range(start, spec.num_steps):
        # The data order is a function of the sample position, not of the rank count (dstk.train.elastic).
        blocks = elastic.sample_blocks(samples + (step - start) * global_batch, count=global_batch,
                                       num_blocks=len(train), seed=spec.seed)
        losses = []
        micro_batches = rank_micro_batches(blocks, dp_rank=dp_rank, dp=dp, micro_batch=micro, grad_accum=accum)
        if spec.pp > 1:  # the pipeline engine runs the micro-batches and the optimizer step itself
            data = iter([(train[idx].to(device), train[idx].to(device)) for idx in micro_batches])
            losses.append(float(engine.train_batch(data_iter=data)))
        else:
            for idx in micro_batches:
                batch = train[idx].to(device)
                loss = lm_loss(engine, batch)
                engine.backward(loss)
                engine.step()
                losses.append(float(loss.detach()))
        loss = _all_mean(sum(losses) / len(losses))
        done = step + 1
        first = loss if first is None else first
        last = loss
        elapsed = time.perf_counter() - t0
        lr = engine.get_lr()[0]
        tps = tokens_per_step * (done - start) / max(elapsed, 1e-9)
        events = [("Train/loss", loss, done), ("Train/lr", lr, done), ("Train/tokens_per_second", tps, done)]
        if spec.eval_every and evals is not None and done % spec.eval_every == 0 and done != spec.num_steps:
            ev = evaluate(engine, evals.to(device), micro_batch=micro)
            events += [("Eval/loss", ev, done), ("Eval/perplexity", math.exp(min(ev, 50)), done)]
            if rank == 0:
                _say(f"step {done}: eval loss {ev:.4f}, perplexity {math.exp(min(ev, 50)):.2f}")
        monitor.write_events(events)  # rank 0 only, inside DeepSpeed's monitor
        if rank == 0:  # a record every step: the parent draws it (dstk.train.logs.RunSink)
            _say(progress_record(step=done, num_steps=spec.num_steps, loss=loss, tokens_per_second=tps, lr=lr,
                                 elapsed_seconds=elapsed, start_step=start,
                                 log=done % spec.log_every == 0 or done == spec.num_steps or done == start + 1))
        saved_seconds = None
        if spec.save_every and done % spec.save_every == 0 and done != spec.num_steps:
            began = time.perf_counter()
            save(engine, spec, step=done, rank=rank, samples=samples + (done - start) * global_batch)
            saved_seconds = time.perf_counter() - began
        signum = agree_stop(stop.signum)
        if signum:
            # Preempted (or stopped): every rank saves this step, unless --save-every just did, and exits.
            if saved_seconds is None:
                began = time.perf_counter()
                save(engine, spec, step=done, rank=rank, samples=samples + (done - start) * global_batch)
                saved_seconds = time.perf_counter() - began
            if rank == 0:
                since = None if stop.monotonic_seconds is None else time.monotonic() - stop.monotonic_seconds
                _say(stop_line(signum=signum, step=done, num_steps=spec.num_steps,
                               checkpoint=str(root / ckpt.tag_for(done)), save_seconds=saved_seconds,
                               since_signal_seconds=since))
            engine.destroy()
            return 128 + signum  # not 0: the run did not finish (dstk.train.logs.RunSink.saved_on_signal)
    elapsed = time.perf_counter() - t0
    ev = None
    if evals is not None:
        ev = evaluate(engine, evals.to(device), micro_batch=micro)
        monitor.write_events([("Eval/loss", ev, spec.num_steps), ("Eval/perplexity", math.exp(min(ev, 50)), spec.num_steps)])
    last_ckpt = None
    if start < spec.num_steps:
        save(engine, spec, step=spec.num_steps, rank=rank, samples=samples + (spec.num_steps - start) * global_batch)
        last_ckpt = str(root / ckpt.tag_for(spec.num_steps))
    # The trained engine on one micro-batch (logits; the loss for a pipeline, whose logits stay on
    # the last stage): anyone can compare the exported model with it.
    source = evals if evals is not None else train
    probe = source[[j % len(source) for j in range(micro)]].to(device)
    probe_out = {"input_ids": probe.cpu(), "loss": evaluate(engine, probe, micro_batch=micro)}
    if spec.pp == 1:
        # Logits on a short prefix of one row (causal: the same as in the full row); a full
        # micro-batch of a 128k vocabulary would be gigabytes.
        head = probe[:1, :64]
        engine.eval()
        with torch.no_grad():
            probe_out["logits"] = engine(input_ids=head).logits.float().cpu()
        probe_out["logits_input_ids"] = head.cpu()
    written = None
    if spec.pp > 1:
        out = export_pipeline(spec, rank=rank, step=spec.num_steps)
    elif spec.lora is not None:
        from transformers import AutoConfig

        written = export_lora(engine, AutoConfig.from_pretrained(spec.model_source), spec, rank=rank)
        out = written and written.get("model_dir", written["adapter_dir"])
    else:
        from transformers import AutoConfig

        out = export(engine, AutoConfig.from_pretrained(spec.model_source), spec, rank=rank)
    if rank == 0:
        torch.save(probe_out, Path(spec.output_dir) / "probe_logits.pt")
        summary = {"steps": spec.num_steps, "start_step": start, "first_loss": first, "last_loss": last,
                   "eval_loss": ev, "eval_perplexity": None if ev is None else math.exp(min(ev, 50)),
                   "tokens": tokens_per_step * (spec.num_steps - start), "seconds": elapsed,
                   "export_dir": out, "checkpoint": last_ckpt, **(written or {}), "attn_implementation": attention,
                   # On a GPU: the allocator's peak on rank 0 (what dstk estimate predicts per GPU).
                   "peak_memory_bytes": torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None}
        from dstk.launch.run import write_atomic

        write_atomic(Path(spec.output_dir) / "summary.json", json.dumps(summary, indent=2) + "\n")
        # first is None when no step was left (a resume of a finished run): format_summary says so
        _say(format_summary(num_steps=spec.num_steps - start, first_loss=first, last_loss=last, eval_loss=ev,
                            tokens=summary["tokens"], elapsed_seconds=elapsed,
                            export_dir=written.get("model_dir") if written else out, checkpoint=last_ckpt,
                            adapter_dir=(written or {}).get("adapter_dir"), base_dir=(written or {}).get("base_model")))
    engine.destroy()
    return 0


if __name__ == "__main__":
    # The deepspeed runner appends --local_rank=N; the spec file is the one positional argument.
    from dstk.launch.rank import exit_rank

    exit_rank(main([a for a in sys.argv[1:] if not a.startswith("--local_rank")]))
