"""Run callgate's fuzz targets and report executions, coverage and findings per target.

    python fuzz/run.py --seconds N [--seed S] [--target NAME ...] [--runs R] [--streaming]
                       [--merge [--keep K]] [--max-len L]

Each target runs in its own subprocess (``python -m fuzz.targets.<name>``, atheris over
libFuzzer) with an equal share of ``N`` seconds (``-max_total_time``) or ``-runs=R``
executions, seeded from ``fuzz/corpus/<name>/`` (read only); inputs it finds go to
``build/fuzz/corpus/<name>/`` (``--merge`` folds the coverage-increasing ones back into
``fuzz/corpus/``). A crash (an invariant violation or an undocumented exception) is saved
by libFuzzer to ``fuzz/findings/<name>/``; this script then writes a minimized
reproducer (``.min``) and the failure (``.txt``) beside it. The exit status is 1 when
any target found something. Logs and a JSON summary go to ``build/fuzz/logs/<run>/``
(the summary also to ``build/fuzz/last-run.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
import subprocess
import sys
import time
import traceback
from importlib import import_module
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make ``fuzz`` importable
    sys.path.insert(0, str(ROOT))

from fuzz.minimize import failure_signature, minimize  # noqa: E402

PROVIDERS = ("openai_chat", "openai_responses", "anthropic", "gemini", "gemini_interactions")
# name -> libFuzzer -max_len. Streams keep room for the largest recorded fixture (51 KB).
TARGETS: dict[str, int] = {
    "sse_decoder": 65536,
    **{f"adapter_{p}": 65536 for p in PROVIDERS},
    "accumulator": 4096,
    **{f"decode_{p}": 65536 for p in PROVIDERS},
    "arguments": 4096,
    "canonical": 1024,
    "diff_sdk": 131072,
}
STREAMING = tuple(t for t in TARGETS if t not in ("arguments", "canonical", "diff_sdk"))
CORPUS = ROOT / "fuzz" / "corpus"
FINDINGS = ROOT / "fuzz" / "findings"
WORK = ROOT / "build" / "fuzz"
RUN_ID = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
_UNIT = re.compile(r"Test unit written to (\S+)")
_STATUS = re.compile(r"^#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)")
_STAT = re.compile(r"^stat::(\w+):\s+(\d+)")


def _launcher(name: str) -> Path:
    """An executable that starts the target, for libFuzzer's re-executions (-merge)."""
    path = WORK / "bin" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f'#!/bin/sh\ncd "{ROOT}" && exec "{sys.executable}" -m fuzz.targets.{name} "$@"\n'
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _command(name: str, flags: list[str], dirs: list[Path]) -> list[str]:
    return [sys.executable, "-m", f"fuzz.targets.{name}", *flags, *map(str, dirs)]


def _environment(name: str) -> dict[str, str]:
    env = dict(os.environ)
    env["CALLGATE_FUZZ_LAUNCHER"] = str(_launcher(name))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _parse(output: str) -> dict[str, Any]:
    result: dict[str, Any] = {"execs": 0, "cov": 0, "ft": 0, "corpus": 0, "units": []}
    for line in output.splitlines():
        status = _STATUS.match(line)
        if status:
            result["execs"] = int(status.group(1))
            result["cov"], result["ft"], result["corpus"] = map(int, status.group(2, 3, 4))
        stat_line = _STAT.match(line)
        if stat_line:
            result[stat_line.group(1)] = int(stat_line.group(2))
        unit = _UNIT.search(line)
        if unit:
            result["units"].append(unit.group(1))
    if "number_of_executed_units" in result:
        result["execs"] = result["number_of_executed_units"]
    return result


def _explain(name: str, artifact: Path) -> str:
    """Write ``<artifact>.min`` and ``<artifact>.txt``; return the failure's signature."""
    check = import_module(f"fuzz.targets.{name}").check
    data = artifact.read_bytes()
    signature = failure_signature(check, data) or "does not reproduce in-process"
    small = minimize(check, data)
    artifact.with_name(artifact.name + ".min").write_bytes(small)
    try:
        check(small)
        detail = "(the minimized input passes)"
    except Exception:
        detail = traceback.format_exc()
    artifact.with_name(artifact.name + ".txt").write_text(
        f"target: {name}\nsignature: {signature}\ninput bytes: {len(data)}, "
        f"minimized: {len(small)}\n\n{detail}"
    )
    return signature


def run_target(name: str, args: argparse.Namespace, seconds: int) -> dict[str, Any]:
    seeds = CORPUS / name
    work = WORK / "corpus" / name
    findings = FINDINGS / name
    for folder in (seeds, work, findings):
        folder.mkdir(parents=True, exist_ok=True)
    flags = [
        f"-max_len={args.max_len or TARGETS[name]}",
        f"-artifact_prefix={findings}/",
        "-print_final_stats=1",
        "-timeout=20",
        "-rss_limit_mb=2048",
    ]
    flags.append(f"-runs={args.runs}" if args.runs else f"-max_total_time={seconds}")
    if args.seed is not None:
        flags.append(f"-seed={args.seed}")
    # One log directory per invocation: concurrent runs must not share (truncate) logs.
    log = WORK / "logs" / RUN_ID / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.run(
            _command(name, flags, [work, seeds]),
            cwd=ROOT,
            env=_environment(name),
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    elapsed = time.monotonic() - started
    result = _parse(log.read_text(errors="replace"))
    result.update(target=name, seconds=round(elapsed, 1), returncode=proc.returncode)
    result["exec_per_sec"] = round(result["execs"] / elapsed) if elapsed else 0
    result["findings"] = []
    for unit in result.pop("units"):
        path = Path(unit) if Path(unit).is_absolute() else ROOT / unit
        if path.exists():
            result["findings"].append(
                {"file": str(path.relative_to(ROOT)), "signature": _explain(name, path)}
            )
    if proc.returncode != 0 and not result["findings"]:
        result["findings"].append({"file": str(log.relative_to(ROOT)), "signature": "exit"})
    if args.merge:
        _merge(name, seeds, work, args.keep)
    return result


def _merge(name: str, seeds: Path, work: Path, keep: int) -> None:
    """Fold the inputs that add coverage from the work corpus into ``fuzz/corpus``, then
    keep only the ``keep`` smallest merged files (seeds and regressions always stay), so
    the repository and the replay test stay small."""
    subprocess.run(
        _command(name, [f"-max_len={TARGETS[name]}", "-merge=1"], [seeds, work]),
        cwd=ROOT,
        env=_environment(name),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    merged = sorted(
        (p for p in seeds.iterdir() if not p.name.startswith(("seed-", "regress-"))),
        key=lambda p: (p.stat().st_size, p.name),
    )
    for path in merged[keep:]:
        path.unlink(missing_ok=True)  # a concurrent merge may have removed it already


def _table(results: list[dict[str, Any]]) -> str:
    lines = [
        f"{'target':30} {'execs':>10} {'exec/s':>7} {'cov':>5} {'ft':>6} {'corpus':>6}  findings",
    ]
    for r in results:
        found = "; ".join(f"{f['file']} ({f['signature']})" for f in r["findings"]) or "none"
        lines.append(
            f"{r['target']:30} {r['execs']:>10} {r['exec_per_sec']:>7} {r['cov']:>5} "
            f"{r['ft']:>6} {r['corpus']:>6}  {found}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=600, help="total time for all targets")
    parser.add_argument("--seed", type=int, default=None, help="libFuzzer -seed")
    parser.add_argument("--target", action="append", choices=sorted(TARGETS), default=None)
    parser.add_argument("--runs", type=int, default=0, help="-runs per target instead of time")
    parser.add_argument("--merge", action="store_true", help="fold new coverage into corpus")
    parser.add_argument("--keep", type=int, default=100, help="merged files kept per target")
    parser.add_argument("--max-len", type=int, default=0, help="override -max_len")
    parser.add_argument("--streaming", action="store_true", help="only the streaming targets")
    args = parser.parse_args(argv)
    names = args.target or list(STREAMING if args.streaming else TARGETS)
    share = max(2, args.seconds // len(names))
    results = []
    for name in names:
        result = run_target(name, args, share)
        print(_table([result]).splitlines()[-1], flush=True)
        results.append(result)
    print()
    print(_table(results))
    report = json.dumps({"run": RUN_ID, "argv": sys.argv[1:], "results": results}, indent=2)
    (WORK / "logs" / RUN_ID / "summary.json").write_text(report)
    (WORK / "last-run.json").write_text(report)
    return 1 if any(r["findings"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
