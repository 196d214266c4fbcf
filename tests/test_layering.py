"""The core stays Qt-free: no module under agent/ imports PySide6 (anywhere, functions
included), and importing every agent module leaves PySide6 out of sys.modules."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AGENT = ROOT / "agent"
QT = ("PySide6", "shiboken6", "PyQt5", "PyQt6", "PySide2")
UPPER = ("app", "trainer")  # dependencies point one way: app -> agent, trainer -> agent


def qt_imports(source: str, banned=QT) -> list[tuple[int, str]]:
    """(line, module) of every import of a `banned` package in the source, at any depth."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__"):
            names = [a.value for a in node.args[:1] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        else:
            continue
        found += [(node.lineno, n) for n in names if n.split(".")[0] in banned]
    return found


def test_the_checker_finds_nested_and_dynamic_imports():
    src = "def f():\n    from PySide6.QtCore import Qt\n    import importlib\n    importlib.import_module('PySide6.QtGui')\nimport os\n"
    assert qt_imports(src) == [(2, "PySide6.QtCore"), (4, "PySide6.QtGui")]


def test_no_agent_module_imports_qt():
    files = sorted(AGENT.rglob("*.py"))
    assert files, "agent/ has no modules"
    offenders = [f"{f.relative_to(ROOT)}:{line} imports {mod}" for f in files for line, mod in qt_imports(f.read_text(encoding="utf-8"))]
    assert not offenders, "agent/ must stay Qt-free:\n" + "\n".join(offenders)


def test_agent_does_not_import_app_or_trainer():
    offenders = [f"{f.relative_to(ROOT)}:{line} imports {mod}" for f in sorted(AGENT.rglob("*.py"))
                 for line, mod in qt_imports(f.read_text(encoding="utf-8"), UPPER)]
    assert not offenders, "agent/ is the bottom layer:\n" + "\n".join(offenders)


def test_importing_agent_does_not_load_qt():
    code = f"QT = {QT!r}\n" + """
import importlib, json, pkgutil, sys
import agent
failed = {}
for m in pkgutil.walk_packages(agent.__path__, "agent."):
    try:
        importlib.import_module(m.name)
    except Exception as e:
        failed[m.name] = repr(e)
print(json.dumps({"qt": sorted(k for k in sys.modules if k.split(".")[0] in QT), "failed": failed,
                  "n": sum(1 for k in sys.modules if k.startswith("agent."))}))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["n"] >= 5, result  # the modules really were imported
    assert result["failed"] == {}, f"agent modules that do not import: {result['failed']}"
    assert result["qt"] == [], f"importing agent.* loaded {result['qt']}"
