"""The rank-0 progress line and the final summary (pure functions of the figures)."""

from __future__ import annotations


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    minutes, s = divmod(seconds, 60)
    hours, m = divmod(minutes, 60)
    return f"{hours}:{m:02d}:{s:02d}" if hours else f"{m:02d}:{s:02d}"


def format_progress(*, step: int, num_steps: int, loss: float, tokens_per_second: float, lr: float,
                    elapsed_seconds: float, width: int = 20) -> str:
    """``[#####.....] 5/10 loss 4.321 1.2k tok/s lr 1.0e-03 00:03<00:03``.

    ETA = elapsed / step * (num_steps - step): the mean step time so far (DeepSpeed's first step is
    slower, so the estimate starts high and settles)."""
    done = int(width * step / num_steps)
    bar = "#" * done + "." * (width - done)
    eta = elapsed_seconds / step * (num_steps - step) if step else 0.0
    tps = f"{tokens_per_second / 1000:.1f}k" if tokens_per_second >= 1000 else f"{tokens_per_second:.0f}"
    return (f"[{bar}] {step}/{num_steps} loss {loss:.4f} {tps} tok/s lr {lr:.2e} "
            f"{_duration(elapsed_seconds)}<{_duration(eta)}")


def format_summary(*, num_steps: int, first_loss: float, last_loss: float, eval_loss: float | None,
                   tokens: int, elapsed_seconds: float, export_dir: str | None, checkpoint: str | None,
                   adapter_dir: str | None = None, base_dir: str | None = None) -> str:
    import math

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
