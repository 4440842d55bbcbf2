"""Benchmark-suite hooks: print each group's rows with their ratio to the group baseline.

Owns only the end-of-run summary of the rows recorded through ``bench.harness.record``
and the machine's load average at the start of the run (in the JSON's ``machine_info``,
so a report rendered later shows the load the run had); it adds no fixtures and changes
no benchmark.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from bench.harness import ROWS, format_summary


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not ROWS:
        return
    terminalreporter.section("callgate decode: ratio to the group baseline (time per event)")
    for line in format_summary(ROWS):
        terminalreporter.write_line(line)


def pytest_benchmark_update_machine_info(config: Any, machine_info: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # not every platform has it
        machine_info["loadavg"] = [round(x, 2) for x in os.getloadavg()]
