"""Shared helpers for the operator CLI tests: run ``python -m callgate.engine.cli`` as real
subprocesses (side by side, none may end in a traceback) and read their JSON output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "callgate.engine.cli"]


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CALLGATE_STORE"}
    env.update(extra)
    return env


def run_all(
    *argvs: Sequence[str], env: dict[str, str] | None = None, cwd: Path = ROOT
) -> list[subprocess.CompletedProcess[str]]:
    """Run independent CLI invocations side by side (each a fresh process); none may end
    in a traceback."""
    procs = [
        subprocess.Popen(
            [*CLI, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
            env=env if env is not None else cli_env(),
        )
        for argv in argvs
    ]
    done = []
    for argv, proc in zip(argvs, procs, strict=True):
        out, err = proc.communicate(timeout=120)
        assert "Traceback" not in err, err
        done.append(subprocess.CompletedProcess([*CLI, *argv], proc.returncode, out, err))
    return done


def parsed(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)
