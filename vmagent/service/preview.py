"""The live preview page: newest screenshot, terminal tail, task list and status line.

It is made for Open WebUI's sandboxed iframe: no cookies (the signed token rides in the
URL and is passed on to the event stream and the screenshot), relative URLs only, and it
reports its height to the parent with postMessage({type: 'iframe:height', height}).
"""

from __future__ import annotations

import html
import json

# The terminal keeps this many lines; a person watching reads the tail.
TERMINAL_LINES = 300

# The banner over the last frame while the job waits for a person, by the job's state
# (the job API's) and by the loop's (a live "state" event); the page's script has the same.
WAITING = {"needs_input": "Waiting for your answer", "question": "Waiting for your answer",
           "needs_approval": "Waiting for your decision", "unfreeze": "Waiting for your decision"}


def render_preview(job: dict, token: str) -> str:
    config = {
        "token": token,
        "state": job["state"],
        "screenshotSeq": job["screenshot_seq"],
        "terminalLines": TERMINAL_LINES,
    }
    # "</" inside a script would end it early: escape it.
    config_json = json.dumps(config).replace("</", "<\\/")
    screen_src = f"screen.png?token={html.escape(token)}&n={job['screenshot_seq']}" if job["screenshot_seq"] else ""
    waiting = WAITING.get(job["state"])
    return _PAGE.format(
        title=html.escape(job["task"][:80]),
        task=html.escape(job["task"][:300]),
        state=html.escape(job["state"]),
        status=html.escape(job["status_line"] or ""),
        tasks=html.escape(job["tasks_text"] or "(no plan yet)"),
        screen_src=screen_src,
        screen_hidden="" if screen_src else "hidden",
        screen_shown="hidden" if screen_src else "",
        waiting_hidden="" if waiting else "hidden",
        waiting=html.escape(waiting or ""),
        question=html.escape(job.get("question") or ""),
        config_json=config_json,
        waiting_json=json.dumps(WAITING),
    )


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>vmagent: {title}</title>
<style>
  :root {{ color-scheme: light dark; font-family: system-ui, sans-serif; font-size: 14px; }}
  body {{ margin: 0; padding: 8px; }}
  header {{ display: flex; gap: 8px; align-items: baseline; flex-wrap: wrap; }}
  #state {{ font-weight: 600; padding: 1px 6px; border-radius: 4px; background: #8884; }}
  #status {{ opacity: .85; }}
  #task {{ margin: 4px 0 8px; opacity: .7; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }}
  main {{ display: grid; grid-template-columns: minmax(0, 3fr) minmax(0, 2fr); gap: 8px; }}
  @media (max-width: 700px) {{ main {{ grid-template-columns: 1fr; }} }}
  #screen {{ width: 100%; height: auto; border: 1px solid #8886; border-radius: 4px; }}
  #waiting {{ padding: 6px 8px; margin-bottom: 6px; border-radius: 4px; background: #e8b34b33;
             border: 1px solid #e8b34b; }}
  #waiting b {{ font-weight: 600; }}
  #noscreen {{ padding: 24px; text-align: center; border: 1px dashed #8886; border-radius: 4px; opacity: .7; }}
  pre {{ margin: 0; white-space: pre-wrap; word-break: break-all; }}
  #terminal {{ background: #111; color: #ddd; padding: 6px; border-radius: 4px; height: 320px;
              overflow-y: auto; font: 12px/1.35 ui-monospace, monospace; }}
  #terminal .cmd {{ color: #7fd67f; }}
  #terminal .err {{ color: #f08a8a; }}
  #tasks {{ font: 12px/1.4 ui-monospace, monospace; margin-bottom: 8px; }}
  h2 {{ font-size: 12px; text-transform: uppercase; letter-spacing: .05em; opacity: .6; margin: 6px 0 4px; }}
</style>
</head>
<body>
<header><span id="state">{state}</span><span id="status">{status}</span></header>
<div id="task">{task}</div>
<main>
  <section>
    <div id="waiting" {waiting_hidden}><b id="waitingtitle">{waiting}</b>: <span id="question">{question}</span></div>
    <img id="screen" alt="the guest's screen" src="{screen_src}" {screen_hidden}>
    <div id="noscreen" {screen_shown}>No screenshot yet: the screen shows here once the machine is up.</div>
  </section>
  <section>
    <h2>Tasks</h2><pre id="tasks">{tasks}</pre>
    <h2>Terminal</h2><pre id="terminal"></pre>
  </section>
</main>
<script>
(function () {{
  var cfg = {config_json};
  var q = "token=" + encodeURIComponent(cfg.token);
  var terminal = document.getElementById("terminal");
  var screen = document.getElementById("screen");
  var noscreen = document.getElementById("noscreen");
  var lastHeight = 0;

  function postHeight() {{
    var h = Math.ceil(document.documentElement.scrollHeight);
    if (h === lastHeight) return;
    lastHeight = h;
    try {{ window.parent.postMessage({{type: "iframe:height", height: h}}, "*"); }} catch (e) {{}}
  }}
  // Follow the newest line unless the person scrolled up to read.
  var stick = true;
  terminal.addEventListener("scroll", function () {{
    stick = terminal.scrollTop + terminal.clientHeight >= terminal.scrollHeight - 24;
  }});
  function addLine(text, cls) {{
    var div = document.createElement("div");
    if (cls) div.className = cls;
    div.textContent = text;
    terminal.appendChild(div);
    while (terminal.childNodes.length > cfg.terminalLines) terminal.removeChild(terminal.firstChild);
    if (stick) terminal.scrollTop = terminal.scrollHeight;
  }}
  function showScreen(seq) {{
    if (seq <= cfg.screenshotSeq && screen.getAttribute("src")) return;
    cfg.screenshotSeq = seq;
    screen.src = "screen.png?" + q + "&n=" + seq;
    screen.hidden = false;
    noscreen.hidden = true;
  }}
  var WAITING = {waiting_json};
  function setState(state, question) {{
    document.getElementById("state").textContent = state;
    if (question) document.getElementById("status").textContent = question;
    // The last frame stays; a banner over it says the job waits, and for what.
    var waiting = document.getElementById("waiting");
    waiting.hidden = !WAITING[state];
    if (WAITING[state]) {{
      document.getElementById("waitingtitle").textContent = WAITING[state];
      if (question) document.getElementById("question").textContent = question;
    }}
  }}
  function resumed() {{ document.getElementById("waiting").hidden = true; }}  // the job works again
  function handle(seq, ev) {{
    switch (ev.type) {{
      case "status": resumed(); document.getElementById("status").textContent = ev.text || ""; break;
      case "tasks": document.getElementById("tasks").textContent = ev.text || ""; break;
      case "command": resumed(); addLine("$ " + (ev.command || ""), "cmd"); break;
      case "output": addLine(ev.line || "", ev.stream === "stderr" ? "err" : ""); break;
      case "screenshot": showScreen(seq); break;
      case "speech": break;
      case "state": if (ev.state) setState(ev.state, ev.question); break;
      case "done": break;
    }}
  }}

  screen.addEventListener("load", postHeight);
  if (window.ResizeObserver) new ResizeObserver(postHeight).observe(document.body);
  window.addEventListener("load", postHeight);
  setInterval(postHeight, 1000);

  if (!window.EventSource) return;
  var lastSeq = 0, source = null;
  function connect() {{
    source = new EventSource("events?" + q + "&after=" + lastSeq);
    source.onmessage = function (msg) {{
      var ev;
      try {{ ev = JSON.parse(msg.data); }} catch (e) {{ return; }}
      lastSeq = Number(msg.lastEventId) || lastSeq;
      handle(lastSeq, ev);
      postHeight();
    }};
    source.addEventListener("end", function (msg) {{
      source.close();
      var end = {{}};
      try {{ end = JSON.parse(msg.data); }} catch (e) {{}}
      if (end.state) setState(end.state);
      // A job waiting for a person resumes later: look again now and then.
      if (["done", "failed", "cancelled", "gone"].indexOf(end.state) < 0) setTimeout(connect, 5000);
    }});
  }}
  connect();
}})();
</script>
</body>
</html>
"""
