"""The tier rule and the acceptance / residual-sampling rules, as pure functions.

A change to how VIA-SD sorts draft tokens touches `tier_of` and nothing else.

What each tier does with a draft token x (drafted from p):
  A `draft`: kept as drafted; no verifier sees it (not exact).
  B `slim`:  the standard speculative check of x against the slim verifier q' (`verify_draft`):
             greedy keeps x iff x = argmax q', else emits argmax q' (regeneration); sampling keeps x
             with probability min(1, q'(x)/p(x)), else emits a sample of norm(max(0, q' - p)), so the
             token follows q' exactly (not q: not exact).
  C `full`:  the same check against the full verifier q, for x and every later draft: exact (greedy:
             the full model's own choice; sampling: follows q).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

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
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValueError(f"threshold {name}={value!r} must be a number in [0, 1] (not a bool)")
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


# Picked by a measured sweep on the embedded pair (int4 weights, route embedded-default, gamma 5, 32 tokens,
# the held-out prompts; command and table in BENCHMARKS.md, scripts/preset_sweep.py):
# paper    = the slim signal, fastest slim-signal point with every tier >= 5% (0.80-0.87x plain SD, agreement
#            0.89; tiers 74/12/14%); these are also the thresholds both public reimplementations use. On this
#            1.5B CPU verifier a slim pass costs ~0.85 of a full one, so the paper's rule cannot beat SD here.
# fastest  = the fastest point at >= 0.95 full-model agreement: the draft signal, no tier B
#            (1.03-1.12x plain SD, agreement 0.97);
# lossless = every draft to tier C (equals plain SD token for token).
THRESHOLD_PRESETS: dict[str, Thresholds] = {
    "paper": Thresholds(accept=0.5, escalate=0.3, signal="slim"),
    "fastest": Thresholds(accept=0.6, escalate=0.6, signal="draft"),
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


def relative_confidence(probs: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """r = q(x) / max_v q(v) for each row of `probs` and its token x (1.0 when x is the top choice).

    Returns (r, q(x), top choice) per row."""
    q_x = probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    q_max, top = probs.max(-1)
    return q_x / q_max, q_x, top


def logits_to_probs(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """Next-token distribution in fp32. Greedy decoding (temperature 0) reports the plain softmax."""
    logits = logits.float()
    if temperature > 0:
        logits = logits / temperature
    probs = torch.softmax(logits, dim=-1)
    if temperature > 0 and top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True, dim=-1)
        outside = sorted_probs.cumsum(-1) - sorted_probs > top_p  # keep the smallest prefix reaching top_p
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def pick(probs: torch.Tensor, greedy: bool, generator: torch.Generator | None) -> int:
    """The next token: argmax when greedy, else a sample (no host sync beyond the returned int)."""
    if greedy:
        return int(probs.argmax())
    return int(torch.multinomial(probs, 1, generator=generator))


def verify_draft(
    token: int,
    p: torch.Tensor,
    q: torch.Tensor,
    greedy: bool,
    generator: torch.Generator | None,
) -> tuple[bool, int]:
    """One speculative-decoding check of draft `token` (drafted from `p`) against verifier `q`.

    Greedy: keep x iff x = argmax q, else emit argmax q.
    Sampling (Leviathan et al.): keep x with probability min(1, q(x)/p(x)), else emit a sample of
    norm(max(0, q - p)); the output then follows q exactly.
    Returns (kept, emitted token).
    """
    if greedy:
        best = int(q.argmax())
        return best == token, best
    px, qx = float(p[token]), float(q[token])
    u = float(torch.rand((), generator=generator, device=generator.device if generator else "cpu"))
    if px > 0 and u < min(1.0, qx / px):
        return True, token
    residual = torch.clamp(q - p, min=0.0)
    total = residual.sum()
    if float(total) <= 0:  # q == p everywhere: the draft would have been kept
        return True, token
    return False, int(torch.multinomial(residual / total, 1, generator=generator))
