"""A measurement cut into jobs that workers share, without Ray: the groups of paired runs, the run log that
streams every finished group into the bench JSON (written atomically) and resumes from it, and the progress line.

A group is every run that a ratio compares: each method (or plain SD and each sweep point) on one prompt in one
repeat, in the local bench's rotated order. A worker runs a group back to back, so its ratios divide speeds
measured on one machine a moment apart, as on one machine.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .run import rotated


def plan_groups(n_prompts: int, repeats: int, labels: list[str]) -> list[dict]:
    """Every (repeat, prompt) group with its labels in the local bench's order (rotated per prompt and repeat)."""
    return [{"repeat": rep, "prompt_index": i, "labels": rotated(list(labels), rep * n_prompts + i)}
            for rep in range(repeats) for i in range(n_prompts)]


def write_json(path: Path, doc: dict) -> None:
    """Writes `doc` to `path` atomically: a reader (or a crash) sees the old file or the new one, never half."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, path)


class RunLog:
    """The runs of one measurement so far, mirrored in its JSON file after every group.

    `plan` names the measurement (pair, config, prompts, labels, repeats); a file that holds the same plan is
    resumed (its finished groups are skipped), one with another plan is refused. `meta` keeps what a report needs
    besides the runs (machines, models, sweep points), so a finished file reports again without a worker.
    `path=None` keeps the log in memory only.
    """

    def __init__(self, path, plan: dict, label: str):
        self.path, self.label = (Path(path) if path else None), label
        self.plan = json.loads(json.dumps(plan))  # as it reads back from the file (lists, not tuples)
        self.runs, self.meta = [], {}
        if self.path is not None and self.path.exists():
            self._resume()

    def _resume(self) -> None:
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ValueError(f"--json {self.path}: not a bench JSON to resume ({err}): name another file") from None
        old = doc.get("plan") if isinstance(doc, dict) else None
        if old != self.plan:
            differ = sorted(k for k in set(self.plan) | set(old or {}) if (old or {}).get(k) != self.plan.get(k))
            raise ValueError(f"--json {self.path} holds another measurement (its {', '.join(differ) or 'plan'} "
                             "differ): name another file, or delete it to start again")
        self.runs, self.meta = doc["runs"], doc.get("meta", {})

    def done(self) -> set[tuple]:
        """(repeat, prompt index) of every group whose runs are all in the log."""
        labels = sorted(self.plan["labels"])
        seen: dict[tuple, list] = {}
        for r in self.runs:
            seen.setdefault((r["repeat"], r["prompt_index"]), []).append(r[self.label])
        return {k for k, v in seen.items() if sorted(v) == labels}

    def add(self, runs: list[dict]) -> None:
        """One finished group: its runs get the next `order` numbers, and the file is rewritten."""
        start = max((r["order"] for r in self.runs), default=-1) + 1
        for k, r in enumerate(runs):
            r["order"] = start + k
        self.runs.extend(runs)
        self.write()

    def finish(self, result: dict) -> dict:
        """The finished result, with the plan and meta (so a rerun on its file finds nothing left), written."""
        result.update(plan=self.plan, meta=self.meta)
        self.write(result)
        return result

    def write(self, doc: dict | None = None) -> None:
        """The file: `doc`, or the runs so far."""
        if self.path is not None:
            write_json(self.path, doc or {"schema": "via-sd-bench/1", "kind": f"{self.plan['kind']}-partial",
                                          "plan": self.plan, "meta": self.meta, "runs": self.runs})


class ProgressLine:
    """One line a person reads: runs done / total, each worker's rate, and the time left at those rates."""

    def __init__(self, total: int, done: int, report):
        self.total, self.done, self.report = total, done, report
        self.started, self.by_worker = time.monotonic(), {}

    def ran(self, worker: str, runs: int) -> None:
        self.done += runs
        self.by_worker[worker] = self.by_worker.get(worker, 0) + runs
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rates = {w: n / elapsed for w, n in self.by_worker.items()}
        left = (self.total - self.done) / sum(rates.values())
        each = ", ".join(f"{w} {r * 60:.1f}/min" for w, r in sorted(rates.items()))
        self.report(f"{self.done}/{self.total} runs, {len(rates)} worker(s) ({each}), "
                    f"about {_duration(left)} left", self.done / self.total)


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m" if seconds >= 3600 else \
        f"{seconds // 60}m {seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
