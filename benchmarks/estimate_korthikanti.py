"""Korthikanti et al. 2022 Table 5 alone (kept for its command; the rows, and Narayanan et al. 2021
Table 2, live in ``benchmarks/estimate_published.py``, which says where each figure comes from).

    .venv/bin/python benchmarks/estimate_korthikanti.py
"""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from estimate_published import korthikanti_rows, summary  # noqa: E402


def main() -> None:
    rows = korthikanti_rows()
    print(f"{'row':<22} {'predicted s':>11} {'measured s':>10} {'error':>7}")
    for r in rows:
        print(f"{r.label:<22} {r.predicted:>11.2f} {r.published:>10.2f} {r.error:>+7.1%}")
    mean, worst = summary(rows)
    print(f"mean absolute error {mean:.1%}, worst {worst:.1%}")


if __name__ == "__main__":
    main()
