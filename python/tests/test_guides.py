"""docs/guides/python.md's blocks, run as a notebook runs its cells: one after the other in one
namespace, from the root of a fresh copy of the repository."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from conftest import ROOT

GUIDE = ROOT / "docs" / "guides" / "python.md"


def python_blocks(text: str) -> list[tuple[str, str]]:
    """(NAME, body) of every ```python block, in order; each must follow a
    `<!-- doc-test: NAME -->` or `<!-- not run: REASON -->` line."""
    blocks = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            marker = lines[i - 1] if i else ""
            end = lines.index("```", i + 1)
            m = re.fullmatch(r"<!-- doc-test: ([\w-]+) -->", marker)
            assert m or re.fullmatch(r"<!-- not run: .+ -->", marker), (
                f"{GUIDE.name}:{i + 1}: a python block needs <!-- doc-test: NAME --> or "
                "<!-- not run: REASON --> on the line before it"
            )
            if m:
                blocks.append((m.group(1), "\n".join(lines[i + 1:end])))
            i = end
        i += 1
    return blocks


def test_the_python_guide_runs_as_written(tmp_path, capsys):
    blocks = python_blocks(GUIDE.read_text())
    assert [name for name, _ in blocks] == ["py-run", "py-frame", "py-compare", "py-evaluate"]
    tree = tmp_path / "repo"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(".git", "target", "runs",
                                                             "__pycache__"))
    namespace: dict = {}
    here = Path.cwd()
    os.chdir(tree)
    try:
        for name, body in blocks:
            exec(compile(body, f"{GUIDE.name}:{name}", "exec"), namespace)
    finally:
        os.chdir(here)
    out = capsys.readouterr().out
    assert "final global accuracy" in out
    assert (tree / "runs" / "py-quickstart" / "results.json").exists()
    assert set(namespace["accuracy"]) == {"fedavg", "fedprox"}
