"""Speculative sampling: the acceptance / residual-sampling rules, as pure functions (the tier rule itself,
`tier_of`, and the thresholds live in plan.py, importable without torch).

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

import torch


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


class Sampler:
    """A run's sampling: its temperature and top-p, greedy or not, and its one seeded generator, which the drafter
    and the verifiers draw from in turn (one stream of random numbers per run, so a seed replays a run)."""

    def __init__(self, config, device):
        self.temperature, self.top_p, self.greedy = config.temperature, config.top_p, config.greedy
        self.generator = torch.Generator(device=device).manual_seed(config.seed)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return logits_to_probs(logits, self.temperature, self.top_p)

    def pick(self, probs: torch.Tensor) -> int:
        return pick(probs, self.greedy, self.generator)

    def check(self, token: int, p: torch.Tensor, q: torch.Tensor) -> tuple[bool, int]:
        """(kept, emitted token): the speculative check of `token` drafted from p against q (verify_draft)."""
        return verify_draft(token, p, q, self.greedy, self.generator)
