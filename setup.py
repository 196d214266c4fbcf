"""The package's dependencies, read from the requirements files, which hold every pin.

requirements.txt lists all a checkout needs (`pip install -r requirements.txt`). A line whose
comment starts with an extra's name in brackets, `torch==2.13.0  # [train] ...`, goes to that
extra instead of the core; untagged lines (a pin someone appends included) are core. The `test`
extra is requirements-test.txt's own pins plus every other extra. Everything else about the
package is in pyproject.toml.
"""
import re
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent


def requirement_lines(name: str):
    """(requirement, extra or None) for each requirement of a requirements file; `-r` and other
    pip options are skipped."""
    for line in (HERE / name).read_text().splitlines():
        req, _, comment = line.partition("#")
        req = req.strip()
        if req and not req.startswith("-"):
            tag = re.match(r"\s*\[(\w+)\]", comment)
            yield req, tag.group(1) if tag else None


core, extras = [], {}
for req, extra in requirement_lines("requirements.txt"):
    (extras.setdefault(extra, []) if extra else core).append(req)
extras["test"] = [req for req, _ in requirement_lines("requirements-test.txt")] + [
    req for reqs in list(extras.values()) for req in reqs]

setup(install_requires=core, extras_require=extras)
