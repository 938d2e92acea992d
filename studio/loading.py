"""A model load as a person follows it: a few named steps and one fraction that only rises.

The engine reports each part of a load on its own scale (the embedded wheels' unpacking runs 0 -> 1 per call,
`load_pair` restarts at 5% and 50% for each model, a cost profile counts its sweeps), and its messages name
cache folders on the server. `LoadProgress` hears those raw `(message, fraction)` events and keeps one line
for the page: which step of how many, the step's share of one bar that never goes back, and a detail with
no server path in it; each step and new event goes to the log. No gradio, no models.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

log = logging.getLogger("via_sd.app")


@dataclass(frozen=True)
class Step:
    name: str  # what a person reads: "unpacking the models"
    share: float  # its part of the bar (the shares of a load's steps are scaled to add up to 1)
    when: str = ""  # why it may be quick or skipped: "first start only"


# shares after first starts of the embedded pair on 2 busy cores (joining and checking the GGUF files ~26 s, then waiting
# for the kernel's compile ~9 s, building both int4 models ~25 s; BENCHMARKS.md, 2026-12-04)
UNPACK = Step("unpacking the models", 0.4, "first start only")
KERNEL = Step("building the kernel", 0.15, "first start only")
LOAD = Step("loading the models into memory", 0.4)
MEASURE = Step("measuring this machine", 0.15, "first start only")
WARM = Step("warming up", 0.05)

# words of the engine's messages -> the step they belong to (the first match wins)
_STEP_OF = ((UNPACK, ("joining part", "sha256", "unpacking the gguf", "its config and tokenizer",
                      "checking the saved folder", "cached at",
                      "ready at", "preparing it")),
            (LOAD, ("loading drafter", "loading verifier", "route", "provisional")),
            (MEASURE, ("measuring the cost profile",)),
            (WARM, ("warming up",)))
# a server path (absolute or ~), and the "at"/"in" that leads to it; hub ids such as Qwen/Qwen2.5 are not paths
_PATH = re.compile(r"(?:\s+(?:at|in|to|from))?\s*\(?(?<![\w.-])(?:~|/)\S*")  # "(/a/b.py)" goes whole


def step_of(message: str) -> Step | None:
    low = message.lower()
    return next((step for step, words in _STEP_OF if any(w in low for w in words)), None)


def without_paths(message: str) -> str:
    return _PATH.sub("", message).strip(" :")


def detail_of(step: Step, message: str) -> str:
    """The event's own words, where they add to the step's name: which model, which part, which sweep."""
    low = message.lower()
    if step is LOAD and low.startswith(("loading drafter", "loading verifier")):
        return "the drafter" if "drafter" in low.split()[1] else "the verifier"
    if step is UNPACK and ("cached at" in low or "ready at" in low):
        return message.split(":")[0] + ": ready"
    if step is UNPACK and "preparing it" in low:
        return message.split(":")[0] + ": another process is unpacking it; waiting for it"
    return "" if step is WARM else without_paths(message)


class LoadProgress:
    """The steps of one load and where it stands. `start(step)` when the loader begins a step itself; `hear(message,
    fraction)` for every raw event. A step never goes back: an event of an earlier step (the engine re-checks
    an unpacked model while it loads it) leaves the bar alone."""

    def __init__(self, steps: list[Step] | tuple[Step, ...]):
        total = sum(s.share for s in steps) or 1.0
        self.steps = tuple(steps)
        self._starts, at = {}, 0.0
        for s in self.steps:
            self._starts[s] = (at, s.share / total)
            at += s.share / total
        self.current: Step | None = None
        self.fraction = 0.0
        self.detail = self._heard = ""

    def start(self, step: Step) -> None:
        log.info("loading: %s", step.name)  # the log's clock says when each step began (scripts/space_start.py)
        self._move(step, 0.0, "")

    def hear(self, message: str, fraction: float) -> None:
        if message != self._heard:  # each new event once (which model, which part), not every fraction of it
            log.info("loading: %s", message)
            self._heard = message
        step = step_of(message) or self.current
        if step is None or step not in self._starts:
            return
        self._move(step, fraction, detail_of(step, message))

    def _move(self, step: Step, fraction: float, detail: str) -> None:
        if step not in self._starts:
            return
        order = self.steps.index
        if self.current is not None and order(step) < order(self.current):
            return  # an earlier step's echo
        if step is not self.current:
            self.current, self.detail = step, ""
        lo, share = self._starts[step]
        f = min(max(float(fraction), 0.0), 1.0) if fraction == fraction else 0.0
        self.fraction = max(self.fraction, lo + share * f)
        self.detail = detail or self.detail

    def line(self) -> str:
        """"step 1 of 4: unpacking the models (first start only) · Qwen2.5-Coder-0.5B: joining part 2/6"."""
        if self.current is None:
            return "starting"
        step = self.current
        text = f"step {self.steps.index(step) + 1} of {len(self.steps)}: {step.name}"
        text += f" ({step.when})" if step.when else ""
        return f"{text} · {self.detail}" if self.detail else text
