"""`dstk explain --format html`: one self-contained page, rendered by headless Chromium.

The page is loaded from a file with the network off; a checking script (added to a copy, not to
the report) writes what the browser laid out into the DOM, which ``--dump-dom`` prints: the
tables' text, whether each picture decoded, and whether anything overflows the window. Needs
Debian's ``chromium`` (``apt-get install -y chromium``); skipped, saying so, where it is missing.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from dstk.cli import main

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "examples" / "intents" / "tiny-llama-cpu.yaml")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

CHECK = """
<script>
window.addEventListener("load", () => {
  const out = {
    images: [...document.images].map(i => ({id: i.id, width: i.naturalWidth, complete: i.complete})),
    tables: [...document.querySelectorAll("table")].map(t => ({
      headers: [...t.querySelectorAll("th")].map(th => th.innerText.trim()),
      rows: t.querySelectorAll("tbody tr").length,
      fits: t.parentElement.scrollWidth <= t.parentElement.clientWidth + 1})),
    headings: [...document.querySelectorAll("h1, h2")].map(h => h.innerText.trim()),
    pageFits: document.documentElement.scrollWidth <= window.innerWidth,
    text: document.body.innerText,
  };
  const pre = document.createElement("pre");
  pre.id = "dstk-check";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""


def rendered(page: str, tmp_path: Path, *, width: int) -> dict:
    """What Chromium shows for ``page`` in a window ``width`` pixels wide."""
    copy = tmp_path / "checked.html"
    copy.write_text(page.replace("</body>", CHECK + "</body>"))
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
         f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={width},900", "--virtual-time-budget=5000",
         "--dump-dom", copy.as_uri()],
        capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="dstk-check">(.*?)</pre>', proc.stdout, re.S)
    assert found, f"chromium printed no check (rc {proc.returncode}): {proc.stderr[-800:]}"
    import html

    return json.loads(html.unescape(found.group(1)))


def explain_html(argv: list[str], capsys) -> str:
    capsys.readouterr()
    assert main(["explain", *argv, "--format", "html"]) == 0
    return capsys.readouterr().out


def test_page_is_self_contained(capsys):
    page = explain_html([TINY, "--pp", "2"], capsys)
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert not re.search(r"""(?:src|href)\s*=\s*["'](?!data:)""", page), "a link to an outside file"
    assert "<script" not in page
    pytest.importorskip("matplotlib")
    assert page.count('src="data:image/png;base64,') == 2


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install -y chromium)")
def test_chromium_shows_tables_pictures_and_why_lines(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    page = explain_html([TINY, "--pp", "2"], capsys)
    seen = rendered(page, tmp_path, width=1024)
    assert [(i["id"], i["complete"]) for i in seen["images"]] == [("memory-picture", True),
                                                                  ("schedule-picture", True)]
    assert all(i["width"] > 300 for i in seen["images"]), seen["images"]  # decoded, not a broken icon
    memory, time, alternatives = seen["tables"]
    assert memory["headers"][:3] == ["stage", "layers", "params"] and memory["rows"] == 2
    assert "model FLOP/s per GPU" in [h for h in seen["text"].splitlines() if "FLOP/s" in h][0]
    assert alternatives["headers"][0] == "layout" and alternatives["rows"] >= 1
    assert all(t["fits"] for t in seen["tables"]), [t["headers"] for t in seen["tables"] if not t["fits"]]
    assert seen["pageFits"]
    assert seen["headings"][0].startswith("Plan: dp=1 pp=2")
    for heading in ("Memory per GPU by stage (MiB)", "Time per step", "Pipeline schedule", "Why"):
        assert heading in seen["headings"], heading
    assert "fastest of" in seen["text"] and "GFLOP/s" in seen["text"]
    # a percentage (percent_text: 6.9%), not the terminal's bar
    assert re.search(r"\b\d+\.\d+%", seen["text"]) and "#...." not in seen["text"]


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install -y chromium)")
def test_chromium_on_a_phone_width_scrolls_tables_not_the_page(tmp_path, capsys):
    page = explain_html(["--model", "llama-3-8b", "--gpus", "8", "--zero", "3", "--offload-optimizer", "cpu"], capsys)
    seen = rendered(page, tmp_path, width=420)
    assert seen["pageFits"]
    assert "Offloaded per rank: CPU" in seen["text"]
    assert "opt->cpu" in seen["headings"][0]
