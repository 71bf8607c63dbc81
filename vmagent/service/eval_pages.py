"""The last `vmagent eval` runs, read-only, for operators: GET /evals lists the runs kept
under the service's eval_runs_dir (each a folder with results.json and index.html, as
vmagent/eval/pages.py writes them), newest first, with their totals; GET /evals/{run}
is that run's page, and GET /evals/{run}/runs/{name}/report.md a run's report, as
plain text (it holds the model's and the guest's words). Only the service's operators
(`operators`) may look: a report holds other people's tasks; nothing here writes. A name is one plain path component (vmd/contract/bounds.py
NAME_PATTERN), so no request reaches outside the folder."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Callable

from fastapi import FastAPI, HTTPException, Request, Security
from fastapi.responses import HTMLResponse, PlainTextResponse, Response

from vmd.contract.bounds import NAME_PATTERN

from .refusals import AUTHENTICATED, BEARER, OPERATORS, ErrorBody, success

# Runs listed on the page: a person compares the last few; older ones stay on disk.
LISTED_RUNS = 30
HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
NO_RUN = {**OPERATORS, 404: {"model": ErrorBody, "description": "There is no such eval run."}}


def add_eval_routes(app: FastAPI, runs_dir: Path, operator_of: Callable[[Request, str], object]) -> None:
    bearer = [Security(BEARER)]  # documents the scheme; operator_of() checks it and the caller's role

    @app.get("/evals", response_class=Response, dependencies=bearer,
             responses={401: AUTHENTICATED[401], 403: OPERATORS[403],
                        **success("text/html", "The kept runs, newest first.")})
    def eval_runs(request: Request):
        operator_of(request, "GET /evals")
        return HTMLResponse(listing(runs_dir), headers=HEADERS)

    # With the slash, so that the page's relative links (runs/NAME/report.md) land below it;
    # /evals/{run} is redirected here by the router.
    @app.get("/evals/{run}/", response_class=Response, dependencies=bearer,
             responses={**NO_RUN, **success("text/html", "The run's page.")})
    def eval_run(run: str, request: Request):
        operator_of(request, "GET /evals")
        return HTMLResponse(_file(runs_dir, run, "index.html").read_text(encoding="utf-8"), headers=HEADERS)

    @app.get("/evals/{run}/runs/{name}/report.md", response_class=Response, dependencies=bearer,
             responses={**NO_RUN, **success("text/plain", "One run's report.")})
    def eval_report(run: str, name: str, request: Request):
        operator_of(request, "GET /evals")
        path = _file(runs_dir, run, "runs", name, "report.md")
        return PlainTextResponse(path.read_text(encoding="utf-8", errors="replace"), headers=HEADERS)


def _file(root: Path, *parts: str) -> Path:
    for part in parts[:-1]:
        if not NAME_PATTERN.fullmatch(part):
            raise HTTPException(404, "There is no such eval run.")
    path = root.joinpath(*parts)
    if not path.is_file():
        raise HTTPException(404, "There is no such eval run.")
    return path


def runs(runs_dir: Path) -> list[tuple[str, dict]]:
    """(folder name, results.json) of the kept runs, newest first; unreadable ones left out."""
    found = []
    for folder in runs_dir.iterdir() if runs_dir.is_dir() else []:
        try:
            found.append((folder.stat().st_mtime, folder.name,
                          json.loads((folder / "results.json").read_text(encoding="utf-8"))))
        except (OSError, ValueError):
            continue
    return [(name, data) for _, name, data in sorted(found, reverse=True)[:LISTED_RUNS] if NAME_PATTERN.fullmatch(name)]


def listing(runs_dir: Path) -> str:
    e = html.escape
    rows = []
    for name, data in runs(runs_dir):
        t = data.get("totals") or {}
        n = t.get("runs") or 0
        rows.append(f'<tr><td><a href="evals/{e(name)}/">{e(name)}</a></td><td>{e(str(data.get("model", "")))}</td>'
                    f'<td>{e(str(data.get("started", "")))}</td><td>{n}</td><td>{t.get("solved", 0)}/{n}</td>'
                    f'<td>{t.get("solved_and_proven", 0)}/{n}</td><td>{t.get("passed_not_proven", 0)}</td>'
                    f'<td>{t.get("median_wall_s")}</td><td>{t.get("tokens_per_solved")}</td></tr>')
    body = "\n".join(rows) or '<tr><td colspan="9">No eval runs kept yet: run `vmagent eval --out ' \
                              f'{e(str(runs_dir))}/NAME`.</td></tr>'
    return ('<!doctype html>\n<html><head><meta charset="utf-8"><title>vmagent eval runs</title>'
            "<style>body{font:14px system-ui,sans-serif;margin:2em}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:.25em .6em}</style></head><body>\n"
            "<h1>The last eval runs</h1>\n<p>Solved: the task's hidden check passed. Solved and proven: "
            "the agent's own check also failed on the project as it was before.</p>\n<table><tr><th>run</th>"
            "<th>model</th><th>started</th><th>runs</th><th>solved</th><th>solved and proven</th>"
            "<th>passed, not proven</th><th>median wall s</th><th>tokens per solved</th></tr>\n"
            f"{body}\n</table></body></html>\n")
