"""Measuring a pair's cost profile (via_sd.cost.model.CostProfile) on this machine, and caching it.

    profile_for(pair)                 # from <cache>/profiles/, measured once when missing
    profile_for(pair, refresh=True)   # measure again (python -m via_sd profile --refresh)
    profile_at_hand(pair)             # what runs price with: never measures when a shipped prior fits
    learn(pair, traces)               # runs' timed passes correct it when it parts from them (cost/refine.py)

Runs start from the best profile at hand: the one measured on this machine (at set-up, or corrected since), else
a prior shipped in assets/profiles/ for the pair (measured on another machine, and labelled so), else one measured
now. Every run's recorded passes are evidence (via_sd.cost.refine): a profile whose predictions part from them by
more than 10% is corrected from them, kept in the cache, and its `source` says so; a trace's `costs` is the profile
that priced it, source and all.

Every pass is timed as the decoders run it (the same cached models / ProgressiveVerifier, row attention
and kernels), after a 200-token context, at 12 row counts (the others interpolated): the median of
five sweeps over every probe, the typical cost a run pays (a burst of other work on a shared machine hits
one sweep; the fastest of them was ~20% below what runs paid), and a curve over rows is made
non-decreasing. The drafter's steps are timed as ratios to a verifier step run just before each (c is
what steers gamma="auto", and a VM's speed drifts between probes timed apart). A profile is keyed by
what changes it: the two models and what they are built of, the weights setting, the route, the device
(CPU model or GPU name), the thread count and the torch version; a cached file whose key differs, or
that does not parse, is measured again with a one-line warning, never trusted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import statistics
import threading
from pathlib import Path

import torch

from .cached import Clock, drafter_cache, model_cache
from ..cost.model import MAX_ROWS, PROMPT_LENGTHS, CostProfile
from ..cost.refine import Evidence, keep_honest
from ..weights.machine import cpu_name
from ..weights.paths import cache_root
from .progressive import ProgressiveVerifier

log = logging.getLogger("via_sd.core.profile")
VERSION = 7  # 4: the drafter runs its lean forward (lean.py); 5: its steps timed paired with a verifier step;
# 6: every int4 pass takes the kernel (linears.KERNEL_RULE: no timed de-quantized path for long prompt reads);
# 7: the project's low-bit kernel (lowbit_kernel.cpp), and the kernel in use is part of the key
CONTEXT = 200
REPEATS = 5
# c = draft(1) / verify(1) steers gamma="auto": each sweep times each drafter step three times, every time right
# after a verifier one-token step (their ratio: on a VM whose speed drifts within minutes, separately timed
# medians read c 0.33-0.37 where paired steps read 0.29-0.305); those verifier steps are verify(1)'s samples
ANCHOR_REPEATS = 3
# rows measured; the others are interpolated (torch's CPU int4 kernel steps every 4 rows: 5, 9, 13, 17)
ROWS = (1, 2, 3, 4, 5, 6, 8, 9, 12, 13, 16, 17)
_lock = threading.Lock()
_MEASURED: dict = {}  # profile file -> the profile this process holds for it: per-run copies of a pair share it
_EVIDENCE: dict = {}  # profile file -> the timed passes of the runs priced with it (cost/refine.Evidence)
MEASURED_HERE = "measured on this machine"
PRIORS = Path(__file__).resolve().parents[2] / "assets" / "profiles"  # {"preset", "profile": CostProfile dict}


def device_name(device) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()


def build_of(model) -> str:
    """What a model is built of (its module kinds, its head's width): another drafter build is another profile."""
    head = model.get_output_embeddings()
    kinds = sorted({type(m).__name__ for m in model.modules()})
    return f"{'+'.join(kinds)} head {getattr(head, 'out_features', '?')}"


def profile_key(pair) -> dict:
    return {"version": VERSION, "drafter": pair.drafter_name, "verifier": pair.verifier_name,
            "drafter_build": build_of(pair.drafter), "verifier_build": build_of(pair.verifier),
            "weights": pair.weights, "route": list(pair.route.skip), "device": str(pair.device),
            "device_name": device_name(pair.device), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "kernels": pair.kernels() if hasattr(pair, "kernels") else None}


def profile_path(key: dict):
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / "profiles" / f"{digest}.json"


def _cached(path, key: dict) -> CostProfile | None:
    """The profile file at `path` when it parses and was measured for `key`; the caller holds the lock."""
    if not path.exists():
        return None
    try:
        profile = CostProfile.from_dict(json.loads(path.read_text()))
        if profile.key == key:
            return dataclasses.replace(profile, source=MEASURED_HERE) if profile.source == "measured" else profile
        log.warning("cost profile %s was measured for another setting: measuring again", path)
    except (OSError, ValueError) as err:
        log.warning("cost profile %s is unreadable (%s): measuring again", path, str(err)[:80])
    return None


def _keep(path, profile: CostProfile) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(profile.to_dict(), indent=1) + "\n")
        tmp.replace(path)
    except OSError as err:  # a read-only cache: measure again next time
        log.warning("could not cache the cost profile at %s: %s", path, err)


def shipped_prior(key: dict) -> CostProfile | None:
    """A profile shipped for this pair (same models, weights and route), measured on another machine: its
    `source` says where, and that it was not measured on this one."""
    fits = ("drafter", "verifier", "weights", "route")
    for path in sorted(PRIORS.glob("*.json")):
        try:
            prior = CostProfile.from_dict(json.loads(path.read_text())["profile"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            log.warning("shipped cost profile %s is unreadable: %s", path.name, err)
            continue
        if all(prior.key.get(f) == key.get(f) for f in fits):
            where = f"{prior.key.get('device_name', 'another machine')}, {prior.key.get('threads', '?')} threads"
            return dataclasses.replace(prior, key=key, source=f"shipped prior, not measured on this machine ({where})")
    return None


def has_prior(preset: str) -> bool:
    """Does a shipped prior exist for `preset` (so its load measures nothing)?"""
    for path in PRIORS.glob("*.json"):
        try:
            if json.loads(path.read_text()).get("preset") == preset:
                return True
        except (OSError, ValueError):
            continue
    return False


def profile_for(pair, refresh: bool = False, progress=None, prior: bool = False) -> CostProfile:
    """The pair's profile on this machine: cached, or measured now (and cached). With `prior`, a shipped prior that
    fits stands in for a missing measurement (profile_at_hand)."""
    key = profile_key(pair)
    path = profile_path(key)
    with _lock:
        held = _MEASURED.get(path)
        if not refresh and held is not None and (prior or not held.source.startswith("shipped prior")):
            return held  # this process measured, read or corrected it (a read-only cache too)
        if not refresh and (profile := _cached(path, key)) is not None:
            _MEASURED[path] = profile
            return profile
        if not refresh and prior and (profile := shipped_prior(key)) is not None:
            _MEASURED[path] = profile
            return profile
        profile = _MEASURED[path] = dataclasses.replace(measure(pair, key, progress), source=MEASURED_HERE)
        _EVIDENCE.pop(path, None)  # a fresh measurement starts its own evidence
        _keep(path, profile)
        return profile


def profile_at_hand(pair) -> CostProfile:
    """What a run prices with: measured here (or corrected since), else a shipped prior, else measured now."""
    return profile_for(pair, prior=True)


def learn(pair, traces) -> CostProfile:
    """Feeds the timed passes of `traces` (runs of `pair`, priced with its profile at hand) to that profile's
    evidence; returns the profile at hand after: corrected (and cached) when it parted from them by more than 10%."""
    current = profile_at_hand(pair)
    path = profile_path(profile_key(pair))
    with _lock:
        evidence = _EVIDENCE.setdefault(path, Evidence())
        for trace in traces:
            evidence.add_run(trace)
        origin = current.source.split(", corrected from")[0]
        honest = keep_honest(current, evidence, origin)
        if honest is not current:
            log.info("cost profile corrected from runs: %s", honest.source)
            _MEASURED[path] = honest
            _keep(path, honest)
    return honest


def _time_ms(clock: Clock, fn, before=None) -> float:
    if before is not None:
        before()
    start = clock.ms()
    fn()
    return clock.ms() - start


def non_decreasing(values) -> tuple:
    """More rows never cost less: the closest non-decreasing curve (pool-adjacent-violators), so a dip or a
    spike of noise is averaged with its neighbours instead of carried forward."""
    blocks: list[list[float]] = []  # [sum, count]
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return tuple(total / count for total, count in blocks for _ in range(count))


def _fill(measured: dict[int, float], rows: int) -> list[float]:
    """ms for k = 1..rows, linear between the measured k."""
    known = sorted(measured)
    out = []
    for k in range(1, rows + 1):
        lo = max(x for x in known if x <= k)
        hi = min(x for x in known if x >= k)
        out.append(measured[lo] if hi == lo else measured[lo] + (measured[hi] - measured[lo]) * (k - lo) / (hi - lo))
    return out


@torch.inference_mode()
def measure(pair, key: dict | None = None, progress=None) -> CostProfile:
    """Times every pass the cost model prices (about a minute for the embedded pair on 2 CPU cores).

    Every probe (a pass over k rows for each model, a prompt read) runs once per sweep, the sweeps one after
    the other, and each probe keeps the median of its sweeps: a burst of other work on a shared machine
    lands on a few probes of one sweep, not on every sweep of one probe."""
    clock, vocab = Clock(pair.device), pair.vocab_size
    gen = torch.Generator().manual_seed(0)
    seq = torch.randint(0, vocab, (CONTEXT + MAX_ROWS + max(PROMPT_LENGTHS),), generator=gen).tolist()
    out = pair.drafter.device

    def cached(model, build=model_cache):
        m = build(model, vocab, out, out)
        m.logits(seq, CONTEXT, 1)
        m.logits(seq, CONTEXT + 1, 1)  # warm
        m.rollback(CONTEXT)
        return m

    full, slim, drafter = cached(pair.verifier), cached(pair.slim), cached(pair.drafter, drafter_cache)
    both = ProgressiveVerifier(pair.slim, vocab, out, slim_cache="own")  # the slim pass priced on its own cache
    slim_view, full_view = both.view("slim"), both.view("full")
    slim_view.logits(seq, CONTEXT, 1)
    full_view.logits(seq, CONTEXT, 1)

    def rows_probe(model, k, before=None):
        def prepare():
            model.rollback(CONTEXT)
            if before is not None:
                before(k)
        return prepare, lambda: model.logits(seq, CONTEXT + k, k)

    def prompt_probe(module, n, build=model_cache):
        holder = {}
        return (lambda: holder.update(m=build(module, vocab, out, out))), (lambda: holder["m"].logits(seq, n, 1))

    def after_slim(k):
        both.rollback(CONTEXT)
        slim_view.logits(seq, CONTEXT + k, k)

    verify_one = rows_probe(full, 1)  # verify(1): timed in the drafter's pairs below
    probes = {}
    for k in ROWS:
        if k > 1:
            probes[("verify", k)] = rows_probe(full, k)
        probes[("slim", k)] = rows_probe(slim, k)
        probes[("resume", k)] = (lambda k=k: after_slim(k)), (lambda k=k: full_view.logits(seq, CONTEXT + k, k))
    drafts = {k: rows_probe(drafter, k) for k in range(1, 4)}
    for name, module in (("drafter", pair.drafter), ("slim", pair.slim), ("full", pair.verifier)):
        for n in PROMPT_LENGTHS:
            probes[(name, n)] = prompt_probe(module, n, drafter_cache if name == "drafter" else model_cache)
    times = {p: [] for p in [("verify", 1), *probes]}
    ratios = {k: [] for k in drafts}  # a drafter step over the verifier step just before it: c is paired
    for sweep in range(REPEATS):
        for p, (prepare, run) in probes.items():
            times[p].append(_time_ms(clock, run, prepare))
        for _ in range(ANCHOR_REPEATS):
            for k, (prepare, run) in drafts.items():
                one = _time_ms(clock, verify_one[1], verify_one[0])
                times[("verify", 1)].append(one)
                ratios[k].append(_time_ms(clock, run, prepare) / one)
        if progress is not None:
            progress(f"measuring the cost profile: sweep {sweep + 1} of {REPEATS}", (sweep + 1) / REPEATS)
    ms = {p: statistics.median(t) for p, t in times.items()}

    def curve(kind, rows):
        return non_decreasing(_fill({k: ms[(kind, k)] for k in rows}, max(rows)))

    prompt_ms = {name: dict(zip(PROMPT_LENGTHS, non_decreasing(ms[(name, n)] for n in PROMPT_LENGTHS)))
                 for name in ("drafter", "slim", "full")}
    draft_ms = non_decreasing(statistics.median(ratios[k]) * ms[("verify", 1)] for k in drafts)
    return CostProfile(curve("verify", ROWS), curve("slim", ROWS), curve("resume", ROWS), draft_ms,
                       prompt_ms, key or profile_key(pair))
