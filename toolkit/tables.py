"""Tables for people, one way for ``plan``, ``estimate`` and ``explain`` (rich).

A number is never wrapped or cut: number columns keep their full width, text columns wrap at
words and keep a number with its unit. When the numbers alone do not fit side by side in the
terminal (80 columns in a pipe or a CI log, or ``COLUMNS``), the table is turned (its rows become
columns: a few pipeline stages) or, when that is still too wide, stacked: one block per row, one
``header value`` line per column. Rules are ASCII, there is no colour outside a terminal and no
trailing blanks (``print_plain``), so a pipe gets plain text.
"""

from __future__ import annotations

import dataclasses
import io
import re
from collections.abc import Sequence

from rich.box import Box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

GLUE = "\ue000"
"""Stands for the blank between a number and its unit while rich wraps text (a private-use
character, not whitespace, so ``1.47 GiB`` is never split at a line end); ``print_plain`` puts
the blank back."""
_UNIT = re.compile(r"(\d) (?=(?:[KMGT]i?B|B|s|d|h|min|[kMGT]?FLOP/s|tokens/s|s/step|elements|%)\b)")


def glue(text: str) -> str:
    """``text`` with each number joined to its unit (see ``GLUE``)."""
    return _UNIT.sub(lambda m: m.group(1) + GLUE, text)


ASCII_RULES = Box("    \n    \n -- \n    \n    \n -- \n    \n    \n")
"""Like rich's ``SIMPLE`` box (a rule under the header, no verticals), drawn with ``-``."""


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Col:
    """One column: a number column (right-aligned, never wrapped) or a text column (wraps)."""

    header: str
    text: bool = False


def console(*, file=None, width: int | None = None) -> Console:
    """A rich console: the terminal's width (``COLUMNS`` wins; 80 in a pipe), no colour or
    highlighting outside a terminal."""
    return Console(file=file, width=width, highlight=False, emoji=False)


def table(*, columns: Sequence[Col], rows: Sequence[Sequence[str]], width: int):
    """A rich renderable: the table side by side when its numbers fit ``width``; else turned so
    that rows become columns (a few pipeline stages), when that fits; else stacked."""
    side = _side_by_side(columns=columns, rows=rows)
    if _min_width(side) <= width:
        return side
    if not any(c.text for c in columns[1:]):
        turned_cols = [Col(header="", text=True)] + [Col(header=f"{columns[0].header} {r[0]}".strip()) for r in rows]
        turned_rows = [[col.header] + [str(r[i]) for r in rows] for i, col in enumerate(columns[1:], 1)]
        turned = _side_by_side(columns=turned_cols, rows=turned_rows)
        if _min_width(turned) <= width:
            return turned
    return _stacked(columns=columns, rows=rows)


def _min_width(renderable) -> int:
    probe = Console(width=10_000, file=io.StringIO())
    return Measurement.get(probe, probe.options, renderable).minimum


def _side_by_side(*, columns, rows) -> Table:
    out = Table(box=ASCII_RULES, show_edge=False, pad_edge=False)
    for i, col in enumerate(columns):
        cells = [str(r[i]) for r in rows]
        if col.text:
            out.add_column(col.header, justify="left", overflow="fold", min_width=min(12, max(map(len, cells),
                                                                                          default=1)))
        else:
            longest = max([len(c) for c in cells] + [len(w) for w in col.header.split()], default=1)
            out.add_column(col.header, justify="right", no_wrap=True, min_width=longest)
    for r in rows:
        out.add_row(*(glue(str(c)) if col.text else str(c) for col, c in zip(columns, r)))
    return out


def _stacked(*, columns, rows) -> Table:
    """One block per row: the first cell as the block's name, then ``header  value`` lines."""
    out = Table(box=None, show_header=False, pad_edge=False)
    out.add_column(no_wrap=True)
    out.add_column(overflow="fold")
    for n, r in enumerate(rows):
        if n:
            out.add_row("", "")
        out.add_row(f"{columns[0].header} {r[0]}".strip(), "")
        for col, cell in zip(columns[1:], r[1:]):
            out.add_row(f"  {col.header}", glue(str(cell)))
    return out


def print_plain(con: Console, draw) -> None:
    """Run ``draw(con)`` and write what it printed without the trailing blanks rich pads table
    cells with (they make diffs and CI logs noisy)."""
    with con.capture() as cap:
        draw(con)
    text = "\n".join(line.rstrip() for line in cap.get().replace(GLUE, " ").splitlines())
    con.file.write(text + "\n")
    con.file.flush()


def to_text(draw, *, width: int) -> str:
    """What ``draw(console)`` prints at ``width`` columns, as plain text without trailing blanks."""
    buf = io.StringIO()
    con = Console(file=buf, width=width, highlight=False, emoji=False, color_system=None)
    print_plain(con, draw)
    return buf.getvalue().rstrip("\n")


def show(con: Console, title: str | None, columns: Sequence[Col], rows: Sequence[Sequence[str]]) -> None:
    """A titled table and a blank line; nothing when there are no rows."""
    if not rows:
        return
    if title:
        con.print(title, style="bold", markup=False)
    con.print(table(columns=columns, rows=rows, width=con.width))
    con.print()


def bullets(lines: Sequence[str], *, marker: str = "-") -> Table:
    """``  - line`` items (``  line`` without a marker) whose wrapped continuation lines stay
    indented under the text."""
    out = Table(box=None, show_header=False, pad_edge=False, padding=(0, 1, 0, 0))
    out.add_column(no_wrap=True)
    out.add_column(overflow="fold")
    for line in lines:
        out.add_row(f"  {marker}" if marker else " ", glue(str(line)))
    return out


def flops_text(tflops: float) -> str:
    """Model FLOP/s per GPU in the unit that keeps three significant digits visible (the CPU
    demo runs at about a GFLOP/s, which ``{:.1f}`` TFLOP/s showed as 0.0 next to a non-zero MFU)."""
    for unit, scale in (("TFLOP/s", 1.0), ("GFLOP/s", 1e-3), ("MFLOP/s", 1e-6)):
        if tflops >= scale:
            return f"{tflops / scale:.3g} {unit}"
    return f"{tflops * 1e12:.3g} FLOP/s"


def percent_text(fraction: float) -> str:
    """A percentage with one decimal, two significant digits under 1% (MFU 0.48%, not 0%)."""
    return f"{fraction:.2%}" if 0 < fraction < 0.01 else f"{fraction:.1%}"


def seconds_text(seconds: float) -> str:
    """Seconds with three significant digits and never an exponent: ``0.416``, ``15.4``, ``6,496``
    (``{:.3g}`` wrote a CPU demo's step as ``6.5e+03 s/step``)."""
    return f"{seconds:,.0f}" if abs(seconds) >= 1000 else f"{seconds:.3g}"
