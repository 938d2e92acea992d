"""DecodeConfig: everything a decode run is told, checked once where it is built."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..cost.model import MAX_GAMMA
from .bounds import BOUNDS, MAX_FIXED_GAMMA
from .plan import Thresholds

DRAFTERS = ("model", "lookup", "hybrid", "early-exit")

MIN_TEMPERATURE = 1e-3  # below this, sampling is argmax to float precision and logits / temperature can overflow
AUTO = "auto"


@dataclass(frozen=True)
class DecodeConfig:
    # drafts per round: "auto" picks each round's length from the pair's measured cost profile and the
    # acceptance seen so far (via_sd.cost.model.best_gamma, 1..16); a whole number 1..64 fixes it
    gamma: int | str = AUTO
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    thresholds: Thresholds = field(default_factory=Thresholds)
    draft_stop: float = 0.0  # end the round's drafting early once the drafter's p(x) falls below this
    chat: bool = True  # wrap the prompt in the tokenizer's chat template when it has one
    # VIA-SD: once this many tokens in a row were kept with no verifier, the next round's drafts go to a
    # verifier (tier A is closed for that round: plan.force_verification); 0 = no bound
    max_unverified: int = 32
    # VIA-SD: the slim and full verifier share the sub-layers before the route's first skip (one KV cache,
    # a full pass resumes from the slim pass's hidden states); False runs them separately (for comparison)
    progressive: bool = True
    # VIA-SD, progressive: the slim verifier's cache after the shared sub-layers: "full" (it reads the full
    # verifier's: the prompt is read once, by the full verifier, and every position the full verifier has read is
    # the slim verifier's context too, as SWIFT / LayerSkip share the target's cache; on the embedded pair its
    # agreement with the full model rose, 0.868 -> 0.912 under `paper`, BENCHMARKS.md) or "own"
    slim_cache: str = "full"
    # every cache starts from a copy of one that read the chat template's opening (system turn, start of the user
    # turn) once per pair, and reads only the rest of the prompt (via_sd.core.opening); False reads every prompt whole
    reuse_opening: bool = True
    # who proposes the drafts (via_sd.core.drafters): "model" (the pair's drafter), "lookup" (prompt lookup: the
    # longest n-gram, up to lookup_ngram tokens, that ends the sequence and occurs earlier in it proposes what
    # followed, up to lookup_tokens), "hybrid" (lookup when it matches, else the model) or "early-exit" (the
    # verifier's first exit_layer layers and its head; 0: half its layers)
    drafter: str = "model"
    lookup_ngram: int = 3
    lookup_tokens: int = 10
    exit_layer: int = 0

    def __post_init__(self):
        if self.gamma != AUTO and (isinstance(self.gamma, bool) or not isinstance(self.gamma, int)
                                   or not 1 <= self.gamma <= MAX_FIXED_GAMMA):
            raise ValueError(f"gamma (drafts per round) must be \"auto\" (chosen each round from the measured cost "
                             f"profile) or a whole number from 1 to {MAX_FIXED_GAMMA}, got {self.gamma!r}")
        if self.drafter not in DRAFTERS:
            raise ValueError(f"drafter must be one of {', '.join(DRAFTERS)}, got {self.drafter!r}")
        for name in ("max_new_tokens", "seed", "max_unverified", "lookup_ngram", "lookup_tokens", "exit_layer"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be a whole number (int), got {value!r}")
        for name in ("chat", "progressive", "reuse_opening"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        for name in ("temperature", "top_p", "draft_stop"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
                raise ValueError(f"{name} must be a number, got {value!r}")
        for name in ("max_new_tokens", "seed", "temperature", "draft_stop", "lookup_ngram", "lookup_tokens"):
            if not BOUNDS[name].allows(getattr(self, name)):
                raise ValueError(f"{name} must be {BOUNDS[name].allowed}, got {getattr(self, name)!r}")
        if 0.0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(f"temperature={self.temperature!r} is so small that logits overflow: use 0 for greedy "
                             f"decoding or at least {MIN_TEMPERATURE}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p!r}")
        if self.max_unverified < 0:
            raise ValueError(f"max_unverified must be 0 (no bound) or a positive number of tokens, "
                             f"got {self.max_unverified!r}")
        if self.exit_layer < 0:
            raise ValueError(f"exit_layer must be 0 (half the verifier's layers) or a layer count, got {self.exit_layer!r}")
        if self.slim_cache not in ("own", "full"):
            raise ValueError(f"slim_cache must be 'own' or 'full', got {self.slim_cache!r}")
        if not isinstance(self.thresholds, Thresholds):
            raise ValueError(f"thresholds must be a via_sd.Thresholds, got {type(self.thresholds).__name__}: "
                             "use Thresholds(accept=..., escalate=..., signal=...) or Thresholds.preset(name)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def auto_gamma(self) -> bool:
        return self.gamma == AUTO

    @property
    def longest_round(self) -> int:
        """The most drafts a round may have."""
        return MAX_GAMMA if self.auto_gamma else self.gamma

    def to_dict(self) -> dict:
        d = asdict(self)
        d["thresholds"] = self.thresholds.to_dict()
        return d
