"""Benchmark inputs: prompt files (JSON lines {task, prompt}) and sweep grids ("accept=0.3:0.9:0.1")."""

from __future__ import annotations

import json
import math
from pathlib import Path

DEFAULT_PROMPTS = Path(__file__).resolve().parent.parent.parent / "assets" / "prompts" / "mixed.jsonl"


def load_prompts(path, tasks=None, limit: int | None = None) -> list[dict]:
    """JSON lines {"task": ..., "prompt": ...}; a bad line is a ValueError naming its number."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"prompt file {path} does not exist")
    prompts = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}, line {n}: not valid JSON ({err.msg})") from None
        if not isinstance(item, dict):
            raise ValueError(f'{path}, line {n}: expected an object {{"task": "...", "prompt": "..."}}')
        for key in ("task", "prompt"):
            if not isinstance(item.get(key), str) or not item[key].strip():
                raise ValueError(f'{path}, line {n}: "{key}" must be a non-empty string')
        prompts.append({"task": item["task"], "prompt": item["prompt"], "line": n})
    if tasks:
        prompts = [p for p in prompts if p["task"] in set(tasks)]
    if limit:
        prompts = prompts[:limit]
    if not prompts:
        raise ValueError(f"{path} holds no prompts" + (f" for tasks {', '.join(tasks)}" if tasks else ""))
    return prompts


def as_prompts(prompts) -> list[dict]:
    out = [{"task": "default", "prompt": p} if isinstance(p, str) else dict(p) for p in prompts]
    if not out:
        raise ValueError("no prompts to benchmark")
    return out


def parse_values(text: str) -> list[float]:
    """"0.3:0.9:0.1" (inclusive range), "0.5" or "0.2|0.5|0.8" -> a list of floats."""
    if ":" in text:
        parts = text.split(":")
        if len(parts) != 3:
            raise ValueError(f"range {text!r}: write start:stop:step, e.g. 0.3:0.9:0.1")
        start, stop, step = map(float, parts)
        if step <= 0 or stop < start:
            raise ValueError(f"range {text!r}: need start <= stop and a positive step")
        return [round(start + k * step, 6) for k in range(int(math.floor((stop - start) / step + 1e-9)) + 1)]
    return [float(v) for v in text.split("|")]


def parse_grid(spec: str) -> dict[str, list[float]]:
    """"accept=0.3:0.9:0.1,escalate=0.0:0.6:0.1" -> {"accept": [...], "escalate": [...]}."""
    grid = {}
    for part in spec.split(","):
        name, sep, values = part.partition("=")
        if not sep or name.strip() not in ("accept", "escalate"):
            raise ValueError(f"sweep part {part!r}: write accept=START:STOP:STEP or escalate=...")
        grid[name.strip()] = parse_values(values.strip())
    for name, values in grid.items():
        if any(not 0.0 <= v <= 1.0 for v in values):
            raise ValueError(f"sweep {name} values must lie in [0, 1], got {values}")
    return grid
