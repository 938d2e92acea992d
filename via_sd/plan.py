"""The round plan: given the tier each draft was sorted into, which verifier reads which positions and
who decides each draft. One pure function (no torch), used by the engine running a round
(decoding.verify_via), by the what-if replaying a recorded round under other thresholds
(via_sd.replay) and by every count of verifier calls made from a trace.

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

DRAFT, SLIM, FULL = "draft", "slim", "full"


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


def force_verification(tiers: list[str]) -> list[str]:
    """A forced round (too many tokens in a row kept with no verifier): tier A is closed, its drafts go to tier B."""
    return [SLIM if t == DRAFT else t for t in tiers]


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
