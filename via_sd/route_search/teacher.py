"""The teacher-forced pass: the verifier run sub-layer by sub-layer over fixed texts, compared with its full self."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from ..routing import Route, SlimVerifier
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
    """The verifier run sub-layer by sub-layer over fixed texts, compared with its full self."""

    def __init__(self, verifier, texts: Calibration):
        n = verifier.config.num_hidden_layers
        self.view = SlimVerifier(verifier, Route("none", (), n))  # the verifier's modules, in order
        self.num_layers, self.texts = n, texts
        self.inputs = [self._prepare(seq, start) for seq, start in zip(texts.sequences, texts.starts)]
        self.full_logp = None
        self.full_logp = self._log_probs(frozenset(), 0, None, record=False)[0]
        self.full_p = self.full_logp.exp()
        self.full_top1 = self.full_logp.argmax(-1)

    @torch.inference_mode()
    def _prepare(self, seq: list[int], start: int) -> SimpleNamespace:
        view = self.view
        h = view.base.embed_tokens(torch.tensor([seq], device=view.device))
        position_ids = torch.arange(len(seq), device=h.device).unsqueeze(0)
        mask_kwargs = dict(config=view.config, inputs_embeds=h, attention_mask=None, past_key_values=None,
                           position_ids=position_ids)
        masks = {"full_attention": create_causal_mask(**mask_kwargs)}
        if "sliding_attention" in view.layer_types:
            masks["sliding_attention"] = create_sliding_window_causal_mask(**mask_kwargs)
        # logits at position t predict token t+1: the scored tokens start..end are predicted from start-1..end-1
        return SimpleNamespace(h=h, masks=masks, position_ids=position_ids,
                               position_embeddings=view.base.rotary_emb(h, position_ids),
                               scored=torch.arange(start - 1, len(seq) - 1, device=h.device))

    def _sublayer(self, k: int, h: torch.Tensor, x: SimpleNamespace) -> torch.Tensor:
        view, layer = self.view, self.view.base.layers[k // 2]
        h = h.to(layer.input_layernorm.weight.device)  # layers may sit on several GPUs
        if k % 2:
            return view._mlp(layer, h)
        return view._attention(layer, h, attention_mask=x.masks[view.layer_types[k // 2]],
                               position_ids=x.position_ids, past_key_values=None,
                               position_embeddings=tuple(t.to(h.device) for t in x.position_embeddings))

    @torch.inference_mode()
    def _log_probs(self, skip: frozenset, start: int, base: Pass | None, record: bool):
        """Runs sub-layers start.. (skipping `skip`) from base's recorded state; log-probs at the scored positions."""
        finals, states = [], []
        for i, x in enumerate(self.inputs):
            h = base.states[i][start] if start else x.h
            seq_states = list(base.states[i][:start]) if record and start else []
            for k in range(start, 2 * self.num_layers):
                if record:
                    seq_states.append(h)
                if k in skip:
                    continue
                h = self._sublayer(k, h, x)
            finals.append(h[0, x.scored.to(h.device)])
            states.append(seq_states)
        head = self.view.lm_head
        h = self.view.base.norm(torch.cat([f.to(self.view.base.norm.weight.device) for f in finals]))
        logp = torch.log_softmax(head(h.to(head.weight.device)).float(), dim=-1)
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
