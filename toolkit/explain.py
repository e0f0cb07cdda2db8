"""A report of a plan for people: memory per GPU per stage, the 1F1B pipeline timeline with its
bubble, communication against compute, stage balance, and the alternatives it beat.

``report(plan_json)`` turns a plan (``plan.json`` of a run directory, or one entry of
``dstk plan --format json``) into plain data; ``render_text`` prints it as tables (rich);
``write_pictures`` draws PNG/SVG files with matplotlib when it is installed (``dstk[explain]``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from dstk.render import stage_layers

MEMORY_TERMS = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "buffers_bytes",
                "overhead_bytes")


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Slot:
    """One forward or backward pass of one micro-batch on one stage, in units of forward time."""

    stage: int
    kind: str  # "F" or "B"
    micro: int
    start: float
    end: float


def one_f_one_b(num_stages: int, num_micro: int, *, forward: float = 1.0, backward: float = 2.0) -> list[Slot]:
    """The 1F1B schedule (PipeDream-Flush; Narayanan et al. 2021 §2.2.1) with uniform stage times.

    Stage s runs min(p - s - 1, m) warm-up forwards, then alternates one forward and one backward,
    then drains its backwards. A pass starts when its stage is free and its input is ready
    (forward: the previous stage's forward of that micro-batch; backward: the next stage's
    backward). The makespan is (m + p - 1)(f + b), so the bubble is (p - 1)/m of the ideal m(f + b).
    """
    p, m = num_stages, num_micro
    if p < 1 or m < 1:
        raise ValueError(f"num_stages and num_micro must be >= 1, got {p}, {m}")
    orders: list[list[tuple[str, int]]] = []
    for s in range(p):
        warm = min(p - s - 1, m)
        order = [("F", i) for i in range(warm)]
        f_next, b_next = warm, 0
        while b_next < m:
            if f_next < m:
                order.append(("F", f_next))
                f_next += 1
            order.append(("B", b_next))
            b_next += 1
        orders.append(order)
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * p
    pos = [0] * p
    slots: list[Slot] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(p):
            if pos[s] == len(orders[s]):
                continue
            kind, i = orders[s][pos[s]]
            dep = ("F", s - 1, i) if kind == "F" else ("B", s + 1, i)
            if kind == "F" and s == 0:
                ready = 0.0
            elif kind == "B" and s == p - 1:
                ready = done.get(("F", s, i))
            else:
                ready = done.get(dep)
            if ready is None:
                continue
            start = max(free[s], ready)
            end = start + (forward if kind == "F" else backward)
            done[(kind, s, i)] = end
            free[s] = end
            slots.append(Slot(stage=s, kind=kind, micro=i, start=start, end=end))
            pos[s] += 1
            remaining -= 1
            progressed = True
        if not progressed:  # the order above always makes progress; this guards against a bug
            raise AssertionError("1F1B schedule deadlocked")
    return slots


def bubble_fraction(slots: list[Slot], num_stages: int) -> float:
    """Idle time over busy time across stages: (p - 1)/m for uniform 1F1B."""
    makespan = max(s.end for s in slots)
    busy = sum(s.end - s.start for s in slots)
    return (makespan * num_stages - busy) / busy


def _stage_memory(plan: dict) -> list[dict]:
    """Per-stage memory terms from the estimate (``memory.per_stage``), else the per-GPU figure
    for every stage (the estimate reports the most loaded stage)."""
    memory = plan.get("memory", {})
    pp = plan["layout"]["pp"]
    stages = memory.get("per_stage")
    if isinstance(stages, list) and stages:
        return [{k: s.get(k) for k in (*MEMORY_TERMS, "total_bytes", "num_layers") if k in s} for s in stages]
    per_gpu = memory.get("per_gpu", {})
    return [{k: per_gpu.get(k) for k in (*MEMORY_TERMS, "total_bytes") if k in per_gpu} for _ in range(pp)]


def report(plan: dict, *, usable_bytes: int | None = None, capacity_bytes: int | None = None) -> dict:
    """Everything ``dstk explain`` shows, as data (this is ``--format json``)."""
    layout = plan["layout"]
    pp = layout["pp"]
    m = layout["grad_accum"]
    num_layers = plan.get("model", {}).get("num_layers")
    time = plan.get("time", {})
    stages = _stage_memory(plan)
    if all("num_layers" in st for st in stages):  # the estimator's own partition
        layers = [st["num_layers"] for st in stages]
    else:
        layers = list(stage_layers(num_layers, pp)) if num_layers and num_layers >= pp else None
    for i, st in enumerate(stages):
        st["stage"] = i
        if layers:
            st["num_layers"] = layers[i]
    totals = [s.get("total_bytes") or 0 for s in stages]
    mean = sum(totals) / len(totals) if totals else 0
    out: dict = {
        "layout": layout,
        "memory": {
            "per_stage": stages,
            "usable_bytes": usable_bytes,
            "capacity_bytes": capacity_bytes,
            "cpu_bytes": plan.get("memory", {}).get("cpu_bytes"),
            "nvme_bytes": plan.get("memory", {}).get("nvme_bytes"),
        },
        "balance": {
            "layers_per_stage": layers,
            "max_over_mean_memory": (max(totals) / mean) if mean else None,
        },
        "time": {k: time.get(k) for k in ("step_seconds", "tokens_per_second", "tflops_per_gpu", "mfu",
                                          "compute_seconds", "comm_seconds", "bubble_fraction") if k in time},
        "why": plan.get("why", []),
        "alternatives": plan.get("alternatives", []),
    }
    compute, comm = time.get("compute_seconds"), time.get("comm_seconds")
    if compute:
        out["time"]["comm_over_compute"] = (comm or 0.0) / compute
    for key in ("comm", "breakdown", "comm_breakdown"):
        if key in time:
            out["time"][key] = time[key]
    if pp > 1:
        slots = one_f_one_b(pp, m)
        out["schedule"] = {
            "num_stages": pp,
            "num_micro_batches": m,
            "bubble_fraction": bubble_fraction(slots, pp),
            "formula": "(p - 1) / m",
            "slots": [dataclasses.asdict(s) for s in slots] if pp * m <= 512 else None,
        }
        v = layout.get("virtual_stages", 1)
        if v > 1:  # the picture is plain 1F1B; interleaving divides the bubble by v (Narayanan 2021 §2.2.2)
            out["schedule"]["virtual_stages"] = v
            out["schedule"]["interleaved_bubble_fraction"] = (pp - 1) / (m * v)
    return out


def _unit(stages: list[dict]) -> tuple[str, int]:
    """GiB for real models, MiB when the largest stage is under 1 GiB (the CPU demo)."""
    largest = max((s.get("total_bytes") or 0 for s in stages), default=0)
    return ("GiB", 2**30) if largest >= 2**30 else ("MiB", 2**20)


def _fmt(n, scale: int) -> str:
    return "-" if n is None else f"{n / scale:.2f}"


def render_text(rep: dict, *, console=None, pictures_note: str | None = None) -> None:
    """Print the report as tables (rich)."""
    from rich.console import Console
    from rich.table import Table

    con = console or Console()
    lay = rep["layout"]
    con.print(f"[bold]Plan[/bold]: dp={lay['dp']} tp={lay['tp']} pp={lay['pp']} ZeRO-{lay['zero_stage']} "
              f"micro {lay['micro_batch']} x {lay['grad_accum']} recompute={lay['recompute']}")
    unit, scale = _unit(rep["memory"]["per_stage"])
    mem = Table(title=f"Memory per GPU by stage ({unit})")
    mem.add_column("stage", justify="right")
    terms = [t for t in MEMORY_TERMS if any(t in s for s in rep["memory"]["per_stage"])]
    if rep["balance"]["layers_per_stage"]:
        mem.add_column("layers", justify="right")
    for t in terms:
        mem.add_column(t.removesuffix("_bytes").removesuffix("_bytes")[:6], justify="right")
    mem.add_column("total", justify="right")
    mem.add_column("of usable", justify="left", no_wrap=True)
    usable = rep["memory"].get("usable_bytes")
    for s in rep["memory"]["per_stage"]:
        row = [str(s["stage"])]
        if rep["balance"]["layers_per_stage"]:
            row.append(str(s.get("num_layers", "-")))
        row += [_fmt(s.get(t), scale) for t in terms]
        row.append(_fmt(s.get("total_bytes"), scale))
        bar = ""
        if usable and s.get("total_bytes") is not None:
            filled = int(round(10 * min(1.0, s["total_bytes"] / usable)))
            bar = "#" * filled + "." * (10 - filled) + f" {s['total_bytes'] / usable:.0%}"
        row.append(bar)
        mem.add_row(*row)
    con.print(mem)
    t = rep["time"]
    tt = Table(title="Time per step")
    tt.add_column("figure")
    tt.add_column("value", justify="right")
    for key, fmt in (("step_seconds", "{:.4g} s"), ("compute_seconds", "{:.4g} s"), ("comm_seconds", "{:.4g} s"),
                     ("comm_over_compute", "{:.2f}x"), ("bubble_fraction", "{:.1%}"),
                     ("tokens_per_second", "{:,.0f}"), ("tflops_per_gpu", "{:.1f}"), ("mfu", "{:.1%}")):
        if t.get(key) is not None:
            tt.add_row(key.replace("_", " "), fmt.format(t[key]))
    for kind, seconds in sorted((t.get("comm") or {}).items()):
        if seconds:
            tt.add_row(f"  comm {kind} (before overlap)", f"{seconds:.4g} s")
    con.print(tt)
    if "schedule" in rep:
        sch = rep["schedule"]
        con.print(f"1F1B schedule: {sch['num_stages']} stages x {sch['num_micro_batches']} micro-batches, "
                  f"bubble {sch['bubble_fraction']:.1%} of the ideal time ((p-1)/m)")
        if sch.get("virtual_stages"):
            con.print(f"  interleaved x{sch['virtual_stages']}: bubble {sch['interleaved_bubble_fraction']:.1%} "
                      "((p-1)/(m v)); the timeline below is the plain 1F1B one")
        if sch["slots"] and sch["num_micro_batches"] <= 16:
            con.print(_ascii_timeline(sch))
    bal = rep["balance"]
    if bal["max_over_mean_memory"] and rep["layout"]["pp"] > 1:
        con.print(f"Stage balance: layers {bal['layers_per_stage']}, most loaded stage "
                  f"{bal['max_over_mean_memory']:.2f}x the mean memory")
    if rep["why"]:
        con.print("[bold]Why[/bold]")
        for line in rep["why"]:
            con.print(f"  - {line}", highlight=False)
    if rep.get("alternatives"):
        alt = Table(title="Alternatives it beat")
        for col in ("layout", "s/step", f"{unit}/GPU"):
            alt.add_column(col, justify="left" if col == "layout" else "right")
        for a in rep["alternatives"]:
            from dstk.layout import Layout
            from dstk.plan import describe

            alt.add_row(describe(Layout.from_dict(a["layout"])), f"{a['step_seconds']:.4g}",
                        _fmt(a.get("total_bytes"), scale))
        con.print(alt)
    if pictures_note:
        con.print(pictures_note, markup=False, highlight=False)


def _ascii_timeline(sch: dict) -> str:
    """Stages as rows, one character per forward-time unit: F/B by micro-batch parity, '.' idle."""
    slots = sch["slots"]
    width = int(max(s["end"] for s in slots))
    rows = []
    for stage in range(sch["num_stages"]):
        line = ["."] * width
        for s in slots:
            if s["stage"] == stage:
                ch = s["kind"] if s["micro"] % 2 == 0 else s["kind"].lower()
                for x in range(int(s["start"]), int(s["end"])):
                    line[x] = ch
        rows.append(f"  stage {stage}: {''.join(line)}")
    return "\n".join(rows)


def have_matplotlib() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


PICTURES_HINT = "pictures need matplotlib: pip install 'dstk[explain]' (or pip install matplotlib)"


def write_pictures(rep: dict, directory: str | Path, *, formats: tuple[str, ...] = ("png", "svg")) -> list[Path]:
    """memory.{png,svg}: stacked bars per stage; schedule.{png,svg}: the 1F1B timeline with the
    bubble shaded (pipelines only)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    stages = rep["memory"]["per_stage"]
    terms = [t for t in MEMORY_TERMS if any(s.get(t) for s in stages)]
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(stages) + 2), 4))
    bottom = [0.0] * len(stages)
    xs = list(range(len(stages)))
    for t in terms:
        vals = [(s.get(t) or 0) / 2**30 for s in stages]
        ax.bar(xs, vals, bottom=bottom, label=t.removesuffix("_bytes"))
        bottom = [b + v for b, v in zip(bottom, vals)]
    if not terms:
        ax.bar(xs, [(s.get("total_bytes") or 0) / 2**30 for s in stages], label="total")
    for key, style in (("usable_bytes", "--"), ("capacity_bytes", "-")):
        if rep["memory"].get(key):
            ax.axhline(rep["memory"][key] / 2**30, linestyle=style, color="k", linewidth=1,
                       label=key.removesuffix("_bytes"))
    ax.set_xticks(xs, [f"stage {i}" for i in xs])
    ax.set_ylabel("GiB per GPU")
    ax.set_title("Memory per GPU by pipeline stage")
    ax.legend(fontsize="small")
    fig.tight_layout()
    for fmt in formats:
        path = out / f"memory.{fmt}"
        fig.savefig(path)
        written.append(path)
    plt.close(fig)
    if "schedule" in rep and rep["schedule"]["slots"]:
        sch = rep["schedule"]
        p, m = sch["num_stages"], sch["num_micro_batches"]
        makespan = max(s["end"] for s in sch["slots"])
        fig, ax = plt.subplots(figsize=(min(16, 2 + makespan / 3), 0.6 * p + 1.5))
        from matplotlib.patches import Patch

        ax.barh(range(p), [makespan] * p, left=0, color="#f4cccc")
        for s in sch["slots"]:
            color = "#6fa8dc" if s["kind"] == "F" else "#93c47d"
            ax.barh(s["stage"], s["end"] - s["start"], left=s["start"], color=color, edgecolor="white")
            if m <= 32:
                ax.text((s["start"] + s["end"]) / 2, s["stage"], str(s["micro"]), ha="center", va="center",
                        fontsize=7)
        ax.set_yticks(range(p), [f"stage {i}" for i in range(p)])
        ax.invert_yaxis()
        ax.set_xlabel("time (forward passes)")
        ax.set_title(f"1F1B: {p} stages, {m} micro-batches, bubble {sch['bubble_fraction']:.0%} of ideal")
        handles = [Patch(color=c, label=n) for c, n in
                   (("#6fa8dc", "forward"), ("#93c47d", "backward"), ("#f4cccc", "bubble (idle)"))]
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=3, fontsize="small")
        fig.tight_layout()
        for fmt in formats:
            path = out / f"schedule.{fmt}"
            fig.savefig(path)
            written.append(path)
        plt.close(fig)
    return written
