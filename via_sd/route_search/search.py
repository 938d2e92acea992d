"""The route search: lazy greedy elimination with local swaps, and the one-at-a-time baseline (why: see __init__)."""

from __future__ import annotations

import time

from ..core.routing import Route, resolve_route
from .cache import model_identity
from .cost import device_name
from .progress import report, stopped
from .sublayers import skip_count, skip_names, skip_set, skippable, sublayer_index, sublayer_name, sublayer_sizes
from .teacher import Pass, TeacherForced

OBJECTIVES = {"kl": "the least KL(full || slim)",
              "kl-per-cost": "the least KL(full || slim) added per unit of weights saved"}
METHOD = ("lazy greedy elimination on calibration text: each step skips the sub-layer that gives {objective}, "
          "re-measuring at most {k} candidates in order of their last measured harm (every sub-layer measured "
          "alone first), each pass starting from the recorded hidden state entering the candidate; then local "
          "swaps of the same kind (attention for attention, MLP for MLP; up to {s} evaluations). Training-free.")


def search_route(pair, skip_ratio: float, calibration, *, name: str | None = None, **options) -> Route:
    """The route of `skip_ratio` whose slim verifier stays closest to the full one on `calibration`
    (options: see `search_curve`)."""
    return search_curve(pair, [skip_ratio], calibration, names=[name] if name else None, **options)[-1]


class _Search:
    """One lazy-greedy search: the passes it measures, the harm it has learned and the route so far."""

    def __init__(self, pair, calibration, begin: Route, objective: str, candidates: int, swaps: int, progress, stop):
        self.pair, self.begin, self.objective, self.candidates, self.swaps = pair, begin, objective, candidates, swaps
        self.progress, self.stop = progress, stop
        self.t0 = time.perf_counter()
        verifier = pair.verifier
        self.n = verifier.config.num_hidden_layers
        self.tf = calibration if isinstance(calibration, TeacherForced) else TeacherForced(verifier, calibration)
        sizes, _ = sublayer_sizes(verifier)
        self.weight = {k: sizes[k] / max(sizes) if objective == "kl-per-cost" else 1.0 for k in skippable(self.n)}
        self.current = self.tf.evaluate(skip_set(begin), record=True)
        self.harm = {}  # KL added by each sub-layer, as last measured (stale for all but the latest step)
        self.added = {}  # KL each skipped sub-layer added when it was chosen
        self.done, self.planned, self.steps, self.accepted = 0, 0, [], []

    def tell(self, message: str) -> None:
        report(self.progress, f"route search: {message}", self.done / max(self.planned, 1))

    def measure(self, skip, at: int, base: Pass) -> Pass:
        """A recorded pass under `skip`, resumed from base's state entering sub-layer `at`."""
        if stopped(self.stop):
            raise KeyboardInterrupt
        self.done += 1
        return self.tf.evaluate(skip, start=at, base=base, record=True)

    def priority(self, k: int) -> float:
        return self.harm[k] / self.weight[k]

    def measure_alone(self, remaining: list[int]) -> None:
        """Every sub-layer once, alone on top of the start route: the first harm of each."""
        current = self.current
        for k in remaining:
            self.harm[k] = self.measure(current.skip | {k}, k, current).kl - current.kl
            self.tell(f"measured {sublayer_name(k)} alone: KL +{self.harm[k]:.4f}")

    def step(self, last: int) -> None:
        """Skips one more sub-layer: the least harmful (by priority) of the candidates re-measured."""
        best, current = None, self.current
        for k in sorted(self.harm, key=self.priority)[:self.candidates]:
            if best is not None and self.priority(chosen) <= self.priority(k):
                break  # the stale harms left can only be larger once re-measured
            trial = self.measure(current.skip | {k}, k, current)
            self.harm[k] = trial.kl - current.kl
            self.tell(f"{len(current.skip) + 1}/{last} skipped, tried {sublayer_name(k)}: KL {trial.kl:.4f}")
            if best is None or self.priority(k) < self.priority(chosen):
                best, chosen = trial, k
        self.added[chosen] = self.harm.pop(chosen)
        self.current = current = best
        self.steps.append({"skip": sublayer_name(chosen), "kl": round(current.kl, 5),
                           "agreement": round(current.agreement, 4)})
        self.tell(f"step {len(current.skip)}/{last}: skip {sublayer_name(chosen)} -> KL {current.kl:.4f}, "
                  f"agreement {current.agreement:.3f}")

    def swap(self) -> None:
        self.current = _local_swaps(self.current, self.added, self.harm, self.priority, self.swaps, self.measure,
                                    self.tell, self.accepted)

    def route(self, name: str, ratio: float, stopped: bool) -> Route:
        """The route so far, with how it was searched in its meta."""
        tf, current = self.tf, self.current
        meta = {"skip_ratio": ratio,
                "calibration": {"source": tf.texts.source, "sequences": len(tf.texts.sequences),
                                "scored_tokens": tf.texts.scored_tokens,
                                "top1_agreement": round(current.agreement, 4), "kl": round(current.kl, 5)},
                "method": METHOD.format(objective=OBJECTIVES[self.objective], k=self.candidates, s=self.swaps),
                "search": {"objective": self.objective, "candidates_per_step": self.candidates,
                           "swap_budget": self.swaps, "swaps_accepted": list(self.accepted), "evaluations": self.done,
                           "seconds": round(time.perf_counter() - self.t0, 1), "device": device_name(tf.view.device),
                           "started_from": list(self.begin.skip), "greedy_steps": list(self.steps),
                           "stopped": stopped},
                "model": model_identity(self.pair)}
        return Route(name, skip_names(current.skip), self.n, meta)


def search_curve(pair, ratios, calibration, *, start=None, objective: str = "kl", candidates: int = 4,
                 swaps: int = 8, names=None, progress=None, stop=None) -> list[Route]:
    """One lazy-greedy search through several skip ratios; a route for each, smallest ratio first.

    `calibration`: a Calibration or a TeacherForced built on one (reuse it across searches).
    `objective`: "kl" skips, at each step, the sub-layer whose skip raises KL the least; "kl-per-cost"
    the one that raises it least per share of the weights it saves.
    `start`: a route to start from (its sub-layers stay skipped, except through swaps).
    `candidates`: the most sub-layers re-measured per step; `swaps`: evaluations spent on local swaps per ratio.
    `progress(message, fraction)` hears about every evaluation; `stop` (anything with `is_set()`) or Ctrl-C
    ends the search early: the last route returned is then the route so far (meta "stopped": true).
    """
    n = pair.verifier.config.num_hidden_layers
    ratios = sorted(ratios)
    targets = [skip_count(n, r) for r in ratios]
    names = list(names) if names else [f"s{round(100 * r):02d}" for r in ratios]
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}: use one of {', '.join(OBJECTIVES)}")
    if candidates < 1 or swaps < 0:
        raise ValueError("candidates must be at least 1 and swaps at least 0")
    begin = resolve_route(start, n) if start is not None else Route("none", (), n)
    if len(begin.skip) > targets[0]:
        raise ValueError(f"the starting route {begin.name!r} already skips {len(begin.skip)} sub-layers, "
                         f"more than the {targets[0]} that ratio {ratios[0]} asks for")
    search = _Search(pair, calibration, begin, objective, candidates, swaps, progress, stop)
    remaining = [k for k in skippable(n) if k not in search.current.skip]
    search.planned = len(remaining) + (targets[-1] - len(search.current.skip)) * candidates + swaps * len(ratios)
    routes = []
    try:
        if len(search.current.skip) < targets[-1]:
            search.measure_alone(remaining)
        for target, ratio, name in zip(targets, ratios, names):
            while len(search.current.skip) < target:
                search.step(targets[-1])
            search.swap()
            routes.append(search.route(name, ratio, stopped=False))
    except KeyboardInterrupt:
        search.tell(f"stopped: keeping the route so far ({len(search.current.skip)} sub-layers)")
        routes.append(search.route(names[len(routes)], len(search.current.skip) / (2 * n), stopped=True))
    return routes


def _local_swaps(current: Pass, added: dict, harm: dict, priority, budget: int, measure, tell, accepted: list) -> Pass:
    """Swaps a skipped sub-layer for a kept one of the same kind while that lowers the KL (first improvement)."""
    tried, seen = 0, {current.skip}
    while tried < budget:
        pairs = [(out, inn) for out in sorted(current.skip, key=lambda k: -added.get(k, 0.0))  # costliest first
                 for inn in sorted((k for k in harm if k % 2 == out % 2), key=priority)[:2]
                 if current.skip - {out} | {inn} not in seen]
        for out, inn in pairs[:budget - tried]:
            seen.add(current.skip - {out} | {inn})
            trial = measure(current.skip - {out} | {inn}, min(out, inn), current)
            tried += 1
            tell(f"swap {sublayer_name(out)} -> {sublayer_name(inn)}: KL {trial.kl:.4f} (now {current.kl:.4f})")
            if trial.kl < current.kl - 1e-6:
                out_added = added.pop(out, 0.0)
                added[inn] = out_added + trial.kl - current.kl
                del harm[inn]
                harm[out] = out_added  # a candidate again, last measured by what it added
                accepted.append(f"{sublayer_name(out)} -> {sublayer_name(inn)}")
                current = trial
                break
        else:
            break
    return current


def rank_one_at_a_time(pair, calibration, progress=None, stop=None) -> list[dict]:
    """Every skippable sub-layer skipped alone: agreement and KL, least harmful first (the baseline
    heuristic of MODELS.md, kept for comparison)."""
    n = pair.verifier.config.num_hidden_layers
    tf = calibration if isinstance(calibration, TeacherForced) else TeacherForced(pair.verifier, calibration)
    base = tf.evaluate(frozenset(), record=True)
    rows, sublayers = [], skippable(n)
    for i, k in enumerate(sublayers):
        if stopped(stop):
            raise KeyboardInterrupt
        trial = tf.evaluate({k}, start=k, base=base)
        rows.append({"sublayer": sublayer_name(k), "agreement": trial.agreement, "kl": trial.kl})
        report(progress, f"one at a time: {sublayer_name(k)} agreement {trial.agreement:.3f}", (i + 1) / len(sublayers))
    return sorted(rows, key=lambda r: (-r["agreement"], r["kl"]))


def one_at_a_time_route(pair, ranking: list[dict], skip_ratio: float, name: str | None = None) -> Route:
    """The `skip_ratio` least harmful sub-layers of a one-at-a-time ranking, skipped together."""
    n = pair.verifier.config.num_hidden_layers
    skip = frozenset(sublayer_index(r["sublayer"]) for r in ranking[:skip_count(n, skip_ratio)])
    meta = {"skip_ratio": skip_ratio, "model": model_identity(pair),
            "method": "one-at-a-time baseline: each sub-layer skipped alone on the calibration text, the least "
                      "harmful by top-1 agreement (then KL) skipped together; no search"}
    return Route(name or f"one-at-a-time-s{round(100 * skip_ratio):02d}", skip_names(skip), n, meta)
