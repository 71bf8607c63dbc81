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
