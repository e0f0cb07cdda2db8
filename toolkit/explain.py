"""A report of a plan for people: memory per GPU per stage, the 1F1B pipeline timeline with its
bubble, communication against compute, stage balance, and the alternatives it beat.

``report(plan_json)`` turns a plan (``plan.json`` of a run directory, or one entry of
``dstk plan --format json``) into plain data; ``render_text`` prints it as tables
(``dstk.tables``: whole numbers at any width); ``render_html`` makes one self-contained page;
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
            "buffers": plan.get("memory", {}).get("per_gpu", {}).get("buffers") or [],
            "peak_buffers": plan.get("memory", {}).get("per_gpu", {}).get("peak_buffers") or [],
            "cpu_ranks": (plan.get("cluster") or {}).get("gpu") == "cpu",
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


def plan_line(rep: dict) -> str:
    """The layout as every why line names it (offload included), e.g. ``dp=8 ZeRO-3 opt->cpu micro 1 x 4``."""
    from dstk.layout import Layout
    from dstk.plan import describe

    return describe(Layout.from_dict(rep["layout"]))


def memory_table(rep: dict, *, bars: bool = True) -> tuple[str, list, list[list[str]]]:
    """(title, columns, rows) of the memory per GPU, one row per pipeline stage; ``of usable``
    with a ten-character bar for the terminal (``bars``), or the percentage alone."""
    from dstk.tables import Col, percent_text

    stages = rep["memory"]["per_stage"]
    unit, scale = _unit(stages)
    terms = [t for t in MEMORY_TERMS if any(t in s for s in stages)]
    with_layers = bool(rep["balance"]["layers_per_stage"])
    cols = [Col(header="stage")] + ([Col(header="layers")] if with_layers else [])
    cols += [Col(header=t.removesuffix("_bytes")) for t in terms] + [Col(header="total"), Col(header="of usable")]
    usable = rep["memory"].get("usable_bytes")
    rows = []
    for s in stages:
        row = [str(s["stage"])] + ([str(s.get("num_layers", "-"))] if with_layers else [])
        row += [_fmt(s.get(t), scale) for t in terms] + [_fmt(s.get("total_bytes"), scale)]
        bar = "-"
        if usable and s.get("total_bytes") is not None:
            filled = int(round(10 * min(1.0, s["total_bytes"] / usable)))
            bar = percent_text(s["total_bytes"] / usable)
            if bars:
                bar = "#" * filled + "." * (10 - filled) + " " + bar
        rows.append(row + [bar])
    where = " by stage" if rep["layout"]["pp"] > 1 else ""
    return f"Memory per GPU{where} ({unit})", cols, rows


_IN_COMPUTE = {"tp": "TP comm", "pp": "pipeline sends"}
"""Communication kinds the step time counts inside ``compute_seconds`` (on the critical path)."""


def time_table(rep: dict) -> tuple[str, list, list[list[str]]]:
    from dstk import tables
    from dstk.tables import Col

    t = rep["time"]
    rows = []
    # The estimator puts TP collectives and pipeline sends on the critical path inside `compute`
    # (``steptime``: a stage's micro-batch = its layers + TP + sends); `comm` is the exposed rest
    # (gradient reduction, ZeRO-3 gathers, offload). Say so, or "comm / compute 0.00x" reads as
    # "communication is free" on a TP layout.
    inside = [k for k in ("tp", "pp") if (t.get("comm") or {}).get(k)]
    compute_label = "compute" if not inside else f"compute (with {' and '.join(_IN_COMPUTE[k] for k in inside)})"
    comm_label = "comm (exposed)" if not inside else "comm (exposed: DP, ZeRO, offload)"
    for key, label, fmt in (("step_seconds", "step", "{:.4g} s"), ("compute_seconds", compute_label, "{:.4g} s"),
                            ("comm_seconds", comm_label, "{:.4g} s"),
                            ("comm_over_compute", "comm / compute", "{:.2f}x"),
                            ("bubble_fraction", "pipeline bubble", None), ("tokens_per_second", "tokens/s", "{:,.0f}"),
                            ("tflops_per_gpu", "model FLOP/s per GPU", None), ("mfu", "MFU", None)):
        value = t.get(key)
        if value is None:
            continue
        if key == "tflops_per_gpu":
            text = tables.flops_text(value)
        elif fmt is None:
            text = tables.percent_text(value)
        else:
            text = fmt.format(value)
        rows.append([label, text])
    for kind, seconds in sorted((t.get("comm") or {}).items()):
        if seconds:
            where = "in compute" if kind in _IN_COMPUTE else "before overlap"
            rows.append([f"  comm {kind} ({where})", f"{seconds:.4g} s"])
    return "Time per step", [Col(header="figure", text=True), Col(header="value")], rows


def alternatives_table(rep: dict) -> tuple[str, list, list[list[str]]]:
    from dstk.layout import Layout
    from dstk.plan import describe
    from dstk.tables import Col

    unit, scale = _unit(rep["memory"]["per_stage"])
    rows = [[describe(Layout.from_dict(a["layout"])), f"{a['step_seconds']:.4g}", _fmt(a.get("total_bytes"), scale)]
            for a in rep.get("alternatives") or []]
    return "Alternatives it beat", [Col(header="layout", text=True), Col(header="s/step"),
                                    Col(header=f"{unit}/GPU")], rows


def offload_line(rep: dict) -> str | None:
    """Bytes kept off the GPU per rank (ZeRO-Offload / ZeRO-Infinity), or None when nothing is."""
    from dstk.commands.estimate import _gib

    cpu, nvme = rep["memory"].get("cpu_bytes"), rep["memory"].get("nvme_bytes")
    if not cpu and not nvme:
        return None
    return "Offloaded per rank: " + ", ".join(f"{name} {_gib(n)}" for name, n in (("CPU", cpu), ("NVMe", nvme)) if n)


def schedule_lines(rep: dict) -> list[str]:
    if "schedule" not in rep:
        return []
    from dstk.tables import percent_text

    sch = rep["schedule"]
    lines = [f"1F1B schedule: {sch['num_stages']} stages x {sch['num_micro_batches']} micro-batches, "
             f"bubble {percent_text(sch['bubble_fraction'])} of the ideal time ((p-1)/m)"]
    if sch.get("virtual_stages"):
        interleaved = percent_text(sch["interleaved_bubble_fraction"])
        lines.append(f"  interleaved x{sch['virtual_stages']}: bubble {interleaved} "
                     "((p-1)/(m v)); the timeline below is the plain 1F1B one")
    return lines


def balance_line(rep: dict) -> str | None:
    bal = rep["balance"]
    if bal["max_over_mean_memory"] and rep["layout"]["pp"] > 1:
        return (f"Stage balance: layers {bal['layers_per_stage']}, most loaded stage "
                f"{bal['max_over_mean_memory']:.2f}x the mean memory")
    return None


def buffer_lines(rep: dict) -> list[str]:
    if not rep["memory"].get("buffers"):
        return []
    from dstk.commands.estimate import buffer_terms

    return [line.strip() for line in buffer_terms({"buffers": rep["memory"]["buffers"],
                                                    "peak_buffers": rep["memory"].get("peak_buffers", [])},
                                                   cpu_ranks=bool(rep["memory"].get("cpu_ranks")))]


def render_text(rep: dict, *, console=None, pictures_note: str | None = None) -> None:
    """Print the report: tables side by side where their numbers fit the terminal, stacked where
    they do not (``dstk.tables``); plain text in a pipe."""
    from dstk import tables

    con = console or tables.console()
    tables.print_plain(con, lambda c: _draw(c, rep, pictures_note))


def _draw(con, rep: dict, pictures_note: str | None) -> None:
    from dstk import tables

    con.print(f"Plan: {plan_line(rep)}", markup=False)
    con.print()
    tables.show(con, *memory_table(rep))
    extra = offload_line(rep)
    if extra:
        con.print(extra, markup=False)
        con.print()
    tables.show(con, *time_table(rep))
    sched = schedule_lines(rep)
    for line in sched:
        con.print(line, markup=False)
    if sched and rep["schedule"]["slots"] and rep["schedule"]["num_micro_batches"] <= 16:
        con.print(_ascii_timeline(rep["schedule"]), markup=False, overflow="fold")
    line = balance_line(rep)
    if line:
        con.print(line, markup=False)
    if sched or line:
        con.print()
    for title, lines, marker in (("Buffers (per GPU)", buffer_lines(rep), ""), ("Why", rep["why"], "-")):
        if lines:
            con.print(title, style="bold", markup=False)
            con.print(tables.bullets(lines, marker=marker))
            con.print()
    tables.show(con, *alternatives_table(rep))
    if pictures_note:
        con.print(pictures_note, markup=False)


def picture_pngs(rep: dict) -> dict[str, bytes]:
    """``{"memory": png, "schedule": png}`` (schedule only with a pipeline), to put in a page."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="dstk-explain-") as tmp:
        return {p.stem: p.read_bytes() for p in write_pictures(rep, tmp, formats=("png",))}


_CSS = """
body { font-family: system-ui, sans-serif; max-width: 60rem; margin: 1.5rem auto; padding: 0 1rem; color: #222; }
h1 { font-size: 1.3rem; } h2 { font-size: 1.1rem; margin-top: 1.6rem; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { padding: 0.2rem 0.45rem; border-bottom: 1px solid #ddd; }
th { text-align: left; } td.num, th.num { text-align: right; white-space: nowrap; }
img { max-width: 100%; height: auto; }
pre { background: #f6f6f6; padding: 0.5rem; }
"""


def render_html(rep: dict, *, pngs: dict[str, bytes] | None = None, note: str | None = None) -> str:
    """One self-contained HTML page (no external files, the pictures inline as ``data:`` URIs):
    the plan, the memory and time tables, the pictures, the schedule, the buffers, the why lines
    and the alternatives; to attach to a pull request or a ticket."""
    import base64
    from html import escape

    def table_html(spec) -> str:
        title, cols, rows = spec
        if not rows:
            return ""
        head = "".join(f'<th class="{"" if c.text else "num"}">{escape(c.header)}</th>' for c in cols)
        body = "".join("<tr>" + "".join(f'<td class="{"" if c.text else "num"}">{escape(str(v))}</td>'
                                        for c, v in zip(cols, r)) + "</tr>" for r in rows)
        return (f"<h2>{escape(title)}</h2>\n<div class=\"scroll\"><table><thead><tr>{head}</tr></thead>"
                f"<tbody>{body}</tbody></table></div>")

    def items(lines) -> str:
        return "<ul>" + "".join(f"<li>{escape(str(x))}</li>" for x in lines) + "</ul>"

    plan = plan_line(rep)
    parts = [f"<h1>Plan: {escape(plan)}</h1>", table_html(memory_table(rep, bars=False))]
    extra = offload_line(rep)
    if extra:
        parts.append(f"<p>{escape(extra)}</p>")
    alt = {"memory": "memory per GPU, stacked by term", "schedule": "1F1B pipeline schedule with its bubble"}
    for name in ("memory", "schedule"):
        if pngs and name in pngs:
            data = base64.b64encode(pngs[name]).decode("ascii")
            parts.append(f'<figure><img id="{name}-picture" alt="{alt[name]}" src="data:image/png;base64,{data}">'
                         "</figure>")
    if note:
        parts.append(f"<p><em>{escape(note)}</em></p>")
    parts.append(table_html(time_table(rep)))
    sched = schedule_lines(rep)
    if sched:
        parts.append("<h2>Pipeline schedule</h2>" + "".join(f"<p>{escape(x)}</p>" for x in sched))
        if rep["schedule"]["slots"] and rep["schedule"]["num_micro_batches"] <= 16:
            parts.append(f'<div class="scroll"><pre>{escape(_ascii_timeline(rep["schedule"]))}</pre></div>')
    line = balance_line(rep)
    if line:
        parts.append(f"<p>{escape(line)}</p>")
    if buffer_lines(rep):
        parts.append("<h2>Buffers (per GPU)</h2>" + items(buffer_lines(rep)))
    if rep["why"]:
        parts.append("<h2>Why</h2>" + items(rep["why"]))
    parts.append(table_html(alternatives_table(rep)))
    body = "\n".join(p for p in parts if p)
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>dstk explain: {escape(plan)}</title><style>{_CSS}</style></head>\n<body>\n{body}\n"
            "</body></html>\n")


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


def memory_figure(rep: dict):
    """The memory picture (a matplotlib Figure): stacked bars of the terms per GPU, one bar per
    pipeline stage (one bar without a pipeline), hatched bars for the bytes offloaded to CPU and
    NVMe per rank, the usable and capacity lines where they fall on the chart, the legend outside
    the bars, in GiB or, when everything is under 1 GiB (the CPU demo), MiB."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = rep["memory"]["per_stage"]
    pipeline = rep["layout"]["pp"] > 1
    offload = [(name, rep["memory"].get(key)) for name, key in (("CPU", "cpu_bytes"), ("NVMe", "nvme_bytes"))
               if rep["memory"].get(key)]
    largest = max([s.get("total_bytes") or 0 for s in stages] + [n for _, n in offload])
    unit, scale = ("GiB", 2**30) if largest >= 2**30 else ("MiB", 2**20)
    terms = [t for t in MEMORY_TERMS if any(s.get(t) for s in stages)]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * (len(stages) + len(offload)) + 1.5) + 2.2, 4))
    xs = list(range(len(stages)))
    bottom = [0.0] * len(stages)
    for t in terms:
        vals = [(s.get(t) or 0) / scale for s in stages]
        low, high = min(vals), max(vals)  # in the legend: terms too thin to see next to the overhead
        amount = f"{high:.3g}" if f"{low:.3g}" == f"{high:.3g}" else f"{low:.3g}-{high:.3g}"
        ax.bar(xs, vals, bottom=bottom, label=f"{t.removesuffix('_bytes')} {amount} {unit}")
        bottom = [b + v for b, v in zip(bottom, vals)]
    if not terms:
        bottom = [(s.get("total_bytes") or 0) / scale for s in stages]
        ax.bar(xs, bottom, label="total")
    for x, total in zip(xs, bottom):
        ax.annotate(f"{total:.3g}", (x, total), ha="center", va="bottom", fontsize="small")
    off_xs = [len(stages) + i for i in range(len(offload))]
    for x, (name, n) in zip(off_xs, offload):
        ax.bar([x], [n / scale], color="#cccccc", edgecolor="#555555", hatch="//", label=f"offloaded to {name}")
        ax.annotate(f"{n / scale:.3g}", (x, n / scale), ha="center", va="bottom", fontsize="small")
    top = max(bottom + [n / scale for _, n in offload] + [0.0])
    off_chart = []
    for key, style in (("usable_bytes", "--"), ("capacity_bytes", "-")):
        value = rep["memory"].get(key)
        if not value:
            continue
        label = f"{key.removesuffix('_bytes')} {value / scale:.4g} {unit}"
        if value / scale <= 3 * max(top, 1e-9):
            ax.axhline(value / scale, linestyle=style, color="k", linewidth=1, label=label)
        else:  # a line far above the bars would squash them to slivers
            off_chart.append(label)
    names = [f"stage {i}" for i in xs] if pipeline else ["GPU"]
    ax.set_xticks(xs + off_xs, names + [f"{name}\n(per rank)" for name, _ in offload])
    ax.set_ylabel(f"{unit} per GPU")
    ax.set_title("Memory per GPU by pipeline stage" if pipeline else "Memory per GPU")
    if off_chart:
        ax.text(1.02, 0.0, "above the chart:\n" + "\n".join(off_chart), transform=ax.transAxes, fontsize="small",
                va="bottom")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    return fig


def write_pictures(rep: dict, directory: str | Path, *, formats: tuple[str, ...] = ("png", "svg")) -> list[Path]:
    """memory.{png,svg} (``memory_figure``); schedule.{png,svg}: the 1F1B timeline with the
    bubble shaded (pipelines only). SVG keeps its text as text (searchable, readable in a page)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig = memory_figure(rep)
        for fmt in formats:
            path = out / f"memory.{fmt}"
            fig.savefig(path, bbox_inches="tight")
            written.append(path)
        plt.close(fig)
        written += _schedule_pictures(rep, out, formats)
    return written


def _schedule_pictures(rep: dict, out: Path, formats: tuple[str, ...]) -> list[Path]:
    import matplotlib.pyplot as plt

    from dstk.tables import percent_text

    written: list[Path] = []
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
        ax.set_title(f"1F1B: {p} stages, {m} micro-batches, bubble {percent_text(sch['bubble_fraction'])} of ideal")
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
