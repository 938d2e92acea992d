"""Route search: which sub-layers the slim verifier skips, found without training.

Goal. For a skip ratio r, find round(r * 2L) sub-layers ("attn.N" / "mlp.N", never in the first or
last layer) whose removal keeps the slim verifier closest to the full verifier on calibration
text: continuations the full verifier generated itself from task prompts, teacher-forced, scored
only on the continuation. Closeness is the mean KL(full || slim) of the next-token distributions;
top-1 agreement is reported beside it (KL is smooth, so it separates candidates that agreement
would tie on a few hundred tokens).

The search, and why this one. Exhaustive search is out of reach (C(52, 25) routes for a 28-layer
verifier), and Bayesian optimisation over subsets needs hundreds of full evaluations before its
surrogate models the interactions between skips. Ranking sub-layers one at a time ignores those
interactions (skips that are harmless alone hurt together). Greedy elimination measures each step
with the earlier skips in place, so it sees interactions, but a plain greedy step measures every
remaining sub-layer: O(L^2) teacher-forced passes, hours on a CPU. We keep the greedy choice and
cut its cost three ways:

1. Lazy greedy (Minoux): every sub-layer is measured once, skipped alone on top of the start route
   (that is the one-at-a-time ranking); each step then re-measures only the sub-layers with the
   smallest stale harm, at most `candidates` of them, and stops early once the best fresh harm is
   no larger than the next stale one (harms mostly grow as more is skipped, so a stale harm is an
   optimistic bound). Screening by block influence 1 - cos(h, h + f(h)) (ShortGPT) was tried first
   and discarded: on the embedded 1.5B it screened out the sub-layers that hurt least.
2. Shared prefix: a candidate at sub-layer k changes nothing before k, so its pass starts from the
   recorded hidden state entering k; the winner's recorded states become the next step's.
3. Local swaps: at each target ratio, swap a skipped sub-layer for a kept one of the same kind
   (attention for attention, MLP for MLP, so the cost stays put) while that lowers the KL.

Objectives: "kl" skips what raises KL least; "kl-per-cost" what raises it least per share of the
weights saved (an MLP of a Qwen-style layer holds 7x the weights of its attention, so the pure KL
objective fills low ratios with cheap-to-skip attention that saves little time).
One greedy run passes through every smaller ratio, so a whole curve (`search_curve`, `--curve`)
costs about one search to its largest ratio.

The files this writes (assets/routes/NAME.json) carry the model, the skipped sub-layers, the
calibration and held-out agreement and KL, the measured cost of a slim forward relative to a full
one (one token and a gamma+1-token verification step, on the named device) and how it was made.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import DynamicCache
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from .routing import ROUTES_DIR, Route, SlimVerifier, resolve_route

MAX_RATIO = 0.9
CALIBRATION_DIR = ROUTES_DIR / "calibration"
BASELINE_DIR = ROUTES_DIR / "baseline"
PROMPTS_DIR = ROUTES_DIR.parent / "prompts"
# (task file, line): prompts outside the benchmark's mixed.jsonl; calibration and held-out never share one.
CALIBRATION_PROMPTS = [("code", 1), ("math", 2), ("qa", 2), ("translation", 3)]
HELD_OUT_PROMPTS = [("code", 2), ("math", 1), ("qa", 1), ("translation", 1), ("summarization", 1)]
CALIBRATION_TOKENS, HELD_OUT_TOKENS = 48, 64
OBJECTIVES = {"kl": "the least KL(full || slim)",
              "kl-per-cost": "the least KL(full || slim) added per unit of weights saved"}
METHOD = ("lazy greedy elimination on calibration text: each step skips the sub-layer that gives {objective}, "
          "re-measuring at most {k} candidates in order of their last measured harm (every sub-layer measured "
          "alone first), each pass starting from the recorded hidden state entering the candidate; then local "
          "swaps of the same kind (attention for attention, MLP for MLP; up to {s} evaluations). Training-free.")


# ---------------------------------------------------------------------------------------------
# Sub-layers and ratios

def sublayer_name(k: int) -> str:
    """Sub-layer k in execution order: 2*layer is the attention, 2*layer+1 the MLP."""
    return f"{'attn' if k % 2 == 0 else 'mlp'}.{k // 2}"


def sublayer_index(name: str) -> int:
    kind, layer = name.split(".")
    return 2 * int(layer) + (kind == "mlp")


def skippable(num_layers: int) -> list[int]:
    """Every sub-layer outside the first and last layer."""
    return list(range(2, 2 * num_layers - 2))


def check_ratio(ratio: float) -> float:
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 <= ratio <= MAX_RATIO:
        raise ValueError(f"skip ratio must lie in [0, {MAX_RATIO}], got {ratio!r}")
    return float(ratio)


def skip_count(num_layers: int, ratio: float) -> int:
    """How many sub-layers a skip ratio means for this verifier; a clear error when it cannot be done."""
    check_ratio(ratio)
    count = round(ratio * 2 * num_layers)
    most = len(skippable(num_layers))
    if count > most:
        raise ValueError(f"skip ratio {ratio} means {count} of {2 * num_layers} sub-layers, but a {num_layers}-layer "
                         f"verifier keeps its first and last layer, so at most {most} "
                         f"(ratio {most / (2 * num_layers):.2f}) can be skipped")
    return count


def _skip_set(route: Route) -> frozenset:
    return frozenset(sublayer_index(s) for s in route.skip)


def _names(skip) -> tuple[str, ...]:
    return tuple(sublayer_name(k) for k in sorted(skip))


# ---------------------------------------------------------------------------------------------
# Texts the slim and full verifier are compared on

@dataclass
class Calibration:
    """Token sequences compared teacher-forced: the tokens from `starts[i]` on are scored, the rest is context."""

    sequences: list[list[int]]
    starts: list[int]
    source: str = ""
    prompts: list[str] = field(default_factory=list)

    def __post_init__(self):
        if not self.sequences or len(self.sequences) != len(self.starts):
            raise ValueError("calibration needs at least one sequence and one start per sequence")
        for seq, start in zip(self.sequences, self.starts):
            if not 1 <= start < len(seq):
                raise ValueError(f"a calibration sequence of {len(seq)} tokens cannot be scored from token {start}")

    @property
    def scored_tokens(self) -> int:
        return sum(len(seq) - start for seq, start in zip(self.sequences, self.starts))

    def to_dict(self) -> dict:
        return {"source": self.source, "prompts": self.prompts, "starts": self.starts, "sequences": self.sequences}

    @classmethod
    def from_dict(cls, data: dict) -> "Calibration":
        return cls([list(map(int, s)) for s in data["sequences"]], [int(s) for s in data["starts"]],
                   data.get("source", ""), list(data.get("prompts", [])))


def task_prompts(picks) -> list[str]:
    """Prompts from assets/prompts/<task>.jsonl at the given line numbers."""
    prompts = []
    for task, line in picks:
        rows = (PROMPTS_DIR / f"{task}.jsonl").read_text(encoding="utf-8").splitlines()
        prompts.append(json.loads(rows[line])["prompt"])
    return prompts


def generate_calibration(pair, prompts: list[str], max_new_tokens: int, source: str = "", progress=None) -> Calibration:
    """The full verifier's own greedy continuations of `prompts` (through the chat template when there is one)."""
    from .decoding import DecodeConfig, generate

    config = DecodeConfig(max_new_tokens=max_new_tokens, temperature=0.0)
    sequences, starts = [], []
    for i, prompt in enumerate(prompts):
        _report(progress, f"calibration: the full verifier continues prompt {i + 1}/{len(prompts)}", i / len(prompts))
        prompt_ids = pair.encode(prompt, chat=config.chat)
        trace = generate(pair, prompt, "ar", config)
        sequences.append(prompt_ids + trace.token_ids)
        starts.append(len(prompt_ids))
    return Calibration(sequences, starts, source, list(prompts))


def text_calibration(tokenizer, text: str, source: str, chunk: int = 256) -> Calibration:
    """Plain text as calibration: cut into chunks, every token after a chunk's first is scored."""
    ids = tokenizer(text).input_ids
    chunks = [ids[i:i + chunk] for i in range(0, len(ids), chunk)]
    chunks = [c for c in chunks if len(c) >= 2]
    if not chunks:
        raise ValueError(f"{source} holds too little text to calibrate on")
    return Calibration(chunks, [1] * len(chunks), source)


def calibration_from_file(pair, path: str, progress=None) -> Calibration:
    """A user-given file: prompts (.jsonl, continued by the full verifier), a calibration .json, or plain text."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"calibration file {path} does not exist")
    if file.suffix == ".jsonl":
        prompts = [json.loads(line)["prompt"] for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
        return generate_calibration(pair, prompts, CALIBRATION_TOKENS, f"{file.name}: full-verifier continuations",
                                    progress)
    if file.suffix == ".json":
        data = json.loads(file.read_text(encoding="utf-8"))
        return Calibration.from_dict(data.get("calibration", data))
    return text_calibration(pair.tokenizer, file.read_text(encoding="utf-8"), f"{file.name}: plain text")


def model_identity(pair) -> dict:
    """Which verifier a route or calibration file belongs to."""
    cfg = pair.verifier.config
    return {"verifier": pair.verifier_name, "architecture": type(pair.verifier).__name__,
            "num_layers": cfg.num_hidden_layers, "hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size,
            "parameters": sum(p.numel() for p in pair.verifier.parameters())}


def _same_model(saved: dict | None, identity: dict) -> bool:
    keys = ("verifier", "num_layers", "hidden_size")
    return isinstance(saved, dict) and all(saved.get(k) == identity[k] for k in keys)


def route_cache_dir() -> Path:
    """Where routes searched for models without a shipped one are kept: $VIA_SD_CACHE/routes or
    ~/.cache/via-sd/routes."""
    from .embedded import cache_root

    return cache_root() / "routes"


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


def default_texts(pair, progress=None, save_to: Path | None = None) -> tuple[Calibration, Calibration]:
    """(calibration, held-out) texts for this verifier: a shipped or cached file, else generated now and cached."""
    identity = model_identity(pair)
    for folder in (CALIBRATION_DIR, route_cache_dir() / "calibration"):
        for path in sorted(folder.glob("*.json")):
            data = json.loads(path.read_text(encoding="utf-8"))
            if _same_model(data.get("model"), identity):
                return Calibration.from_dict(data["calibration"]), Calibration.from_dict(data["held_out"])
    calibration = generate_calibration(pair, task_prompts(CALIBRATION_PROMPTS), CALIBRATION_TOKENS,
                                       "assets/prompts: full-verifier continuations", progress)
    held_out = generate_calibration(pair, task_prompts(HELD_OUT_PROMPTS), HELD_OUT_TOKENS,
                                    "assets/prompts (other prompts): full-verifier continuations", progress)
    path = save_to or route_cache_dir() / "calibration" / f"{_slug(pair.verifier_name)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"model": identity, "calibration": calibration.to_dict(),
                                "held_out": held_out.to_dict()}), encoding="utf-8")
    return calibration, held_out


# ---------------------------------------------------------------------------------------------
# Teacher-forced comparison of a route with the full verifier

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


def _report(progress, message: str, fraction: float) -> None:
    if progress is not None:
        progress(message, min(max(fraction, 0.0), 1.0))


def _stopped(stop) -> bool:
    return stop is not None and stop.is_set()


# ---------------------------------------------------------------------------------------------
# The search

def search_route(pair, skip_ratio: float, calibration, *, name: str | None = None, **options) -> Route:
    """The route of `skip_ratio` whose slim verifier stays closest to the full one on `calibration`
    (options: see `search_curve`)."""
    return search_curve(pair, [skip_ratio], calibration, names=[name] if name else None, **options)[-1]


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
    verifier = pair.verifier
    n = verifier.config.num_hidden_layers
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
    t0 = time.perf_counter()
    tf = calibration if isinstance(calibration, TeacherForced) else TeacherForced(verifier, calibration)
    sizes, _ = sublayer_sizes(verifier)
    weight = {k: sizes[k] / max(sizes) if objective == "kl-per-cost" else 1.0 for k in skippable(n)}
    current = tf.evaluate(_skip_set(begin), record=True)
    remaining = [k for k in skippable(n) if k not in current.skip]
    planned = len(remaining) + (targets[-1] - len(current.skip)) * candidates + swaps * len(ratios)
    harm = {}  # KL added by each sub-layer, as last measured (stale for all but the latest step)
    added = {}  # KL each skipped sub-layer added when it was chosen
    done, steps, accepted, routes = 0, [], [], []

    def tell(message: str) -> None:
        _report(progress, f"route search: {message}", done / max(planned, 1))

    def measure(skip, at: int, base: Pass) -> Pass:
        """A recorded pass under `skip`, resumed from base's state entering sub-layer `at`."""
        nonlocal done
        if _stopped(stop):
            raise KeyboardInterrupt
        done += 1
        return tf.evaluate(skip, start=at, base=base, record=True)

    def priority(k: int) -> float:
        return harm[k] / weight[k]

    def route(name: str, ratio: float, stopped: bool) -> Route:
        meta = {"skip_ratio": ratio,
                "calibration": {"source": tf.texts.source, "sequences": len(tf.texts.sequences),
                                "scored_tokens": tf.texts.scored_tokens,
                                "top1_agreement": round(current.agreement, 4), "kl": round(current.kl, 5)},
                "method": METHOD.format(objective=OBJECTIVES[objective], k=candidates, s=swaps),
                "search": {"objective": objective, "candidates_per_step": candidates, "swap_budget": swaps,
                           "swaps_accepted": list(accepted), "evaluations": done,
                           "seconds": round(time.perf_counter() - t0, 1), "device": device_name(tf.view.device),
                           "started_from": list(begin.skip), "greedy_steps": list(steps), "stopped": stopped},
                "model": model_identity(pair)}
        return Route(name, _names(current.skip), n, meta)

    try:
        if len(current.skip) < targets[-1]:
            for k in remaining:  # every sub-layer once, alone on top of the start route
                harm[k] = measure(current.skip | {k}, k, current).kl - current.kl
                tell(f"measured {sublayer_name(k)} alone: KL +{harm[k]:.4f}")
        for target, ratio, name in zip(targets, ratios, names):
            while len(current.skip) < target:
                best = None
                for k in sorted(harm, key=priority)[:candidates]:
                    if best is not None and priority(chosen) <= priority(k):
                        break  # the stale harms left can only be larger once re-measured
                    trial = measure(current.skip | {k}, k, current)
                    harm[k] = trial.kl - current.kl
                    tell(f"{len(current.skip) + 1}/{targets[-1]} skipped, tried {sublayer_name(k)}: KL {trial.kl:.4f}")
                    if best is None or priority(k) < priority(chosen):
                        best, chosen = trial, k
                added[chosen] = harm.pop(chosen)
                current = best
                steps.append({"skip": sublayer_name(chosen), "kl": round(current.kl, 5),
                              "agreement": round(current.agreement, 4)})
                tell(f"step {len(current.skip)}/{targets[-1]}: skip {sublayer_name(chosen)} -> KL {current.kl:.4f}, "
                     f"agreement {current.agreement:.3f}")
            current = _local_swaps(current, added, harm, priority, swaps, measure, tell, accepted)
            routes.append(route(name, ratio, stopped=False))
    except KeyboardInterrupt:
        tell(f"stopped: keeping the route so far ({len(current.skip)} sub-layers)")
        routes.append(route(names[len(routes)], len(current.skip) / (2 * n), stopped=True))
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
        if _stopped(stop):
            raise KeyboardInterrupt
        trial = tf.evaluate({k}, start=k, base=base)
        rows.append({"sublayer": sublayer_name(k), "agreement": trial.agreement, "kl": trial.kl})
        _report(progress, f"one at a time: {sublayer_name(k)} agreement {trial.agreement:.3f}", (i + 1) / len(sublayers))
    return sorted(rows, key=lambda r: (-r["agreement"], r["kl"]))


def one_at_a_time_route(pair, ranking: list[dict], skip_ratio: float, name: str | None = None) -> Route:
    """The `skip_ratio` least harmful sub-layers of a one-at-a-time ranking, skipped together."""
    n = pair.verifier.config.num_hidden_layers
    skip = frozenset(sublayer_index(r["sublayer"]) for r in ranking[:skip_count(n, skip_ratio)])
    meta = {"skip_ratio": skip_ratio, "model": model_identity(pair),
            "method": "one-at-a-time baseline: each sub-layer skipped alone on the calibration text, the least "
                      "harmful by top-1 agreement (then KL) skipped together; no search"}
    return Route(name or f"one-at-a-time-s{round(100 * skip_ratio):02d}", _names(skip), n, meta)


# ---------------------------------------------------------------------------------------------
# Measuring a route

def device_name(device) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu ({cpu}, {torch.get_num_threads()} threads)"


def sublayer_sizes(verifier) -> tuple[list[int], int]:
    """Parameters of every sub-layer in execution order (norms included), and of the whole forward
    (embedding lookup excluded, output head included): decode reads each of them once per step."""
    base, head = verifier.base_model, verifier.get_output_embeddings()

    def count(*modules) -> int:
        return sum(p.numel() for m in modules for p in m.parameters())

    sizes = []
    for layer in base.layers:
        if hasattr(layer, "pre_feedforward_layernorm"):  # Gemma: two norms around each sub-layer
            sizes += [count(layer.self_attn, layer.input_layernorm, layer.post_attention_layernorm),
                      count(layer.mlp, layer.pre_feedforward_layernorm, layer.post_feedforward_layernorm)]
        else:
            sizes += [count(layer.self_attn, layer.input_layernorm), count(layer.mlp, layer.post_attention_layernorm)]
    return sizes, sum(sizes) + count(base.norm, head)


def weight_share(verifier, route: Route) -> dict:
    """Parameter shares (a noise-free proxy of decode cost): `read` = the share a slim forward uses;
    `shared_prefix` = the share before the first skipped sub-layer, which an escalating round could
    reuse from the slim pass instead of recomputing."""
    sizes, total = sublayer_sizes(verifier)
    skip = _skip_set(route)
    first = min(skip) if skip else len(sizes)
    return {"read": round(1 - sum(sizes[k] for k in skip) / total, 4),
            "shared_prefix": round(sum(sizes[:first]) / total, 4)}


def measure_cost(pair, route: Route, gamma: int = 5, kv_length: int = 256, repeats: int = 9) -> dict:
    """Time of a slim forward relative to a full one, for one token and a gamma+1-token verification step,
    both after a KV cache of `kv_length` tokens; paired, interleaved repeats, median of the per-repeat ratios."""
    verifier = pair.verifier
    slim = SlimVerifier(verifier, resolve_route(route, verifier.config.num_hidden_layers))
    device = slim.device
    ids = torch.randint(0, min(pair.vocab_size, 30000), (1, kv_length + gamma + 1),
                        generator=torch.Generator().manual_seed(0)).to(device)
    models = {"full": verifier, "slim": slim}
    caches = {who: DynamicCache() for who in models}

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    @torch.inference_mode()
    def step(who: str, tokens: int) -> float:
        sync()
        t0 = time.perf_counter()
        models[who](input_ids=ids[:, kv_length:kv_length + tokens], past_key_values=caches[who], use_cache=True,
                    logits_to_keep=tokens)
        sync()
        elapsed = time.perf_counter() - t0
        caches[who].crop(-tokens)
        return elapsed * 1000

    with torch.inference_mode():
        for who in models:
            models[who](input_ids=ids[:, :kv_length], past_key_values=caches[who], use_cache=True, logits_to_keep=1)
    out = {"device": device_name(device), "dtype": str(pair.dtype).replace("torch.", ""), "kv_length": kv_length,
           "gamma": gamma, "repeats": repeats, "torch": torch.__version__,
           "measured": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    for key, tokens in (("one_token", 1), ("verify_step", gamma + 1)):
        for who in models:  # warm-up
            step(who, tokens)
        times = {"full": [], "slim": []}
        for r in range(repeats):
            for who in (("full", "slim") if r % 2 == 0 else ("slim", "full")):
                times[who].append(step(who, tokens))
        ratios = [s / f for s, f in zip(times["slim"], times["full"])]
        out[key] = {"tokens": tokens, "full_ms": round(statistics.median(times["full"]), 2),
                    "slim_ms": round(statistics.median(times["slim"]), 2),
                    "ratio": round(statistics.median(ratios), 3)}
    return out


def measure_route(pair, route, texts: dict, gamma: int = 5, kv_length: int = 256, repeats: int = 9,
                  cost: bool = True) -> Route:
    """The route with measured numbers in its meta: for each named text set ("calibration", "held_out")
    the top-1 agreement and KL against the full verifier, the weight shares, and (if `cost`) timings."""
    n = pair.verifier.config.num_hidden_layers
    route = resolve_route(route, n)
    meta = dict(route.meta)
    for key, texts_ in texts.items():
        tf = texts_ if isinstance(texts_, TeacherForced) else TeacherForced(pair.verifier, texts_)
        result = tf.evaluate(_skip_set(route))
        meta[key] = {"source": tf.texts.source, "sequences": len(tf.texts.sequences),
                     "scored_tokens": tf.texts.scored_tokens, "top1_agreement": round(result.agreement, 4),
                     "kl": round(result.kl, 5)}
    meta["weights"] = weight_share(pair.verifier, route)
    if cost:
        meta["cost"] = measure_cost(pair, route, gamma, kv_length, repeats)
    meta.setdefault("model", model_identity(pair))
    return Route(route.name, route.skip, n, meta)


# ---------------------------------------------------------------------------------------------
# A route for a pair loaded without one

def default_search(verifier) -> tuple[float, str]:
    """(skip ratio, objective) for a verifier without a route. From 6B parameters up, the paper's 45% of
    sub-layers, closest to the full model; below, where skips hurt more (measured on the embedded 1.5B:
    see assets/routes/embedded-*.json), 10% spent where they save the most weights per unit of KL."""
    params = sum(p.numel() for p in verifier.parameters())
    return (0.45, "kl") if params >= 6e9 else (0.1, "kl-per-cost")


def saved_routes(identity: dict | None = None) -> list[tuple[Path, dict]]:
    """(path, data) of shipped, baseline and cached route files, those of one model if `identity` is given."""
    found = []
    for folder in (ROUTES_DIR, BASELINE_DIR, route_cache_dir()):
        for path in sorted(folder.glob("*.json")):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(data, dict) and "skip" in data and (identity is None or _same_model(data.get("model"),
                                                                                               identity)):
                found.append((path, data))
    return found


def route_for(pair, progress=None, skip_ratio: float | None = None, stop=None) -> Route:
    """The route for a pair loaded without one: a shipped or cached route made for this verifier, else one
    searched now (calibration text generated by the full verifier) and cached for next time."""
    identity = model_identity(pair)
    n = identity["num_layers"]
    ratio, objective = default_search(pair.verifier)
    ratio = ratio if skip_ratio is None else skip_ratio
    target = skip_count(n, ratio)
    matches = [(p, d) for p, d in saved_routes(identity) if p.parent != BASELINE_DIR and len(d["skip"]) == target
               and not d.get("search", {}).get("stopped")]
    if matches:
        path, data = matches[0]
        return resolve_route(str(path), n)
    _report(progress, f"no route for {pair.verifier_name} yet: searching one (skip ratio {ratio}), cached afterwards",
            0.0)
    calibration, held_out = default_texts(pair, progress)
    route = search_route(pair, ratio, calibration, name=f"{_slug(pair.verifier_name)}-s{round(100 * ratio):02d}",
                         objective=objective, progress=progress, stop=stop)
    if route.meta["search"]["stopped"]:
        return route  # not cached: an interrupted search is not the route for this ratio
    route = measure_route(pair, route, {"held_out": held_out}, repeats=5)
    path = route_cache_dir() / f"{route.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(route.to_json(), encoding="utf-8")
    _report(progress, f"route cached at {path}", 1.0)
    return resolve_route(str(path), n)


# ---------------------------------------------------------------------------------------------
# Command line

def _method(data: dict) -> str:
    method = data.get("method", "")
    return data.get("search", {}).get("objective") or next(
        (word for word in ("one-at-a-time", "provisional") if method.startswith(word)), "other")


def _row(name: str, data: dict) -> str:
    cost, weights = data.get("cost", {}), data.get("weights", {})
    cal, held = data.get("calibration", {}), data.get("held_out", {})
    mlp = sum(s.startswith("mlp") for s in data["skip"])

    def num(d: dict, key: str) -> str:
        return f"{d[key]:.3f}" if isinstance(d.get(key), (int, float)) else "-"

    return (f"{name:<36} {_method(data):<13} {len(data['skip']):>3} {mlp:>3} {data.get('skip_fraction', 0):>5.2f} "
            f"{num(weights, 'read'):>5} {num(cost.get('one_token', {}), 'ratio'):>5} "
            f"{num(cost.get('verify_step', {}), 'ratio'):>6} {num(cal, 'top1_agreement'):>7} {num(cal, 'kl'):>6} "
            f"{num(held, 'top1_agreement'):>8} {num(held, 'kl'):>7}")


HEADER = (f"{'route':<36} {'method':<13} {'skp':>3} {'mlp':>3} {'ratio':>5} {'read':>5} {'cost1':>5} {'cost_v':>6} "
          f"{'cal_agr':>7} {'cal_kl':>6} {'held_agr':>8} {'held_kl':>7}")
LEGEND = ("skp / mlp: sub-layers skipped / of them MLPs; ratio: skipped share of sub-layers; read: share of the "
          "weights a slim forward reads; cost1 / cost_v: measured slim / full forward time for 1 token / gamma+1 "
          "tokens; cal / held: top-1 agreement and KL against the full verifier on calibration / held-out text")


def _verifier_name(args) -> str | None:
    from .embedded import EMBEDDED_VERIFIER
    from .models import PRESETS

    source = args.verifier or PRESETS.get(args.preset or ("embedded" if not args.drafter else ""), {}).get("verifier")
    return {"embedded:verifier": f"{EMBEDDED_VERIFIER} (embedded)", "random:verifier": "random-llama-4L"}.get(source,
                                                                                                             source)


def cmd_report(args) -> int:
    """Prints the agreement-versus-cost curve of every saved route for the pair (no model is loaded)."""
    name = _verifier_name(args)
    rows = [(p, d) for p, d in saved_routes()
            if not name or isinstance(d.get("model"), dict) and d["model"].get("verifier") == name]
    if not rows:
        print(f"no saved routes for {name}; make some with `python -m via_sd route --skip-ratio R --out FILE`")
        return 1
    # one curve per method, cheapest last: agreement falls as the cost does
    rows.sort(key=lambda pd: (_method(pd[1]), -pd[1].get("weights", {}).get("read", 1.0), pd[0].stem))
    print(f"agreement versus cost of the saved routes for {name}")
    print(HEADER)
    for path, data in rows:
        label = path.stem if path.parent == ROUTES_DIR else f"{path.parent.name}/{path.stem}"
        print(_row(label, data))
    devices = sorted({d.get("cost", {}).get("device") for _, d in rows} - {None})
    print(LEGEND)
    if devices:
        print("costs measured on: " + "; ".join(devices))
    return 0


def cmd_route(args) -> int:
    if args.report:
        return cmd_report(args)
    from .__main__ import pair_from_args

    ratios = [float(r) for r in args.curve.split(",")] if args.curve else [args.skip_ratio]
    for r in ratios:
        check_ratio(r)  # fails before minutes of model loading
    pair = pair_from_args(args)
    n = pair.verifier.config.num_hidden_layers
    for r in ratios:
        skip_count(n, r)

    def progress(message: str, fraction: float) -> None:
        print(f"[{fraction:4.0%}] {message}", file=sys.stderr, flush=True)

    calibration = held_out = None
    if args.calibration:
        calibration = calibration_from_file(pair, args.calibration, progress)
    if args.held_out:
        held_out = calibration_from_file(pair, args.held_out, progress)
    if calibration is None or held_out is None:
        default_calibration, default_held_out = default_texts(pair, progress)
        calibration, held_out = calibration or default_calibration, held_out or default_held_out
    progress(f"calibration: {calibration.scored_tokens} scored tokens in {len(calibration.sequences)} sequences; "
             f"held-out: {held_out.scored_tokens}", 0.0)
    cal_tf = TeacherForced(pair.verifier, calibration)
    held_tf = TeacherForced(pair.verifier, held_out)
    measure = dict(gamma=args.gamma, kv_length=args.kv_length, repeats=args.repeats, cost=not args.no_cost)

    def write(route: Route, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(route.to_json() + "\n", encoding="utf-8")
        print(_row(route.name, route.to_dict()), flush=True)
        progress(f"wrote {path}", 1.0)

    print(HEADER)
    if args.measure:  # re-measure an existing route (e.g. a hand-written one) and write it with numbers
        route = measure_route(pair, args.measure, {"calibration": cal_tf, "held_out": held_tf}, **measure)
        from .routing import shipped_routes

        write(route, Path(args.out) if args.out else shipped_routes().get(args.measure, Path(args.measure)))
        return 0
    if args.baseline:
        ranking = rank_one_at_a_time(pair, cal_tf, progress)
        for r in ratios:
            route = one_at_a_time_route(pair, ranking, r, name=f"{args.prefix}-one-at-a-time-s{round(100 * r):02d}")
            route = measure_route(pair, route, {"calibration": cal_tf, "held_out": held_tf}, **measure)
            write(route, Path(args.out_dir or BASELINE_DIR) / f"{route.name}.json")
        return 0
    ratios = sorted(ratios)
    single = args.out and not args.curve
    names = [Path(args.out).stem] if single else [f"{args.prefix}-s{round(100 * r):02d}" for r in ratios]
    routes = search_curve(pair, ratios, cal_tf, start=args.start, objective=args.objective,
                          candidates=args.candidates, swaps=args.swaps, names=names, progress=progress)
    for route in routes:
        path = Path(args.out) if single else Path(args.out_dir or ROUTES_DIR) / f"{route.name}.json"
        if route.meta["search"]["stopped"]:
            write(route, path)
            progress("stopped early: the route above has fewer sub-layers than asked and no held-out numbers", 1.0)
            return 130
        route = measure_route(pair, route, {"held_out": held_tf}, **measure)
        made = {"by": "python -m via_sd route", "date": datetime.now(timezone.utc).strftime("%Y-%m-%d")}
        write(Route(route.name, route.skip, n, {**route.meta, "made": made}), path)
    return 0


def add_parser(sub, add_pair_arguments) -> None:
    parser = sub.add_parser("route", help="search, measure or report slim-verifier routes",
                            description="Search (without training) which sub-layers the slim verifier skips, "
                                        "measure routes, or print the agreement-versus-cost curve.")
    add_pair_arguments(parser)
    parser.add_argument("--skip-ratio", type=float, default=0.45, help="share of sub-layers to skip, in [0, 0.9]")
    parser.add_argument("--out", help="route file to write (default assets/routes/PREFIX-sNN.json)")
    parser.add_argument("--curve", help="several ratios, e.g. 0.1,0.2,0.3,0.45: one search passes through all, "
                                        "one file each in --out-dir")
    parser.add_argument("--out-dir", help="folder for --curve / --baseline files (default assets/routes)")
    parser.add_argument("--prefix", default="custom", help="file name prefix for --curve / --baseline routes")
    parser.add_argument("--from", dest="start", help="continue the search from this smaller route")
    parser.add_argument("--calibration", help="calibration text: prompts .jsonl (continued by the full verifier), "
                                              "a calibration .json, or a plain text file")
    parser.add_argument("--held-out", help="held-out text to report agreement on (same formats; default: "
                                           "continuations of other task prompts)")
    parser.add_argument("--objective", choices=list(OBJECTIVES), default="kl",
                        help="kl: closest to the full verifier; kl-per-cost: least KL added per weight saved")
    parser.add_argument("--candidates", type=int, default=4, help="exactly measured candidates per greedy step")
    parser.add_argument("--swaps", type=int, default=8, help="evaluations for the final local swaps")
    parser.add_argument("--report", action="store_true", help="print the agreement-vs-cost curve of saved routes")
    parser.add_argument("--baseline", action="store_true", help="write one-at-a-time baseline routes instead")
    parser.add_argument("--measure", help="measure this route (name or file) and write it with its numbers")
    parser.add_argument("--gamma", type=int, default=5, help="draft length for the gamma+1-token cost")
    parser.add_argument("--kv-length", type=int, default=256, help="KV cache length for the cost measurement")
    parser.add_argument("--repeats", type=int, default=9, help="timing repeats (interleaved slim/full)")
    parser.add_argument("--no-cost", action="store_true", help="skip the timing measurement")
    parser.set_defaults(run=cmd_route)
