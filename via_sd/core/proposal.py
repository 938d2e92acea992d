"""What a drafter is: two methods, in the spirit of transformers' `CandidateGenerator`.

    drafter.propose(context, limit) -> Proposal   up to `limit` tokens that may follow `context` (the sequence so
                                                  far: prompt and output), and who drafted them; `limit` 0: the
                                                  round drafts nothing (AR, or SD's round that reads the prompt),
                                                  but the drafter still takes its turn (prompt lookup searches)
    drafter.update(outcome: Outcome)              what became of the round, whoever drafted it

A drafter is built with its config, the cost model (the pair's cost profile and the run's RoundCost) and what it
drafts with (a model's cache reader, the run's Sampler), never with the decoder. Besides the two methods it names
itself (`name`, the trace's drafter_kind) and the profile its forwards are priced with (`costs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Proposal:
    """A round's drafts: `source` who drafted them ("model", "lookup" or "early-exit"; None: no drafts, the round is
    an AR step), `gamma` how many were asked for (the drafter may stop early), `tokens`, and their distributions
    `p` [n, V], or None where the drafter has none (prompt lookup: the round then takes p one-hot, so sampled SD stays
    exact: x is kept with probability q(x), else a token is drawn from q without x)."""

    source: str | None = None
    gamma: int = 0
    tokens: list[int] = field(default_factory=list)
    p: torch.Tensor | None = None


NO_DRAFTS = Proposal()


@dataclass
class Outcome:
    """What a round did with a proposal: who drafted (None: nobody), the drafts kept before the first rejection,
    whether one was rejected, the tier each draft was sorted into, how far the full verifier lagged behind when it
    ran (None when it did not), and the tokens the round emitted from sequence length `start`."""

    source: str | None
    kept: int
    rejected: bool
    tiers: list
    lag: int | None
    start: int
    emitted: list[int]
