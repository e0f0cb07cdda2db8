"""The progress line and the final summary (pure functions of the figures), and the structured
record a rank prints so that the parent ``dstk finetune`` can draw the line (``dstk.train.logs``)."""

from __future__ import annotations

import json

PROGRESS_TAG = "DSTK_PROGRESS "
"""Starts the one-line JSON record rank 0 prints after every optimizer step (``progress_record``)."""


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    minutes, s = divmod(seconds, 60)
    hours, m = divmod(minutes, 60)
    return f"{hours}:{m:02d}:{s:02d}" if hours else f"{m:02d}:{s:02d}"


def eta_seconds(*, step: int, num_steps: int, start_step: int, elapsed_seconds: float) -> float:
    """elapsed / steps done by this process x steps left: the mean step time so far (DeepSpeed's
    first step is slower, so the estimate starts high and settles). A resumed process counts from
    its ``start_step``, not from 0."""
    done = step - start_step
    return elapsed_seconds / done * (num_steps - step) if done > 0 else 0.0


def format_progress(*, step: int, num_steps: int, loss: float, tokens_per_second: float, lr: float,
                    elapsed_seconds: float, width: int = 20, start_step: int = 0,
                    max_columns: int | None = None) -> str:
    """``[#####.....] 5/10 loss 4.321 1.2k tok/s lr 1.0e-03 00:03<00:03`` (elapsed<ETA, ``eta_seconds``).

    ``max_columns``: the line never gets longer; the bar narrows to 10, then goes, then the
    elapsed time (ETA stays), lr and tokens/s go, in that order; a terminal narrower than
    ``5/10 loss 4.3211 ETA 00:05`` gets that text cut."""
    eta = eta_seconds(step=step, num_steps=num_steps, start_step=start_step, elapsed_seconds=elapsed_seconds)
    tps = (f"{tokens_per_second / 1e6:.1f}M" if tokens_per_second >= 1e6 else
           f"{tokens_per_second / 1000:.1f}k" if tokens_per_second >= 1000 else f"{tokens_per_second:.0f}")

    def bar(cells: int) -> list[str]:
        done = int(cells * step / num_steps)
        return [f"[{'#' * done}{'.' * (cells - done)}]"] if cells else []

    def line(cells: int, *, clock: bool = True, rate: bool = True, lr_shown: bool = True) -> str:
        parts = bar(cells) + [f"{step}/{num_steps}", f"loss {loss:.4f}"]
        parts += [f"{tps} tok/s"] if rate else []
        parts += [f"lr {lr:.2e}"] if lr_shown else []
        parts += [f"{_duration(elapsed_seconds)}<{_duration(eta)}" if clock else f"ETA {_duration(eta)}"]
        return " ".join(parts)

    full = line(width)
    if max_columns is None or len(full) <= max_columns:
        return full
    for text in (line(10), line(0), line(0, clock=False), line(0, clock=False, lr_shown=False),
                 line(0, clock=False, lr_shown=False, rate=False)):
        if len(text) <= max_columns:
            return text
    return text[:max(max_columns, 0)]


def progress_record(*, step: int, num_steps: int, loss: float, tokens_per_second: float, lr: float,
                    elapsed_seconds: float, start_step: int = 0, log: bool = True) -> str:
    """One line: ``PROGRESS_TAG`` + JSON of the figures; ``log`` says whether this step is one of
    the ``--log-every`` steps (the line printed in logs and pipes)."""
    return PROGRESS_TAG + json.dumps({"step": step, "num_steps": num_steps, "loss": loss,
                                      "tokens_per_second": tokens_per_second, "lr": lr,
                                      "elapsed_seconds": elapsed_seconds, "start_step": start_step, "log": log})


def parse_record(text: str) -> dict | None:
    """The figures of a ``progress_record`` line (its rank prefix already removed), or None."""
    if not text.startswith(PROGRESS_TAG):
        return None
    try:
        data = json.loads(text[len(PROGRESS_TAG):])
        fields = {k: data[k] for k in ("step", "num_steps", "loss", "tokens_per_second", "lr", "elapsed_seconds")}
        return {**fields, "start_step": int(data.get("start_step", 0)), "log": bool(data.get("log", True))}
    except (ValueError, KeyError, TypeError):
        return None


def format_summary(*, num_steps: int, first_loss: float | None, last_loss: float | None, eval_loss: float | None,
                   tokens: int, elapsed_seconds: float, export_dir: str | None, checkpoint: str | None,
                   adapter_dir: str | None = None, base_dir: str | None = None) -> str:
    """The run's closing lines. ``first_loss`` None: this process trained no step (a ``--resume`` of a run whose
    checkpoint already had every step), and says so instead of a loss."""
    import math

    if first_loss is None or last_loss is None:
        lines = ["no step left to train: the checkpoint resumed from had every step"]
    else:
        lines = [f"trained {num_steps} steps in {elapsed_seconds:.1f} s "
                 f"({tokens / max(elapsed_seconds, 1e-9):,.0f} tok/s): loss {first_loss:.4f} -> {last_loss:.4f}"]
    if eval_loss is not None:
        lines.append(f"eval loss {eval_loss:.4f}, perplexity {math.exp(min(eval_loss, 50)):.2f}")
    if checkpoint:
        lines.append(f"checkpoint: {checkpoint}")
    if adapter_dir:
        lines.append(f"LoRA adapter: {adapter_dir}  (peft's AutoPeftModelForCausalLM.from_pretrained loads it "
                     f"with its base{': ' + base_dir if base_dir else ''})")
    if export_dir:
        merged = "merged " if adapter_dir else ""
        lines.append(f"exported {merged}HF model: {export_dir}  (AutoModelForCausalLM.from_pretrained loads it)")
    return "\n".join(lines)
