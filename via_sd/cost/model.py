"""What a round costs, and so which round pays: the cost model behind `gamma="auto"`, the predicted
tokens/s in every trace, the bench's predictions and the app's projections. Pure Python (no torch).

A `CostProfile` holds what the pair costs on one machine, measured by `via_sd.core.profile` (or built from
a roofline for a GPU, or re-shaped by a what-if control):

    verify_ms[k-1]  full verifier pass over k new tokens after a ~200-token context, k = 1..17
    slim_ms[k-1]    slim verifier pass, same k
    resume_ms[k-1]  full pass over the same k tokens right after a slim pass (progressive
                    verification: the shared sub-layers are already done)
    draft_ms[k-1]   drafter pass over k new tokens, k = 1..3 (a round's first drafter call feeds
                    one or two tokens, every later one a single token)
    prompt_ms       {"drafter" | "slim" | "full": {prompt length: ms to read a prompt that long}}

In units of one one-token verifier pass: V(k) = verify(k) / verify(1), c = draft(1) / verify(1),
s(k) = slim(k) / verify(k). A round that drafts g tokens with per-token acceptance a emits
E = (1 - a^(g+1)) / (1 - a) tokens (bonus included) and costs g * c + V(g + 1) in plain SD, so

    SD / AR = E / (g * c + V(g + 1))

VIA-SD replaces V(g + 1) by what its tiers spend (`via_round_ms`). A recorded run is priced call by
call (`price_calls`): every forward the engine made is in its trace (`round["calls"]`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

MAX_ROWS = 17          # the profile's verification passes: k = 1..MAX_ROWS new tokens
MAX_GAMMA = MAX_ROWS - 1
PROMPT_LENGTHS = (32, 128)

# Memory bandwidth in GB/s of cards a Space or a lecture hall might have (vendor figures).
GPU_CARDS = {"A10G": 600.0, "L4": 300.0, "H100": 3350.0}
GPU_LAUNCH_MS = 0.02   # a kernel launch's floor per layer, so small models are not free on a GPU


@dataclass(frozen=True)
class CostProfile:
    verify_ms: tuple
    slim_ms: tuple
    resume_ms: tuple
    draft_ms: tuple
    prompt_ms: dict = field(default_factory=dict)
    key: dict = field(default_factory=dict)
    source: str = "measured"

    def __post_init__(self):
        for name in ("verify_ms", "slim_ms", "resume_ms", "draft_ms"):
            values = getattr(self, name)
            if not values or not all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values):
                raise ValueError(f"a cost profile's {name} must be positive milliseconds, got {values!r}")

    # ---- cost of one forward, in ms ----
    def verify(self, k: int) -> float:
        return _row_cost(self.verify_ms, k)

    def slim(self, k: int) -> float:
        return _row_cost(self.slim_ms, k)

    def resume(self, k: int) -> float:
        return _row_cost(self.resume_ms, k)

    def draft(self, k: int = 1) -> float:
        return _row_cost(self.draft_ms, k)

    def prompt(self, model: str, n: int) -> float:
        """Reading a prompt of n tokens into an empty cache; a model with no measured prompt read pays its
        per-row cost (a pass over n rows)."""
        curve = {int(k): v for k, v in (self.prompt_ms.get(model) or {}).items()}
        if not curve:
            return {"drafter": self.draft, "slim": self.slim, "full": self.verify}[model](n)
        return interpolate(curve, n)

    # ---- in units of one one-token verifier pass ----
    def V(self, k: int) -> float:
        return self.verify(k) / self.verify(1)

    @property
    def c(self) -> float:
        return self.draft(1) / self.verify(1)

    def s(self, k: int = 1) -> float:
        return self.slim(k) / self.verify(k)

    def times(self, factor: float, source: str) -> "CostProfile":
        """Every price times `factor` (the same shape at another level: a machine that runs slower or faster)."""
        scale = lambda values: tuple(v * factor for v in values)  # noqa: E731
        return replace(self, verify_ms=scale(self.verify_ms), slim_ms=scale(self.slim_ms),
                       resume_ms=scale(self.resume_ms), draft_ms=scale(self.draft_ms), source=source,
                       prompt_ms={m: {n: v * factor for n, v in c.items()} for m, c in self.prompt_ms.items()})

    def to_dict(self) -> dict:
        return {"verify_ms": list(self.verify_ms), "slim_ms": list(self.slim_ms), "resume_ms": list(self.resume_ms),
                "draft_ms": list(self.draft_ms),
                "prompt_ms": {m: {str(k): v for k, v in c.items()} for m, c in self.prompt_ms.items()},
                "key": dict(self.key), "source": self.source}

    @classmethod
    def from_dict(cls, d: dict) -> "CostProfile":
        if not isinstance(d, dict):
            raise ValueError(f"a cost profile is a JSON object, got {type(d).__name__}")
        try:
            prompt = {m: {int(k): float(v) for k, v in c.items()} for m, c in (d.get("prompt_ms") or {}).items()}
            return cls(tuple(map(float, d["verify_ms"])), tuple(map(float, d["slim_ms"])),
                       tuple(map(float, d["resume_ms"])), tuple(map(float, d["draft_ms"])), prompt,
                       dict(d.get("key") or {}), str(d.get("source", "measured")))
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"not a cost profile: {err!r}") from None


def _row_cost(values: tuple, k: int) -> float:
    """values[k-1]; beyond the measured rows, the last measured step per row continues."""
    if k <= len(values):
        return float(values[max(k, 1) - 1])
    step = (values[-1] - values[-2]) if len(values) > 1 else values[-1]
    return float(values[-1] + max(step, 0.0) * (k - len(values)))


def interpolate(curve: dict[int, float], n: int, through_origin: bool = True) -> float:
    """Piecewise-linear through (length, ms), the last segment extended. Below the first point: through the origin
    (`through_origin`, a prompt read), or the first segment extended, never below 0 (a projection's grid)."""
    pts = sorted(curve.items())
    if not through_origin:
        if len(pts) == 1:
            return pts[0][1]
        k = next((k for k in range(1, len(pts)) if n <= pts[k][0]), len(pts) - 1)
        (x0, y0), (x1, y1) = pts[k - 1], pts[k]
        return max(y0 + (y1 - y0) * (n - x0) / (x1 - x0), 0.0)
    if n <= pts[0][0]:
        return pts[0][1] * n / pts[0][0]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if n <= x1:
            return y0 + (y1 - y0) * (n - x0) / (x1 - x0)
    if len(pts) == 1:
        return pts[0][1] * n / pts[0][0]
    (x0, y0), (x1, y1) = pts[-2], pts[-1]
    return y1 + (y1 - y0) * (n - x1) / (x1 - x0)


# ---- what a recorded run cost: every forward call priced ----

def reads_prompt(call: dict) -> bool:
    """A recorded forward that read the prompt: from an empty cache, or flagged (after a cached chat opening)."""
    return not call.get("past") or bool(call.get("prompt"))


def call_ms(profile: CostProfile, call: dict) -> float:
    """One recorded forward: {"model": drafter|slim|full, "rows": new tokens, "past": tokens already cached,
    "resume": True for a full pass that resumed from the slim pass's shared sub-layers, "prompt": True for a
    read of the prompt (after a cached chat opening too: via_sd.core.opening)}."""
    model, rows = call["model"], int(call["rows"])
    if rows <= 0:
        return 0.0
    if reads_prompt(call):
        ms = profile.prompt(model, rows)
        return ms * profile.resume(1) / profile.verify(1) if call.get("resume") else ms
    if model == "drafter":
        return profile.draft(rows)
    if model == "slim":
        return profile.slim(rows)
    return profile.resume(rows) if call.get("resume") else profile.verify(rows)


def price_calls(profile: CostProfile, rounds: list[dict]) -> float | None:
    """Milliseconds the recorded forwards of `rounds` cost under `profile`; None when a round lacks its calls
    (a trace from an engine before they were recorded)."""
    if any("calls" not in r for r in rounds):
        return None
    return sum(call_ms(profile, c) for r in rounds for c in r["calls"])


def predicted_tokens_per_s(profile: CostProfile, rounds: list[dict], new_tokens: int) -> float | None:
    ms = price_calls(profile, rounds)
    return 1000.0 * new_tokens / ms if ms else None


def predict(profile: CostProfile, traces: dict) -> dict:
    """Predicted tokens/s of each method's recorded run under `profile` (another machine, a projection),
    and the speed-ups against AR and SD. `traces`: {"ar" | "sd" | "via": Trace or trace dict}."""
    out = {}
    for method, trace in traces.items():
        rounds = trace["rounds"] if isinstance(trace, dict) else trace.rounds
        summary = trace["summary"] if isinstance(trace, dict) else trace.summary
        out[method] = predicted_tokens_per_s(profile, rounds, summary.get("new_tokens", 0))
    speedups = {}
    for method in out:
        for base in ("ar", "sd"):
            if method != base and out.get(method) and out.get(base):
                speedups[f"{method}_vs_{base}"] = out[method] / out[base]
    return {"tokens_per_s": out, "speedup": speedups, "source": profile.source}


# ---- choosing the round: gamma from the profile and the run's acceptance so far ----

def expected_emitted(alpha: float, gamma: int) -> float:
    """Tokens a round emits, bonus included, when each draft is kept with probability alpha (i.i.d.)."""
    alpha = min(max(alpha, 0.0), 0.999)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def sd_round_ms(profile: CostProfile, gamma: int) -> float:
    return gamma * profile.draft(1) + profile.verify(gamma + 1)


def all_tier_a(gamma: int, rates: "Rates") -> float:
    """Under the draft signal, the chance that a round's gamma drafts all land in tier A (no verifier runs)."""
    return (1.0 - rates.full_share - rates.slim_share) ** gamma if rates.full_share + rates.slim_share < 1 else 0.0


def via_round_ms(profile: CostProfile, gamma: int, rates: "Rates", slim_sorts: bool) -> float:
    """Expected cost of a VIA-SD round that drafts gamma tokens.

    Slim signal: the slim pass sorts every draft; a round with a tier-C draft then runs the full pass,
    resuming from the slim pass's shared sub-layers. Draft signal: a round with a tier-C draft runs the full
    pass alone; one with tier B and no tier C runs the slim pass; one all in tier A runs no verifier.
    The full pass reads the drafts and the tokens it lags behind (`rates.lag`: at least the last round's
    bonus token, which no verifier has read yet)."""
    no_c = (1.0 - rates.full_share) ** gamma
    rows = round(gamma + max(rates.lag, 1.0))
    if slim_sorts:
        return gamma * profile.draft(1) + profile.slim(gamma + 1) + (1.0 - no_c) * profile.resume(rows)
    slim_only = max(no_c - all_tier_a(gamma, rates), 0.0)
    return gamma * profile.draft(1) + (1.0 - no_c) * profile.verify(rows) + slim_only * profile.slim(gamma + 1)


def via_round_tokens(gamma: int, rates: "Rates", slim_sorts: bool) -> float:
    """Expected tokens a VIA-SD round emits: a verifier's bonus token comes only from a round that ran one, so
    under the draft signal a round all in tier A emits its gamma drafts and nothing more."""
    if slim_sorts:
        return rates.emitted(gamma)
    all_a = all_tier_a(gamma, rates)
    return all_a * gamma + (1.0 - all_a) * rates.emitted(gamma)


@dataclass
class Rates:
    """Running estimates a run learns round by round: per-draft acceptance, the shares of drafts sorted into
    tier C (full_share) and tier B (slim_share), and how far the full verifier lags behind (tokens past the prompt it
    catches up on before the round's drafts; the prompt is read in a call of its own). Starts from a prior worth
    ten drafts (acceptance 0.7, no escalation) and a lag of one token (the last round's bonus)."""

    kept: float = 7.0
    trials: float = 10.0
    to_full: float = 0.0
    to_slim: float = 0.0
    sorted: float = 10.0
    lag: float = 1.0

    @property
    def alpha(self) -> float:
        return self.kept / self.trials

    def emitted(self, gamma: int) -> float:
        """Tokens a round of gamma drafts is expected to emit, bonus included."""
        return expected_emitted(self.alpha, gamma)

    @property
    def full_share(self) -> float:
        """The share of drafts sorted into tier C (escalated to the full verifier)."""
        return self.to_full / self.sorted

    @property
    def slim_share(self) -> float:
        """The share of drafts sorted into tier B."""
        return self.to_slim / self.sorted

    def add(self, kept: int, rejected: bool, tiers: list[str], lag: int | None = None) -> None:
        """One round: drafts kept before the first rejection, whether one was rejected, the tier of each draft."""
        self.kept += kept
        self.trials += kept + int(rejected)
        self.to_full += sum(t == "full" for t in tiers)
        self.to_slim += sum(t == "slim" for t in tiers)
        self.sorted += len(tiers)
        if lag is not None:
            self.lag = 0.8 * self.lag + 0.2 * lag


@dataclass(frozen=True)
class RoundCost:
    """How a run's rounds are priced, decided once per run: as plain SD's (`kind` "sd": the method is SD, or VIA-SD's
    thresholds send every draft to tier C) or as VIA-SD's tiers ("via"; `slim_sorts`: the slim pass sorts every
    round's drafts). `rate` is a round's predicted tokens per ms, `best` the round size that maximises it."""

    kind: str
    slim_sorts: bool = True

    @classmethod
    def of(cls, method: str, every_draft_to_full: bool, slim_sorts: bool) -> "RoundCost":
        return cls("sd" if method == "sd" or every_draft_to_full else "via", slim_sorts)

    def rate(self, profile: CostProfile, rates: Rates, gamma: int) -> float:
        """E / cost: the tokens a round of gamma drafts is expected to emit over what it is expected to cost."""
        if self.kind == "sd":
            return rates.emitted(gamma) / sd_round_ms(profile, gamma)
        return via_round_tokens(gamma, rates, self.slim_sorts) / via_round_ms(profile, gamma, rates, self.slim_sorts)

    def best(self, profile: CostProfile, rates: Rates, limit: int = MAX_GAMMA) -> tuple[int, float]:
        """(gamma, its rate): the draft length of at most `limit` that maximises the rate (ties: the shorter)."""
        best, best_rate = 1, -1.0
        for g in range(1, max(limit, 1) + 1):
            rate = self.rate(profile, rates, g)
            if rate > best_rate * (1 + 1e-9):
                best, best_rate = g, rate
        return best, best_rate


def worth_another(profile: CostProfile, rates: Rates, drafted: int, chance: float, rate: float) -> bool:
    """Does one more draft pay in a plain SD round that has `drafted` drafts, each kept, by the drafter's own
    probabilities, with `chance` (the product of their p(x))? The next draft adds a token when the chain so far and
    it are kept: about chance * alpha tokens, worth that many over the run's predicted `rate` (tokens per ms) in
    milliseconds; it costs a drafter step and a verifier pass one row wider. Where the drafter is sure the chain goes
    on past the i.i.d. model's best gamma; where it is not it stops before a draft it would likely waste."""
    step = profile.draft(1) + profile.verify(drafted + 2) - profile.verify(drafted + 1)
    return chance * rates.alpha >= step * rate


def best_gamma(profile: CostProfile, method: str, rates: Rates, slim_sorts: bool = True,
               limit: int = MAX_GAMMA) -> int:
    """The draft length that maximises predicted tokens per millisecond (ties: the shorter round)."""
    return RoundCost(method, slim_sorts).best(profile, rates, limit)[0]


def ceiling(profile: CostProfile, alpha: float, gamma: int) -> float:
    """SD / AR = E / (gamma * c + V(gamma + 1)), the formula in the module docstring."""
    return expected_emitted(alpha, gamma) / (gamma * profile.c + profile.V(gamma + 1))


def acceptance(rounds: list[dict]) -> float | None:
    """Per-draft acceptance of a recorded run, as a round sees it: drafts kept before the first rejection over
    those plus the rejections (drafts discarded after a rejection were never tried)."""
    kept = tried = 0
    for rnd in rounds:
        decisions = [c.get("decision") for c in rnd.get("candidates", [])]
        k = sum(d in ("kept", "accepted") for d in decisions)
        kept, tried = kept + k, tried + k + ("replaced" in decisions)
    return kept / tried if tried else None


# ---- other machines: what-if shapes and a GPU roofline ----

def scaled(profile: CostProfile, flatness: float | None = None, c: float | None = None, s: float | None = None,
           source: str = "projection") -> CostProfile:
    """The profile re-shaped by a what-if control: `flatness` in [0, 1] moves V(k) from as measured (0) to
    flat (1: k rows cost one); `c` sets the drafter's cost per token and `s` the slim pass's cost, both as
    shares of a one-token verifier pass (and of a full pass over the same rows)."""
    one = profile.verify(1)
    verify = profile.verify_ms
    if flatness is not None:
        f = min(max(float(flatness), 0.0), 1.0)
        verify = tuple(one + (v - one) * (1.0 - f) for v in verify)
    resume_share = [r / v for r, v in zip(profile.resume_ms, profile.verify_ms)]
    slim_share = [sl / v for sl, v in zip(profile.slim_ms, profile.verify_ms)] if s is None else [s] * len(verify)
    draft = profile.draft_ms if c is None else tuple(c * one * d / profile.draft_ms[0] for d in profile.draft_ms)
    prompt = dict(profile.prompt_ms)
    if c is not None and "drafter" in prompt:
        prompt["drafter"] = {n: ms * c * one / profile.draft_ms[0] for n, ms in prompt["drafter"].items()}
    if s is not None and "full" in prompt:
        prompt["slim"] = {n: ms * s for n, ms in prompt["full"].items()}
    return replace(profile, verify_ms=verify, slim_ms=tuple(x * v for x, v in zip(slim_share, verify)),
                   resume_ms=tuple(x * v for x, v in zip(resume_share, verify)), draft_ms=tuple(draft),
                   prompt_ms=prompt, source=source)


def roofline(card: str, drafter_bytes: int, verifier_bytes: int, slim_fraction: float, layers: tuple = (24, 28),
             resume_fraction: float = 1.0) -> CostProfile:
    """A memory-bound GPU: a pass over up to MAX_ROWS rows reads every weight once, so it costs
    bytes / bandwidth plus a launch floor per layer, whatever k. `slim_fraction`: the slim pass's share of
    the verifier's weight bytes; `layers`: (drafter layers, verifier layers)."""
    if card not in GPU_CARDS:
        raise ValueError(f"unknown card {card!r}: choose one of {', '.join(GPU_CARDS)}")
    bw = GPU_CARDS[card] * 1e9 / 1e3  # bytes per ms
    full = verifier_bytes / bw + GPU_LAUNCH_MS * 7 * layers[1]
    slim = slim_fraction * verifier_bytes / bw + GPU_LAUNCH_MS * 7 * layers[1] * slim_fraction
    draft = drafter_bytes / bw + GPU_LAUNCH_MS * 7 * layers[0]
    flat = lambda ms: tuple([ms] * MAX_ROWS)  # noqa: E731
    return CostProfile(flat(full), flat(slim), flat(full * resume_fraction), tuple([draft] * 3), {},
                       {"card": card, "bandwidth_gb_s": GPU_CARDS[card]}, source=f"projection: {card} roofline")
