"""One root per package: every error the project raises on purpose is an agent.errors.TandemError
(the trainer's through trainer.errors.TrainerError) and keeps the built-in base that callers catch
today; main.py reports one that reaches it as one clear line with exit status 2."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from agent.errors import TandemError
from trainer.errors import TrainerError

ROOT = Path(__file__).resolve().parents[1]
# control flow inside one module, never raised to a caller
INTERNAL = {"_End", "_OutOfTime", "_Syntax", "_Transient"}


def error_classes():
    """(module, class name) of every exception class the packages define, read from the source."""
    for pkg in ("agent", "app", "trainer"):
        for f in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef) and node.name not in INTERNAL and any(
                        (getattr(b, "id", None) or getattr(b, "attr", "")).endswith(("Error", "Exception", "Refused"))
                        or getattr(b, "id", None) in ("NothingRecorded", "ExecutionError", "MiniWoBError")
                        for b in node.bases):
                    yield ".".join(f.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"), node.name


def test_every_error_class_has_its_packages_root_and_keeps_its_builtin_base():
    import importlib

    found = list(error_classes())
    assert len(found) >= 38, found  # the scan really saw them
    for module, name in found:
        cls = getattr(importlib.import_module(module), name)
        root = TrainerError if module.startswith("trainer.") else TandemError
        assert issubclass(cls, root), f"{module}.{name} does not derive from {root.__name__}"
    # code that catches the built-in types catches them as before
    from agent.schema import SchemaError
    from agent.storage.store import NotFound
    from trainer.rl.gae import GAEError
    from trainer.sandbox.miniwob_browser import MiniWoBTimeout

    assert issubclass(SchemaError, ValueError) and issubclass(NotFound, KeyError) and issubclass(GAEError, ValueError)
    assert issubclass(MiniWoBTimeout, RuntimeError) and issubclass(TrainerError, TandemError)


def test_main_reports_a_tandem_error_from_a_subcommand_as_one_line(tmp_path):
    """`flywheel simulate-humans` with an unknown family: the sandbox's SandboxError, which no
    command catches, comes out as one `error:` line and exit status 2, not a traceback."""
    r = subprocess.run([sys.executable, "main.py", "flywheel", "simulate-humans", "--data", str(tmp_path),
                        "--families", "no_such_family", "--recordings", "1", "--supervised", "0"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [
        "error: unknown task family 'no_such_family'; known: " + ", ".join(_families())], r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def _families():
    from trainer.sandbox.families import FAMILIES, HYBRID_FAMILIES

    return [*FAMILIES, *HYBRID_FAMILIES]


def test_a_multi_line_message_is_one_line():
    from main import one_line

    assert one_line(TandemError("first\n\n  second  \n")) == "first; second"
    assert one_line(TandemError()) == "TandemError"
