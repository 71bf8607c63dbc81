"""The line between the agent and the supervisor: `vmagent/` imports nothing of `vmd/`
but the contract module `vmd/verbs.py` (pure pydantic, no behaviour). Checked on the
syntax tree of every module, so an import inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALLOWED = {"vmd.verbs"}


def _vmd_imports(path: Path) -> list[str]:
    """Every vmd module `path` imports, as dotted names, with the line it is on."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "vmd":  # `from vmd import verbs` names a module
                names = [f"vmd.{alias.name}" for alias in node.names]
            else:
                names = [node.module]
        else:
            continue
        found += [f"{name} (line {node.lineno})" for name in names
                  if name == "vmd" or name.startswith("vmd.")]
    return found


def test_vmagent_imports_only_the_contract_of_vmd():
    modules = sorted((ROOT / "vmagent").rglob("*.py"))
    assert modules, "no modules found under vmagent/"
    crossing = {str(path.relative_to(ROOT)): [i for i in _vmd_imports(path) if i.split(" ")[0] not in ALLOWED]
                for path in modules}
    crossing = {path: imports for path, imports in crossing.items() if imports}
    assert not crossing, f"vmagent/ modules import vmd internals: {crossing}"


def test_the_check_sees_every_form_of_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import vmd.session\nfrom vmd import verbs, rpc\nfrom vmd.verbs import Run\n"
                      "def f():\n    from vmd.errors import REFUSED\n")
    assert _vmd_imports(sample) == ["vmd.session (line 1)", "vmd.verbs (line 2)", "vmd.rpc (line 2)",
                                    "vmd.verbs (line 3)", "vmd.errors (line 5)"]


def test_the_contract_is_pure_and_closed():
    # vmagent may import vmd/verbs.py only because it pulls in nothing of vmd's behaviour:
    # its one vmd import is its own result models, and those import nothing of vmd.
    contract = {"vmd.verbs": ROOT / "vmd" / "verbs.py", "vmd.verb_results": ROOT / "vmd" / "verb_results.py",
                "vmd.shown_text": ROOT / "vmd" / "shown_text.py",
                "vmd.request_bounds": ROOT / "vmd" / "request_bounds.py", "vmd.verdict": ROOT / "vmd" / "verdict.py",
                "vmd.json_depth": ROOT / "vmd" / "json_depth.py", "vmd.check_results": ROOT / "vmd" / "check_results.py"}
    imports = {name: {i.split(" ")[0] for i in _vmd_imports(path)} for name, path in contract.items()}
    assert imports == {"vmd.request_bounds": {"vmd.verb_results"},
                       "vmd.verbs": {"vmd.verb_results", "vmd.shown_text", "vmd.request_bounds", "vmd.json_depth"},
                       "vmd.verb_results": {"vmd.verdict", "vmd.check_results"}, "vmd.shown_text": set(),
                       "vmd.verdict": set(), "vmd.json_depth": set(), "vmd.check_results": set()}, imports
    for path in contract.values():
        tops = {node.names[0].name.split(".")[0] if isinstance(node, ast.Import) else (node.module or "").split(".")[0]
                for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, (ast.Import, ast.ImportFrom))}
        assert tops <= {"__future__", "re", "typing", "pathlib", "json", "itertools", "pydantic", "vmd"}, (path.name, tops)




def test_no_module_outgrows_a_room():
    # A module past ~450 lines has been holding more than one thing each time so far
    # (session.py, tools.py, loop.py before the re-layout; rpc.py, machine.py and
    # warm_pool.py in vmd's): split it by what it holds.
    # The Open WebUI tool is the exception: Open WebUI takes a tool as one file of source.
    one_file = {"vmagent/openwebui/vm_agent.py"}
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines())
             for top in ("vmd", "vmagent") for p in (ROOT / top).rglob("*.py")}
    sizes = {p: n for p, n in sizes.items() if p not in one_file}
    too_big = {p: n for p, n in sizes.items() if n > 450}
    assert sizes and not too_big, sorted(too_big.items(), key=lambda kv: -kv[1])


# --- vmd's own layering: no circle, no import hidden in a function without its reason ----

def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _project_imports(path: Path, modules: set[str], root: Path = ROOT) -> list[tuple[str, ast.stmt]]:
    """The modules of `modules` that `path` imports, each with its statement: `from a.b
    import c` names the module a.b.c when there is one, else a.b; relative imports too.
    Every import counts, also one under TYPE_CHECKING or inside a function."""
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        found += [(name, node) for name in names if name in modules]
    return found


def _graph(top: str) -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in (ROOT / top).rglob("*.py")}
    return {name: {imported for imported, _ in _project_imports(path, set(paths))} - {name}
            for name, path in paths.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                part.append(member)
                if member == node:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_in_vmd():
    # A circle is a module that cannot be read without one above it: the port imported its
    # implementation, the session its handlers, which imported the session. The port
    # declares the types and the implementations import it, never the other way round.
    graph = _graph("vmd")
    assert len(graph) > 40 and graph["vmd.session.serving"] >= {"vmd.session.session", "vmd.session.handlers"}
    assert _circles(graph) == []


def test_no_import_circle_in_vmagent():
    # The same rule on the agent's side: `vmagent eval` took the terminal's show() from
    # cli.py, which starts the eval, a circle kept open by an import hidden in a function.
    graph = _graph("vmagent")
    assert len(graph) > 30 and "vmagent.eval.command" in graph["vmagent.cli"]
    assert _circles(graph) == []


def test_the_circle_check_finds_a_circle_through_type_checking_and_relative_imports(tmp_path):
    graph = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": {"p.a"}, "p.e": {"p.e"}}
    assert _circles(graph) == [["p.a", "p.b", "p.c"]]
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "one.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .two import T\n")
    (package / "two.py").write_text("from pkg import one\n")
    modules = {"pkg", "pkg.one", "pkg.two"}
    one = [name for name, _ in _project_imports(package / "one.py", modules, tmp_path)]
    two = [name for name, _ in _project_imports(package / "two.py", modules, tmp_path)]
    assert one == ["pkg.two"] and two == ["pkg.one"]


def _imports_in_functions(path: Path) -> list[ast.stmt]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += [n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))]
    return found


def _says_why(lines: list[str], node: ast.stmt) -> bool:
    """A comment on the import's line or on the line above it."""
    line, above = lines[node.lineno - 1], lines[node.lineno - 2] if node.lineno > 1 else ""
    return "#" in line or above.strip().startswith("#")


def test_an_import_inside_a_function_says_why():
    # An import hidden in a function is how the circles were kept alive; one that stays
    # (a command line that starts without the server's libvirt) says so where it is.
    modules = {_module_name(p) for p in (ROOT / "vmd").rglob("*.py")}
    silent = []
    for path in sorted((ROOT / "vmd").rglob("*.py")):
        lines = path.read_text().splitlines()
        for node in _imports_in_functions(path):
            project = [name for name, n in _project_imports(path, modules) if n is node]
            if project and not _says_why(lines, node):
                silent.append(f"{path.relative_to(ROOT)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert not silent, silent


def test_the_guests_know_nothing_of_the_machines_or_the_windows_image():
    # vmd.guests sits below vmd.machines (which drives a guest) and vmd.windows_image (which
    # builds one and drives libvirt through vmd.machines): a guest module importing either
    # closes a circle (guests -> windows_image -> machines -> guests, until the Windows
    # contract moved to vmd/guests/windows_contract.py).
    above = ("vmd.machines", "vmd.windows_image", "vmd.session", "vmd.server")
    crossing = {str(path.relative_to(ROOT)): [i for i in _vmd_imports(path) if i.split(" ")[0].startswith(above)]
                for path in sorted((ROOT / "vmd" / "guests").rglob("*.py"))}
    crossing = {path: imports for path, imports in crossing.items() if imports}
    assert not crossing, crossing
