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


# ---- the layering of all three packages (issue 41)
PROJECT = ("agent", "app", "trainer")
MAX_LAZY = 30  # function-level imports of project modules, each saying why with `# lazy: ...`


def lazy_project_imports(root=ROOT) -> list[tuple[str, int, str]]:
    """(file, line, text) of every import of a project module inside a function or class."""
    found = []

    def walk(node, nested, name, lines):
        for child in ast.iter_child_nodes(node):
            if nested and isinstance(child, (ast.Import, ast.ImportFrom)) and not getattr(child, "level", 0):
                names = [a.name for a in child.names] if isinstance(child, ast.Import) else [child.module or ""]
                if any(n.split(".")[0] in PROJECT for n in names):
                    text = " ".join(ln.strip() for ln in lines[child.lineno - 1:child.end_lineno])
                    found.append((name, child.lineno, text))
            walk(child, nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)), name, lines)

    for f in sorted([root / "main.py"] + [p for pkg in PROJECT for p in (root / pkg).rglob("*.py")]):
        src = f.read_text(encoding="utf-8")
        walk(ast.parse(src), False, str(f.relative_to(root)), src.splitlines())
    return found


def test_project_modules_are_imported_at_the_top():
    lazy = lazy_project_imports()
    unexplained = [f"{f}:{n}: {t}" for f, n, t in lazy if "# lazy:" not in t]
    assert not unexplained, "a function-level project import says why with `# lazy: <why>`:\n" + "\n".join(unexplained)
    assert len(lazy) <= MAX_LAZY, f"{len(lazy)} function-level project imports (at most {MAX_LAZY}):\n" + "\n".join(
        f"{f}:{n}: {t}" for f, n, t in lazy)


def test_the_lazy_import_finder_sees_nested_imports(tmp_path):
    (tmp_path / "agent").mkdir()
    (tmp_path / "main.py").write_text("import agent.schema\n")
    (tmp_path / "agent" / "m.py").write_text("def f():\n    from agent import coords  # lazy: why\n    import os\n")
    assert lazy_project_imports(tmp_path) == [("agent/m.py", 2, "from agent import coords  # lazy: why")]


def test_the_import_contracts_hold():
    """The contracts in .importlinter (layers of agent and trainer, the backend island, the
    sandbox on agent alone, no heavy library in the data model), as .ci/run checks them."""
    lint = Path(sys.executable).with_name("lint-imports")
    assert lint.exists(), f"{lint} is missing: install the test requirements (import-linter)"
    out = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout, out.stdout[-2000:]
