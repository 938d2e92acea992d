"""The teacher-forced pass: the verifier run sub-layer by sub-layer over fixed texts, compared with its full self."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch

from ..core.routing import Route, SlimVerifier
from .calibrate import Calibration


@dataclass
class Pass:
    """One teacher-forced pass under a route: its distance from the full verifier and, if recorded,
    the hidden state entering every sub-layer (per sequence)."""

    skip: frozenset
    kl: float
    agreement: float
    states: list | None = None


class TeacherForced:
    """The verifier run sub-layer by sub-layer over fixed texts, compared with its full self.

    Every pass is the slim verifier's own forward (`SlimVerifier.run`, the one the engine decodes with)
    with the candidate's sub-layers skipped, so route search measures the network that will run."""

    def __init__(self, verifier, texts: Calibration):
        n = verifier.config.num_hidden_layers
        self.view = SlimVerifier(verifier, Route("none", (), n))  # the verifier's modules, in order
        self.num_layers, self.texts = n, texts
        self.inputs = [self._prepare(seq, start) for seq, start in zip(texts.sequences, texts.starts)]
        self.full_logp = None
        self.full_logp = self.log_probs(frozenset())
        self.full_p = self.full_logp.exp()
        self.full_top1 = self.full_logp.argmax(-1)

    @torch.inference_mode()
    def _prepare(self, seq: list[int], start: int) -> SimpleNamespace:
        h = self.view.embed(torch.tensor([seq]))
        # logits at position t predict token t+1: the scored tokens start..end are predicted from start-1..end-1
        return SimpleNamespace(h=h, scored=torch.arange(start - 1, len(seq) - 1))

    def log_probs(self, skip) -> torch.Tensor:
        """Log-probabilities at every scored position with the sub-layers `skip` skipped, [tokens, V]."""
        return self._log_probs(frozenset(skip), 0, None, record=False)[0]

    @torch.inference_mode()
    def _log_probs(self, skip: frozenset, start: int, base: Pass | None, record: bool):
        """Runs sub-layers start.. (skipping `skip`) from base's recorded state; log-probs at the scored positions."""
        view, finals, states = self.view, [], []
        for i, x in enumerate(self.inputs):
            h = base.states[i][start] if start else x.h
            seq_states = list(base.states[i][:start]) if record and start else []
            h = view.run(h, 0, None, range(start, 2 * self.num_layers), skip, seq_states if record else None)
            finals.append(h[0, x.scored.to(h.device)])
            states.append(seq_states)
        logits = view.head(torch.cat([f.to(finals[0].device) for f in finals])[None])[0]
        logp = torch.log_softmax(logits.float(), dim=-1)
        if self.full_logp is not None:
            logp = logp.to(self.full_logp.device)
        return logp, (states if record else None)

    def evaluate(self, skip, start: int = 0, base: Pass | None = None, record: bool = False) -> Pass:
        """KL(full || slim) and top-1 agreement under a route that skips `skip` (sub-layer indices).

        With `base` (a recorded pass whose route agrees with `skip` before sub-layer `start`), the pass
        resumes from base's hidden state entering `start` instead of recomputing the shared prefix.
        """
        skip = frozenset(skip)
        if start and (base is None or base.states is None):
            raise ValueError("resuming a pass at a sub-layer needs a recorded base pass")
        logp, states = self._log_probs(skip, start, base, record)
        # tokens the full verifier never picks (p = 0, e.g. a masked logit) add nothing, not 0 * inf
        kl = float(torch.where(self.full_p > 0, self.full_p * (self.full_logp - logp), 0.0).sum(-1).mean())
        agreement = float((logp.argmax(-1) == self.full_top1).float().mean())
        return Pass(skip, kl, agreement, states)
