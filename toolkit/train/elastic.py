"""Resume a fine-tune on a different number of ranks (GPUs lost, or given back).

Three parts, each a function a test can call:

- ``replan``: the run's plan for N ranks. The model, precision, tensor/pipeline degrees, ZeRO stage
  and offload stay; dstk's planner re-checks memory and picks the layout for N ranks with the same
  global batch. The micro-batch is kept when it still divides the batch (then only the number of
  gradient-accumulation steps changes, and activations per GPU are what they were). A global batch
  that does not divide among the new data-parallel ranks becomes the nearest one that does, and the
  note says so. The run's DeepSpeed config keeps every key (optimizer, scheduler, ZeRO buckets)
  except the batch triad, so the optimizer and scheduler states in the checkpoint still apply.
- ``convert``: the newest complete checkpoint as a DeepSpeed universal checkpoint
  (``deepspeed.checkpoint.ds_to_universal``, run in-process with one worker: its process pools are not
  needed for a fine-tune's checkpoint), written atomically next to it as ``step-000020-universal``
  with the ``dstk_complete.json`` marker. DeepSpeed loads it at any data-parallel degree with
  ``"checkpoint": {"load_universal": true}`` (engine.py ``load_checkpoint`` -> ``_load_zero_checkpoint``
  with a ``checkpoint_folder``: every rank reads its slice of each parameter's fp32 weights and Adam
  moments from ``zero/<name>/``). A ZeRO-0 checkpoint (no ``*_optim_states.pt`` files) holds the whole
  optimizer in ``mp_rank_00_model_states.pt`` and loads at any degree as it is.
- ``sample_blocks``: the data order as a function of the sample position, not of the rank count:
  step ``s`` reads samples ``[first, first + global_batch)`` of the seeded epoch stream, where
  ``first`` is carried in the checkpoint (``dstk_samples``). With an unchanged global batch this is
  exactly ``dstk.train.data.step_blocks``; with a changed one no sample is lost or repeated.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
from pathlib import Path

from dstk.errors import DstkError
from dstk.train import checkpoint as ckpt
from dstk.train.spec import TrainSpec

UNIVERSAL_SUFFIX = "-universal"


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Rebatch:
    """The batch of the run on the new number of data-parallel ranks."""

    global_batch: int
    micro_batch: int | None
    """The micro-batch to pin (the old one, when it still divides); None: the planner chooses."""
    note: str | None
    """What changed in the global batch and why; None when it is kept."""


def rebatch(*, global_batch: int, micro_batch: int, dp: int) -> Rebatch:
    """Keep the global batch B on ``dp`` ranks: the old micro-batch m when ``B % (m * dp) == 0``
    (accumulation B / (m * dp)); else the planner picks a micro-batch dividing B / dp; when
    ``B % dp != 0`` no layout keeps B, and the nearest multiple of ``dp`` is taken (the smaller on a
    tie: it needs no more memory), with a note that says so."""
    if global_batch % dp == 0:
        keep = micro_batch if global_batch % (micro_batch * dp) == 0 else None
        return Rebatch(global_batch=global_batch, micro_batch=keep, note=None)
    low, high = (global_batch // dp) * dp, (global_batch // dp + 1) * dp
    new = low if low > 0 and global_batch - low <= high - global_batch else high
    note = (f"global batch {global_batch} -> {new} sequences: {global_batch} does not divide among {dp} data-parallel "
            f"ranks, {new} is the nearest that does; each step now reads {new} samples from where the checkpoint "
            f"stopped (no sample is lost or repeated), the learning-rate schedule keeps its step count")
    return Rebatch(global_batch=new, micro_batch=micro_batch if new % (micro_batch * dp) == 0 else None, note=note)


def intent_of_plan(plan: dict, *, num_ranks: int, global_batch: int, micro_batch: int | None):
    """The intent that plans ``plan``'s run again on ``num_ranks`` ranks of one node: its model
    dimensions, GPU (memory as planned), precision, optimizer and LoRA adapters, with its
    tensor/pipeline degrees, ZeRO stage, offload and recompute pinned."""
    from dstk.intent import intent_from_dict

    m, c, t, lay = plan["model"], plan["cluster"], plan["training"], plan["layout"]
    dims = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size")
    cluster = {"num_nodes": 1, "gpus_per_node": num_ranks, "gpu": c["gpu"]}
    if c.get("gpu_memory_bytes"):
        cluster["gpu_memory_gib"] = c["gpu_memory_bytes"] / 2**30
    if c.get("interconnect"):
        cluster["interconnect"] = c["interconnect"]
    if c.get("host_memory_bytes"):
        cluster["host_memory_gib"] = c["host_memory_bytes"] / 2**30
    constraints = {"tp": lay["tp"], "pp": lay["pp"], "zero_stage": lay["zero_stage"],
                   "offload_optimizer": lay.get("offload_optimizer", "none"),
                   "offload_params": lay.get("offload_params", "none"),
                   "recompute": lay.get("recompute", "none"), "engine": plan.get("engine", "deepspeed")}
    if c.get("memory_headroom") is not None:
        constraints["memory_headroom"] = c["memory_headroom"]
    if micro_batch is not None:
        constraints["micro_batch"] = micro_batch
    training = {"seq_len": t["seq_len"], "global_batch": global_batch, "precision": t["precision"],
                "optimizer": t.get("optimizer", "adamw"), "attention": t.get("attention", "sdpa")}
    # A LoRA plan prices frozen base weights and the adapters (plan.json training.lora).
    training.update({f"lora_{k}": v for k, v in (t.get("lora") or {}).items() if v is not None})
    return intent_from_dict({"model": {k: m[k] for k in dims}, "cluster": cluster, "training": training,
                             "constraints": constraints}, source="the run's plan.json")


def with_batch(config: dict, *, global_batch: int, micro_batch: int, grad_accum: int) -> dict:
    """``config`` with only the batch triad changed."""
    out = json.loads(json.dumps(config))
    out.update(train_batch_size=global_batch, train_micro_batch_size_per_gpu=micro_batch,
               gradient_accumulation_steps=grad_accum)
    return out


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Replan:
    run_dir: Path
    """The new run directory (plan.json for N ranks)."""
    config: dict
    """The run's effective DeepSpeed config with the new batch triad."""
    dp: int
    micro_batch: int
    grad_accum: int
    global_batch: int
    notes: tuple[str, ...]


def replan(*, plan: dict, config: dict, num_ranks: int, run_dir: str | os.PathLike) -> Replan:
    """Plan the run again for ``num_ranks`` ranks (see the module docstring) and write the run
    directory into ``run_dir``: the new ``plan.json`` (layout, memory, why lines) and ``config`` (the
    run directory's DeepSpeed config) with the new batch triad. The other files ``dstk generate``
    writes (HF, accelerate, Megatron) are left out: they would be rendered from defaults, not from
    the run's config."""
    from dstk import plan as planner
    from dstk.render import write_files

    lay, old_world = plan["layout"], int(plan["cluster"]["num_nodes"]) * int(plan["cluster"]["gpus_per_node"])
    tp, pp = int(lay.get("tp", 1)), int(lay.get("pp", 1))
    if tp > 1 or pp > 1:
        raise DstkError(f"resuming on {num_ranks} ranks: the run has tensor/pipeline parallelism (tp {tp}, pp {pp}); "
                        "dstk changes the rank count of data-parallel runs only (DeepSpeed's universal checkpoint of "
                        "a pipeline needs Megatron-DeepSpeed's layer files)",
                        hint=f"resume on the run's {old_world} ranks (`--resume` without --gpus), or start a new "
                             f"--output planned for {num_ranks}")
    if num_ranks < 1:
        raise DstkError(f"--gpus {num_ranks}: expected at least 1", hint="e.g. --gpus 1")
    micro, accum = int(config["train_micro_batch_size_per_gpu"]), int(config["gradient_accumulation_steps"])
    old_batch = micro * accum * int(lay["dp"])
    rb = rebatch(global_batch=old_batch, micro_batch=micro, dp=num_ranks)
    ctx = planner.resolve(intent_of_plan(plan, num_ranks=num_ranks, global_batch=rb.global_batch,
                                         micro_batch=rb.micro_batch))
    result = planner.plan_intent(ctx, top=None)
    if not result.plans:
        raise DstkError(f"resuming on {num_ranks} ranks: " + planner.nothing_fits_message(ctx, result),
                        hint="resume on more GPUs (--gpus), or plan a new run with a memory-saving layout")
    files = planner.run_dir_files(ctx, result, index=0)
    new = result.plans[0].layout
    out = with_batch(config, global_batch=rb.global_batch, micro_batch=new.micro_batch, grad_accum=new.grad_accum)
    write_files(run_dir, {"plan.json": files["plan.json"], "ds_config.json": json.dumps(out, indent=2) + "\n"},
                force=True)
    notes = [f"re-planned for {num_ranks} rank(s): dp {new.dp} x micro-batch {new.micro_batch} x "
             f"{new.grad_accum} accumulation step(s) = {rb.global_batch} sequences per step (was dp {lay['dp']} x "
             f"{micro} x {accum}); {planner.gib(result.plans[0].estimate.memory.per_gpu.total_bytes)} per rank of "
             f"{planner.gib(result.usable_bytes)} usable -> {run_dir}/"]
    if rb.note:
        notes.append(rb.note)
    return Replan(run_dir=Path(run_dir), config=out, dp=new.dp, micro_batch=new.micro_batch, grad_accum=new.grad_accum,
                  global_batch=rb.global_batch, notes=tuple(notes))


def resume_on(spec: TrainSpec, *, num_ranks: int, log) -> TrainSpec:
    """The parent side of ``dstk finetune --resume --gpus N``: re-plan into OUTPUT/plan-ranks-N,
    rewrite the batch triad of OUTPUT/ds_config.json, convert the newest complete checkpoint when
    it is partitioned by another number of ranks; return the spec for N ranks (not yet written)."""
    from dstk.launch.run import write_atomic
    from dstk.launch.rundir import read_plan

    if spec.trainer != "native":
        raise DstkError(f"--resume on {num_ranks} ranks with --trainer {spec.trainer}: transformers' Trainer "
                        "resumes from its own checkpoints at the same world size",
                        hint=f"resume on the run's {spec.world_size} ranks (drop --gpus/--ranks)")
    out = Path(spec.output_dir)
    plan = read_plan(spec.run_dir)
    plan_config = json.loads((Path(spec.run_dir) / "ds_config.json").read_text(encoding="utf-8"))
    run_config = json.loads(Path(spec.ds_config).read_text(encoding="utf-8"))
    new = replan(plan=plan, config=plan_config, num_ranks=num_ranks, run_dir=out / f"plan-ranks-{num_ranks}")
    for note in new.notes:
        log(note)
    root = out / "checkpoints"
    found = ckpt.newest_complete(root)
    if found is None:
        log(f"no complete checkpoint in {root}: the run starts again from step 1 on {num_ranks} rank(s)")
    else:
        step, tag = found
        saved = saved_world_size(root / tag)
        if saved == num_ranks or not is_partitioned(root / tag):
            log(f"{root / tag} loads on {num_ranks} rank(s) as it is"
                + ("" if saved == num_ranks else " (ZeRO-0: the optimizer state is not partitioned)"))
        else:
            log_path = out / "logs" / f"universal-{tag}.log"
            made = convert(root, step=step, log_path=log_path)
            log(f"converted {root / tag} (written by {saved} ranks) to DeepSpeed's universal checkpoint {made} "
                f"(log: {log_path}); the ranks load it with checkpoint.load_universal")
    effective = with_batch(run_config, global_batch=new.global_batch, micro_batch=new.micro_batch,
                           grad_accum=new.grad_accum)
    write_atomic(spec.ds_config, json.dumps(effective, indent=2) + "\n")
    return dataclasses.replace(spec, world_size=num_ranks, run_dir=str(new.run_dir.resolve()))


# --- checkpoints -----------------------------------------------------------------------------------

def universal_tag_for(step: int) -> str:
    return ckpt.tag_for(step) + UNIVERSAL_SUFFIX


def saved_world_size(tag_dir: str | os.PathLike) -> int | None:
    """The world size a complete checkpoint was written by (its marker), None if not recorded."""
    try:
        return int(json.loads((Path(tag_dir) / ckpt.MARKER).read_text(encoding="utf-8"))["world_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def is_partitioned(tag_dir: str | os.PathLike) -> bool:
    """ZeRO-1/2/3 (and DeepSpeed's bf16 optimizer) write the optimizer state in one file per
    data-parallel rank (``*_optim_states.pt``); ZeRO-0 keeps it whole in the model states file."""
    return any(Path(tag_dir).glob("*_optim_states.pt"))


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class ResumeSource:
    step: int
    tag: str
    """The complete checkpoint (``step-000020``): the RNG states live there."""
    load_tag: str
    """What ``engine.load_checkpoint`` reads: ``tag``, or its universal copy."""
    universal: bool
    saved_world_size: int | None


def resume_source(checkpoint_dir: str | os.PathLike, *, world_size: int) -> ResumeSource | None:
    """Where a resume on ``world_size`` ranks loads from: the newest complete checkpoint, through its
    universal copy when it was written by another number of ranks and is partitioned."""
    found = ckpt.newest_complete(checkpoint_dir)
    if found is None:
        return None
    step, tag = found
    root = Path(checkpoint_dir)
    saved = saved_world_size(root / tag)
    if saved in (None, world_size) or not is_partitioned(root / tag):
        return ResumeSource(step=step, tag=tag, load_tag=tag, universal=False, saved_world_size=saved)
    universal = universal_tag_for(step)
    if not (root / universal / ckpt.MARKER).is_file():
        raise DstkError(f"{root / tag} was written by {saved} ranks and has no universal copy for {world_size}",
                        hint="resume through `dstk finetune --resume --output OUT --gpus N`, which converts it")
    return ResumeSource(step=step, tag=tag, load_tag=universal, universal=True, saved_world_size=saved)


def universal_config(config: dict) -> dict:
    """``config`` with ``"checkpoint": {"load_universal": true}`` (deepspeed/runtime/config.py reads
    ``checkpoint.load_universal``)."""
    out = json.loads(json.dumps(config))
    out["checkpoint"] = {**(out.get("checkpoint") or {}), "load_universal": True}
    return out


def convert(checkpoint_dir: str | os.PathLike, *, step: int, log_path: str | os.PathLike) -> Path:
    """Convert the complete checkpoint of ``step`` to a universal checkpoint beside it, complete or
    absent: DeepSpeed's converter writes into ``.tmp-step-000020-universal/step-000020-universal``
    (it also writes ``latest_universal`` into the parent, kept out of the real checkpoint directory
    so), the marker goes in, and a rename publishes it. Its output goes to ``log_path``. An existing
    complete copy is reused."""
    import argparse

    root = Path(checkpoint_dir)
    tag, final = ckpt.tag_for(step), root / universal_tag_for(step)
    if (final / ckpt.MARKER).is_file():
        return final
    scratch = root / f".tmp-{universal_tag_for(step)}"
    shutil.rmtree(scratch, ignore_errors=True)
    target = scratch / universal_tag_for(step)
    args = argparse.Namespace(input_folder=str(root / tag), output_folder=str(target), num_extract_workers=1,
                              num_merge_workers=1, keep_temp_folder=False, strict=True, inject_missing_state=True)
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        from deepspeed.checkpoint import ds_to_universal

        try:
            ds_to_universal.main(args)
        except Exception as exc:
            shutil.rmtree(scratch, ignore_errors=True)
            raise DstkError(f"DeepSpeed's universal checkpoint converter failed on {root / tag}: "
                            f"{type(exc).__name__}: {exc}",
                            hint=f"resume on the {saved_world_size(root / tag)} ranks that wrote it; the "
                                 f"converter's output is in {log_path}") from None
    from dstk.launch.run import write_atomic

    write_atomic(target / ckpt.MARKER, json.dumps({"step": step, "universal": True, "source": tag,
                                                   "world_size": saved_world_size(root / tag)}) + "\n")
    if final.exists():
        shutil.rmtree(final)
    os.rename(target, final)
    shutil.rmtree(scratch, ignore_errors=True)
    return final


# --- data order ------------------------------------------------------------------------------------

def sample_blocks(first_sample: int, *, count: int, num_blocks: int, seed: int) -> list[int]:
    """Block indices of samples ``first_sample .. first_sample + count - 1`` of the stream of seeded
    epochs (``dstk.train.data.epoch_order``): ``sample_blocks(s * B, count=B, ...)`` is
    ``step_blocks(s, global_batch=B, ...)``, and the order does not depend on the rank count."""
    from dstk.train.data import epoch_order

    out, orders = [], {}
    for i in range(first_sample, first_sample + count):
        epoch, pos = divmod(i, num_blocks)
        if epoch not in orders:
            orders[epoch] = epoch_order(num_blocks, epoch=epoch, seed=seed)
        out.append(orders[epoch][pos])
    return out
