"""engine/core is sans-I/O: it never awaits and imports no I/O module; the engine never
imports adapters statically. Checked on the source (AST), so a new module is covered
the day it is added."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "engine" / "core"
ENGINE = ROOT / "engine"

# Modules that perform or schedule I/O, or read the clock.
FORBIDDEN = {
    "anyio",
    "asyncio",
    "httpx",
    "httpx_sse",
    "socket",
    "ssl",
    "select",
    "selectors",
    "sqlite3",
    "asyncpg",
    "psycopg",
    "subprocess",
    "threading",
    "multiprocessing",
    "time",
    "datetime",
    "urllib",
    "http",
    "io",
    "os",
    "pathlib",
    "shutil",
    "tempfile",
    "uvloop",
    "signal",
    "logging",
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def _core_files() -> list[Path]:
    files = sorted(CORE.rglob("*.py"))
    assert len(files) >= 5, "engine/core should hold the protocol core"
    return files


def test_core_imports_no_io_module() -> None:
    offenders = {
        f"{p.relative_to(ROOT)}: {name}"
        for p in _core_files()
        for name in _imports(p)
        if name.split(".")[0] in FORBIDDEN
    }
    assert not offenders, f"engine/core imports I/O modules: {sorted(offenders)}"


def test_core_never_awaits() -> None:
    offenders = []
    for p in _core_files():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Await | ast.AsyncFunctionDef | ast.AsyncFor | ast.AsyncWith):
                offenders.append(f"{p.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, f"engine/core must not await: {offenders}"


def test_engine_never_imports_adapters_statically() -> None:
    offenders = []
    for p in sorted(ENGINE.rglob("*.py")):
        if p.name == "cli.py" and p.parent == ENGINE:
            continue  # the command line is the public face that may wire both
        for name in _imports(p):
            if name.startswith(("callgate.adapters", "adapters")):
                offenders.append(f"{p.relative_to(ROOT)}: {name}")
    assert not offenders, offenders


def test_checker_catches_a_forbidden_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import socket\nfrom time import monotonic\n")
    assert {"socket", "time"} <= _imports(bad)
