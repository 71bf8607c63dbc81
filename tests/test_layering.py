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
                "vmd.shown_text": ROOT / "vmd" / "shown_text.py"}
    imports = {name: {i.split(" ")[0] for i in _vmd_imports(path)} for name, path in contract.items()}
    assert imports == {"vmd.verbs": {"vmd.verb_results", "vmd.shown_text"}, "vmd.verb_results": set(),
                       "vmd.shown_text": set()}, imports
    for path in contract.values():
        tops = {node.names[0].name.split(".")[0] if isinstance(node, ast.Import) else (node.module or "").split(".")[0]
                for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, (ast.Import, ast.ImportFrom))}
        assert tops <= {"__future__", "re", "typing", "pathlib", "pydantic", "vmd"}, (path.name, tops)


def test_no_module_outgrows_a_room():
    # A module past ~500 lines has been holding more than one thing each time so far
    # (session.py, tools.py, loop.py before the re-layout): split it by what it holds.
    # The Open WebUI tool is the exception: Open WebUI takes a tool as one file of source.
    one_file = {"vmagent/openwebui/vm_agent.py"}
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines())
             for top in ("vmd", "vmagent") for p in (ROOT / top).rglob("*.py")}
    sizes = {p: n for p, n in sizes.items() if p not in one_file}
    assert sizes and not {p: n for p, n in sizes.items() if n > 500}, sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
