"""Shared set-up for the package's tests: the repository, the fedfuse binary, the fixtures."""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"


@pytest.fixture(scope="session")
def fedfuse_bin() -> Path:
    path = Path(os.environ.get("FEDFUSE_BIN", ROOT / "target" / "debug" / "fedfuse"))
    if not path.exists():
        pytest.fail(f"{path} is missing: build it with `cargo build --workspace --all-targets`")
    return path
