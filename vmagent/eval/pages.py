"""An eval run kept on disk: results.json (the rows and the totals) and index.html, a small
self-contained page (no script, no outside file) with one row per run and each run's
report linked. Every text on the page is escaped: task names, reasons and check output
come from the model and the guest."""

from __future__ import annotations

import html
import json
from pathlib import Path

from vmagent.atomic_file import replace_text
from vmagent.eval.scores import Row, Totals, summary_lines

RESULTS_VERSION = 1


def write_results(out_dir: Path, rows: list[Row], totals: Totals, meta: dict) -> tuple[Path, Path]:
    """-> (results.json, index.html), each written whole (a reader never sees half a file)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    data = {"version": RESULTS_VERSION, **meta, "totals": totals.model_dump(), "runs": [r.model_dump() for r in rows]}
    json_path = _write(out_dir / "results.json", json.dumps(data, indent=2, ensure_ascii=False))
    html_path = _write(out_dir / "index.html", page(rows, totals, meta))
    return json_path, html_path


def read_results(out_dir: Path) -> dict:
    return json.loads((out_dir / "results.json").read_text(encoding="utf-8"))


HEAD = ["task", "#", "kind", "outcome", "hidden check", "checked on", "agent's check", "turns", "model s", "prompt tokens",
        "reply tokens", "wall s", "report"]
STYLE = ("body{font:14px system-ui,sans-serif;margin:2em}table{border-collapse:collapse}"
         "td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}td.n{text-align:right}"
         ".passed{background:#e6f6e6}.failed,.not.run{background:#fbe9e9}.why{color:#555;font-size:12px}")


def page(rows: list[Row], totals: Totals, meta: dict) -> str:
    e = html.escape
    title = f"vmagent eval: {meta.get('model', '?')} ({meta.get('started', '')})"
    body = []
    for r in rows:
        report = f'<a href="{e(r.report)}">report</a>' if r.report else ""
        why = f'<div class="why">{e(r.reason)} {e(r.hidden_detail)}</div>' if not r.solved else ""
        cells = [f"<td>{e(r.task)}{why}</td>", f'<td class="n">{r.round}</td>', f"<td>{e(r.kind)}</td>",
                 f"<td>{e(r.outcome)}</td>", f'<td class="{e(r.hidden)}">{e(r.hidden)}</td>', f"<td>{e(r.hidden_on or '-')}</td>",
                 f"<td>{e(r.check)}</td>", f'<td class="n">{r.turns}</td>', f'<td class="n">{r.model_s:.1f}</td>',
                 f'<td class="n">{r.prompt_tokens}</td>', f'<td class="n">{r.reply_tokens}</td>',
                 f'<td class="n">{r.wall_s:.1f}</td>', f"<td>{report}</td>"]
        body.append("<tr>" + "".join(cells) + "</tr>")
    head = "".join(f"<th>{e(h)}</th>" for h in HEAD)
    summary = "".join(f"<li>{e(line)}</li>" for line in summary_lines(totals))
    return (f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{e(title)}</title>'
            f"<style>{STYLE}</style></head><body>\n<h1>{e(title)}</h1>\n"
            f"<p>Solved means the task's hidden check, run by vmd after the agent stopped on a fresh "
            f"machine holding the committed project (never the agent's), passed with the result it writes "
            f"back. The agent's check is vmd's run of the check the agent named: proven when it also "
            f"failed on the project as it was before.</p>\n<ul>{summary}</ul>\n"
            f"<table><tr>{head}</tr>\n" + "\n".join(body) + "\n</table>\n</body></html>\n")


def _write(path: Path, text: str) -> Path:
    return replace_text(path, text)
