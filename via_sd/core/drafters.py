"""The drafters behind the two-method interface (proposal.py): what proposes a round's tokens.

    model       the pair's small model
    lookup      prompt lookup (lookup.py): no model, c ~ 0
    hybrid      a prompt lookup and a model drafter composed: lookup when it has a match whose round is predicted to
                pay more than the model drafter's (each at its own acceptance in this run; with a fixed gamma: any
                match), else the model drafter, or an AR step where neither pays (a model drafter yet to read a long
                prompt)
    early-exit  the verifier's own first `exit_layer` layers, its final norm and head (self-speculation, as
                LayerSkip / transformers' `assistant_early_exit`); in SD its KV cache for those layers *is* the
                verifier's (progressive.ProgressiveVerifier split at the exit), and the verification pass resumes
                from the drafted positions' hidden states at the exit instead of recomputing them. In VIA-SD the
                slim and full verifier already share their trunk, so the early-exit drafter keeps its own cache.

Each sizes its rounds with the run's RoundCost (cost.model): with gamma="auto" the length the cost profile predicts
is fastest at the acceptance it has learned in this run; a model drafter in plain SD drafts while one more draft pays
at its own confidence in the chain. VIA-SD's `draft` signal sorts tokens by the drafter's own
probability: prompt lookup has none, so a lookup or hybrid drafter under that signal is refused (`check_signal`);
the `slim` signal works with every drafter.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..cost.model import MAX_GAMMA, CostProfile, Rates, RoundCost, worth_another
from .early_exit import EarlyExitNet, default_exit_layer, early_exit_verifier, exit_draft_ms, exit_layer_of
from .lookup import LOOKUP_NGRAM, LOOKUP_TOKENS, PromptLookup, lookup_ms
from .proposal import NO_DRAFTS, Outcome, Proposal
from .sampling import Sampler


def check_signal(drafter: str, method: str, signal: str) -> None:
    """VIA-SD's draft signal needs the drafter's probability of each token: prompt lookup has none."""
    if method == "via" and signal == "draft" and drafter in ("lookup", "hybrid"):
        raise ValueError(f"the drafter {drafter!r} proposes tokens without a probability, so VIA-SD's 'draft' signal "
                         "(which sorts tokens by the drafter's own p(x)) cannot sort them: use signal='slim' (the "
                         "paper's rule: the slim verifier's confidence), or drafter='model' / 'early-exit'")


class ModelDrafter:
    """A model that drafts one token a step through its cache: the pair's drafter, or the verifier's early exit."""

    def __init__(self, name: str, config, costs: CostProfile, round_cost: RoundCost, reader, sampler: Sampler):
        self.name, self.config, self.costs, self.round_cost = name, config, costs, round_cost
        self.reader, self.sampler = reader, sampler
        self.rates = Rates()

    def offer(self) -> tuple[int, float]:
        """(the round size that pays best now, its predicted tokens per ms), at this run's acceptance so far."""
        return self.round_cost.best(self.costs, self.rates)

    def propose(self, context: list[int], limit: int) -> Proposal:
        """Drafts one token a step. With gamma="auto" a greedy plain SD round (RoundCost "sd") goes on while one more
        draft pays at the drafter's own confidence in the chain (cost.model.worth_another), up to MAX_GAMMA: there a
        draft is kept iff it is the verifier's top-1, which the drafter's p(top-1) predicts. A sampled draft is kept
        with probability min(1, q(x) / p(x)), which p(x) does not predict (measured: BENCHMARKS.md, 2026-12-05), and
        VIA-SD's tiers price a round otherwise: those draft the length offer() prices. Each stops early once p(x)
        falls below config.draft_stop."""
        if not limit:
            return NO_DRAFTS
        by_confidence = self.config.auto_gamma and self.round_cost.kind == "sd" and self.sampler.greedy
        gamma, rate = self.offer() if self.config.auto_gamma else (self.config.gamma, 0.0)
        gamma = min(MAX_GAMMA if by_confidence else gamma, limit)
        tokens, dists, ext, chance = [], [], list(context), 1.0
        for _ in range(gamma):
            p = self.sampler.probs(self.reader.logits(ext, len(ext), 1)[0])
            token = self.sampler.pick(p)
            tokens.append(token)
            dists.append(p)
            ext.append(token)
            chance *= float(p[token])
            if float(p[token]) < self.config.draft_stop:  # an unsure drafter wastes the next drafts
                break
            if by_confidence and not worth_another(self.costs, self.rates, len(tokens), chance, rate):
                break
        return Proposal(self.name, len(tokens) if by_confidence else gamma, tokens, torch.stack(dists))

    def update(self, outcome: Outcome) -> None:
        """Its running acceptance, tier shares and verifier lag (a model drafter learns from its own rounds only)."""
        if outcome.source == self.name:
            self.rates.add(outcome.kept, outcome.rejected, outcome.tiers, outcome.lag)


class Hybrid:
    """Prompt lookup when it has a match that pays (with gamma="auto": that pays more than the model drafter's round
    at its own acceptance in this run), else the model drafter: the two composed, each learning on its own."""

    name = "hybrid"

    def __init__(self, config, lookup: PromptLookup, model: ModelDrafter, prompt_tokens: int):
        self.config, self.lookup, self.model, self.prompt_tokens = config, lookup, model, prompt_tokens
        self.costs = model.costs  # its recorded forwards are the model's
        self.rounds, self.unmatched = 0, 0  # rounds asked, and those lookup had no paying match for

    def propose(self, context: list[int], limit: int) -> Proposal:
        """With gamma="auto", the fastest of a lookup round, a model round and an AR step (predicted tokens per ms;
        ties: lookup, then the model)."""
        offer = self.lookup.offer(context)
        self.rounds, self.unmatched = self.rounds + 1, self.unmatched + (offer is None)
        if not self.config.auto_gamma:
            choice = "lookup" if offer else "model"
        else:
            rates = {"lookup": offer[1]} if offer else {}
            rates.update({"model": self.model_rate(context), None: 1.0 / self.costs.verify(1)})
            choice = max(rates, key=rates.get)
        if choice is None or not limit:
            return NO_DRAFTS
        return self.lookup.draft(context, min(offer[0], limit)) if choice == "lookup" else \
            self.model.propose(context, limit)

    def model_rate(self, context: list[int]) -> float:
        """A model round's tokens per ms; until the model drafter has read the prompt, that read is paid by the tokens
        it is expected to draft in the rest of the run (the share of rounds so far that lookup left to it, from a
        prior of one in two): on an answer that copies, a long prompt's read is not worth a few model rounds."""
        rate = self.model.offer()[1]
        unread = self.prompt_tokens - self.model.reader.seen
        if unread <= 0:
            return rate
        remaining = self.config.max_new_tokens - (len(context) - self.prompt_tokens)
        tokens = max(remaining * (self.unmatched + 1) / (self.rounds + 2), 1.0)
        return 1.0 / (1.0 / rate + self.costs.prompt("drafter", unread) / tokens)

    def update(self, outcome: Outcome) -> None:
        self.model.update(outcome)
        self.lookup.update(outcome)  # every round: lookup checks the match it had against what was emitted


def make_drafter(kind: str, pair, config, round_cost: RoundCost, reader, sampler: Sampler, prompt_tokens: int):
    """The run's drafter: `reader` reads the model that drafts (the pair's drafter, or the early exit)."""
    base = pair.costs
    if kind == "early-exit":
        costs = replace(base, draft_ms=exit_draft_ms(pair, exit_layer_of(config, pair.verifier)))
        return ModelDrafter("early-exit", config, costs, round_cost, reader, sampler)
    if kind == "lookup":
        return PromptLookup(config, base, round_cost, pair.vocab_size)
    model = ModelDrafter("model", config, base, round_cost, reader, sampler)
    if kind == "hybrid":
        return Hybrid(config, PromptLookup(config, base, round_cost, pair.vocab_size), model, prompt_tokens)
    return model


def drafter_profiles(pair, base, exit_layer: int = 0) -> dict:
    """{drafter: the pair's cost profile with that drafter's cost per token}: what gamma="auto" prices rounds with
    (`python -m via_sd profile` prints their c)."""
    layer = exit_layer or default_exit_layer(pair.verifier.config.num_hidden_layers)
    return {"model": base, "lookup": replace(base, draft_ms=(lookup_ms(LOOKUP_NGRAM, LOOKUP_TOKENS),) * 3),
            f"early-exit-{layer}": replace(base, draft_ms=exit_draft_ms(pair, layer))}


def describe(config, pair) -> str:
    """What drafted, in words (the trace's models.drafter)."""
    kind = config.drafter
    lookup_words = f"prompt lookup (n-gram <= {config.lookup_ngram}, <= {config.lookup_tokens} tokens)"
    if kind == "lookup":
        return lookup_words
    if kind == "hybrid":
        return f"{lookup_words}, else {pair.drafter_name}"
    if kind == "early-exit":
        n = pair.verifier.config.num_hidden_layers
        return f"{pair.verifier_name}, early exit after layer {exit_layer_of(config, pair.verifier)} of {n}"
    return pair.drafter_name


def exit_caches(pair, config, method: str, start, device):
    """(the early-exit drafter's cache, the full verifier's cache or None): in SD one network split at the exit,
    its two views; in VIA-SD (whose verifiers share their own trunk) a cache of the exit's own."""
    from .cached import model_cache

    layer, vocab = exit_layer_of(config, pair.verifier), pair.vocab_size
    if method == "sd":
        both = start(("early-exit", layer), lambda: early_exit_verifier(pair.verifier, layer, vocab, device))
        return both.view("slim"), both.view("full")
    net = EarlyExitNet(pair.verifier, layer)
    return start(("early-exit-own", layer), lambda: model_cache(net, vocab, net.device, device)), None
