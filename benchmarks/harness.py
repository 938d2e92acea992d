"""What every benchmark shares: one prompt loader, one paired-and-rotated run helper, one lock, and the command
line they all start from (a pair preset, a prompt file, how many prompts, tokens and passes)."""

from __future__ import annotations

import argparse
import fcntl
import os
import statistics
import sys
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = Path("/tmp/via-sd-heavy.lock")  # heavy work on a shared machine never overlaps (HELPERS' rule, CI's too)
HELD_PROMPTS = "assets/prompts/held_out.jsonl"


def parser(doc: str, prompts: str = HELD_PROMPTS, tokens: int = 64) -> argparse.ArgumentParser:
    """The options every benchmark takes; a benchmark adds its own."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--preset", default="embedded", help="the pair (random: the tiny random pair, for mechanics)")
    ap.add_argument("--prompts", default=prompts, help="JSON lines of {task, prompt}")
    ap.add_argument("--limit", type=int, default=0, help="the first N prompts only")
    ap.add_argument("--tokens", type=int, default=tokens, help="new tokens per run")
    ap.add_argument("--repeats", type=int, default=1, help="passes over the prompts (the order rotating on)")
    return ap


def prompts(args) -> list[dict]:
    """The prompts of `args.prompts` ({task, prompt, line}), the first `args.limit`, `args.repeats` times over."""
    from via_sd.bench.inputs import load_prompts

    return load_prompts(ROOT / args.prompts if not Path(args.prompts).is_absolute() else args.prompts,
                        limit=args.limit or None) * max(args.repeats, 1)


def paired(items: list[dict], settings: dict, run) -> list[dict]:
    """Every item runs every setting back to back, the order rotating from item to item (a drifting machine's speed
    falls on each setting alike): [{"i", "setting", **run(item, setting, config)}] in the order they ran."""
    from via_sd.bench.run import rotated

    rows = []
    for i, item in enumerate(items):
        for name in rotated(list(settings), i):
            rows.append({"i": i, "setting": name, **run(item, name, settings[name])})
    return rows


def by_item(rows: list[dict], setting: str) -> dict:
    return {r["i"]: r for r in rows if r["setting"] == setting}


def paired_ratio(rows: list[dict], a: str, b: str, key: str = "tokens_per_s") -> float:
    """The median over items of setting a's `key` over setting b's, each pair measured back to back."""
    first, second = by_item(rows, a), by_item(rows, b)
    return statistics.median(first[i][key] / second[i][key] for i in first if second[i][key])


def vm(field: str, pid: int | str = "self") -> float:
    """GB (10^9 bytes) of a /proc/<pid>/status field (VmHWM = peak resident set, VmRSS = now); nan if gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024 / 1e9
    except OSError:
        pass
    return float("nan")


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def _held_above() -> bool:
    """Does this process, or one it runs under (`flock LOCK python -m benchmarks.x`), hold the lock already?"""
    try:
        inode = os.stat(LOCK).st_ino
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return False
    holders = {int(parts[4]) for parts in (line.split() for line in lines)
               if len(parts) > 5 and parts[1] != "->" and parts[5].endswith(f":{inode}")}
    return bool(holders & _ancestors())


@contextmanager
def heavy():
    """Holds LOCK while a benchmark measures (waits for whoever holds it), unless a process above this one does."""
    if _held_above():
        yield
        return
    with open(LOCK, "a") as f:
        print(f"waiting for {LOCK} ...", file=sys.stderr, flush=True)
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def run_main(main) -> None:
    """A benchmark's entry point: main(sys.argv[1:]) under the lock; exits with its status."""
    with heavy():
        sys.exit(main(sys.argv[1:]))
