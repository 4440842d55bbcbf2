"""Benchmark-suite hooks: print each group's rows with their ratio to the group baseline.

Owns only the end-of-run summary of the rows recorded through ``bench.harness.record``;
it adds no fixtures and changes no benchmark.
"""

from __future__ import annotations

from typing import Any

from bench.harness import ROWS, format_summary


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not ROWS:
        return
    terminalreporter.section("callgate decode: ratio to the group baseline (time per event)")
    for line in format_summary(ROWS):
        terminalreporter.write_line(line)
