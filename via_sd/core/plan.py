"""The tier rule and the round plan, in plain Python (no torch: viz and the what-if use them too).

`tier_of` sorts one draft into a tier from its confidence, and `sort_tiers` a round's drafts (a forced round closes
tier A): a change to how VIA-SD sorts draft tokens touches them and nothing else. `plan_round`: given the tier each
draft was sorted into, which verifier reads which positions and who decides each draft. Pure functions (no torch),
used by the engine running a round (round.speculative_round), by the what-if replaying a recorded round under
other thresholds (viz/what_if.py) and by every count of verifier calls made from a trace.

A round has n drafts. A pass (start, stop) feeds the drafts up to drafts[:stop] (after whatever the
verifier has not yet seen: its lag) and scores draft positions start..stop-1, plus the position
after drafts[stop-1] (the bonus row when stop == n).

    slim signal  the slim pass scores every draft first (it sorts them); the tier-A and tier-B drafts
                 before the first tier-C draft are decided in order (A kept, B checked against q');
                 the full pass checks the first tier-C draft and every later draft.
    draft signal (or thresholds that fix every tier) the drafter's p(x) sorted the drafts, so the
                 leading tier-A drafts are kept with no verifier; a round with a tier-C draft runs the
                 full pass alone from the first draft that is not tier A (it decides tier B exactly, at
                 no extra cost); a round without one runs the slim pass up to the last tier-B draft.
A replacement ends the round: passes after it do not run. The bonus token comes from the last pass if
it scored the bonus row (a round all in tier A with no pass has no bonus).
"""

from __future__ import annotations

from dataclasses import dataclass

from .bounds import BOUNDS

DRAFT, SLIM, FULL = "draft", "slim", "full"
TIERS = (DRAFT, SLIM, FULL)
SIGNALS = ("slim", "draft")


@dataclass(frozen=True)
class Thresholds:
    """VIA-SD's two confidence thresholds, `0 <= escalate <= accept <= 1`.

    `signal` says whose confidence sorts a draft token into a tier:
    "slim"  -> r = q'(x) / max_v q'(v), the slim verifier's relative confidence (the paper's rule;
               the slim pass runs every round);
    "draft" -> r = p(x), the drafter's own probability (tier A then needs no verifier).
    A threshold of 1 admits nothing: accept=1 sends no draft to tier A, and accept=escalate=1
    sends every draft to tier C, which is plain speculative decoding (lossless).
    The defaults are the paper preset (THRESHOLD_PRESETS["paper"]).
    """

    accept: float = 0.5
    escalate: float = 0.3
    signal: str = "slim"

    def __post_init__(self):
        if self.signal not in SIGNALS:
            raise ValueError(f"signal must be one of {SIGNALS}, got {self.signal!r}")
        for name in ("accept", "escalate"):
            if not BOUNDS[name].allows(getattr(self, name)):
                raise ValueError(f"threshold {name}={getattr(self, name)!r} must be {BOUNDS[name].allowed} "
                                 "(not a bool)")
        if self.escalate > self.accept:
            raise ValueError(
                f"thresholds out of order: escalate={self.escalate} is above accept={self.accept}; "
                "need 0 <= escalate <= accept <= 1"
            )

    @classmethod
    def preset(cls, name: str) -> "Thresholds":
        """A named setting: "paper" (the paper's rule), "fastest" (measured), "lossless" (plain SD)."""
        if name not in THRESHOLD_PRESETS:
            raise ValueError(f"unknown threshold preset {name!r}: use one of {', '.join(THRESHOLD_PRESETS)}")
        return THRESHOLD_PRESETS[name]

    @property
    def fixed_tier(self) -> str | None:
        """The tier of every draft when the thresholds alone decide it (then no signal is needed)."""
        if self.escalate >= 1.0:
            return FULL
        if self.accept <= 0.0:
            return DRAFT
        return None

    def to_dict(self) -> dict:
        return {"accept": float(self.accept), "escalate": float(self.escalate), "signal": self.signal}


# Chosen on the tuning prompts (assets/prompts/tuning.jsonl, `python -m via_sd bench --sweep`) and reported on the held-out
# ones, which no threshold was chosen on (benchmarks/cost_targets.py); the figures are in BENCHMARKS.md:
# paper    = the paper's rule, the slim signal with every tier in use (the thresholds both public
#            reimplementations use);
# fastest  = the draft signal, no tier B: the fastest point whose agreement with the full model on the tuning
#            prompts is at least 0.96 (0.95, plus a margin for the spread between prompt sets);
# lossless = every draft to tier C (equals plain SD token for token).
THRESHOLD_PRESETS: dict[str, Thresholds] = {
    "paper": Thresholds(accept=0.5, escalate=0.3, signal="slim"),
    "fastest": Thresholds(accept=0.7, escalate=0.7, signal="draft"),
    "lossless": Thresholds(accept=1.0, escalate=1.0, signal="draft"),
}


def tier_of(confidence: float, thresholds: Thresholds) -> str:
    """Tier A (`draft`) if r >= accept, tier B (`slim`) if escalate <= r < accept, else tier C (`full`);
    a threshold of 1 admits nothing, so accept = escalate = 1 is plain SD."""
    if confidence >= thresholds.accept and thresholds.accept < 1.0:
        return DRAFT
    if confidence >= thresholds.escalate and thresholds.escalate < 1.0:
        return SLIM
    return FULL


def sort_tiers(confidence: list, thresholds: Thresholds, forced: bool, slim_sorts: bool) -> list[str]:
    """The tier of each draft of a round from its confidence r (every draft's when the thresholds fix it); a forced
    round (`max_unverified`) closes tier A (force_verification)."""
    tiers = [thresholds.fixed_tier or tier_of(r, thresholds) for r in confidence]
    return force_verification(tiers, slim_sorts) if forced else tiers


@dataclass(frozen=True)
class RoundPlan:
    decide: tuple          # per draft: who decides it, "draft" (kept as drafted) | "slim" | "full"
    slim: tuple | None     # the slim pass (start, stop), or None
    full: tuple | None     # the full pass (start, stop), or None; it runs after the slim pass
    slim_sorts: bool       # the slim pass runs before any decision (its confidence sorted the drafts)

    @property
    def bonus(self) -> str | None:
        """Who adds the bonus token when no draft is replaced."""
        n = len(self.decide)
        if self.full is not None:
            return FULL
        if self.slim is not None and self.slim[1] == n:
            return SLIM
        return None


def slim_sorts(method: str, thresholds: Thresholds) -> bool:
    """Does the slim verifier's confidence sort a round's drafts into tiers (so its pass over every draft runs before
    any decision)? Only in VIA-SD under the slim signal, and not when the thresholds alone fix every tier."""
    return method == "via" and thresholds.signal == "slim" and thresholds.fixed_tier is None


def unverified_run(run: int, tokens) -> int:
    """How many tokens in a row have been kept with no verifier (what `max_unverified` bounds), after `tokens`
    ((tier, outcome) pairs, in order): a token a verifier decided ends the run, a tier-A token lengthens it, and a
    bonus token from the slim verifier checks nothing (it leaves the count as it is)."""
    for tier, outcome in tokens:
        if outcome != "bonus" or tier == FULL:
            run = run + 1 if tier == DRAFT else 0
    return run


def force_verification(tiers: list[str], slim_sorts: bool) -> list[str]:
    """A forced round (too many tokens in a row kept with no verifier): tier A is closed. Its drafts go to tier B
    when the slim verifier sorted them (its pass over them is paid for already), else to tier C: the full verifier
    reads those positions at its next call anyway, and a slim pass first would read them twice (past the split
    the slim verifier writes only positions the full one has not read, and the full one reads them again)."""
    to = SLIM if slim_sorts else FULL
    return [to if t == DRAFT else t for t in tiers]


def plan_round(tiers: list[str], slim_sorts: bool) -> RoundPlan:
    """The plan for drafts sorted into `tiers`; `slim_sorts`: the slim verifier's confidence sorted them (so its
    pass over every draft has already been paid for)."""
    n = len(tiers)
    first_full = tiers.index(FULL) if FULL in tiers else n
    if slim_sorts:
        decide = tuple(tiers[:first_full]) + (FULL,) * (n - first_full)
        return RoundPlan(decide, (0, n), (first_full, n) if first_full < n else None, True)
    lead = next((k for k, t in enumerate(tiers) if t != DRAFT), n)
    if lead == n:
        return RoundPlan(tuple(tiers), None, None, False)
    if first_full < n:
        return RoundPlan((DRAFT,) * lead + (FULL,) * (n - lead), None, (lead, n), False)
    last_slim = max(k for k, t in enumerate(tiers) if t == SLIM)
    return RoundPlan(tuple(tiers), (lead, last_slim + 1), None, False)
