"""What a route costs and how close it stays: timed slim vs full forwards, and routes with measured numbers."""

from __future__ import annotations

import statistics
import time
from datetime import datetime, timezone

import torch
from transformers import DynamicCache

from ..core.routing import Route, SlimVerifier, resolve_route
from ..weights.machine import cpu_name
from .cache import model_identity
from .sublayers import skip_set, weight_share
from .teacher import TeacherForced


def device_name(device) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return f"cpu ({cpu_name()}, {torch.get_num_threads()} threads)"


def clock(device) -> float:
    """perf_counter() once the GPU work queued so far is done, on every GPU (a verifier may span several)."""
    if torch.device(device).type == "cuda":
        for index in range(torch.cuda.device_count()):
            torch.cuda.synchronize(index)
    return time.perf_counter()


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

    @torch.inference_mode()
    def step(who: str, tokens: int) -> float:
        t0 = clock(device)
        models[who](input_ids=ids[:, kv_length:kv_length + tokens], past_key_values=caches[who], use_cache=True,
                    logits_to_keep=tokens)
        elapsed = clock(device) - t0
        caches[who].crop(-tokens)
        return elapsed * 1000

    with torch.inference_mode():
        for who in models:
            models[who](input_ids=ids[:, :kv_length], past_key_values=caches[who], use_cache=True, logits_to_keep=1)
    out = {"device": device_name(device), "dtype": str(pair.dtype).replace("torch.", ""),
           "weights_setting": getattr(pair, "weights", "fp32"), "kv_length": kv_length,
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
    out["escalation"] = measure_escalation(slim, ids, kv_length, gamma + 1, repeats)
    return out


@torch.inference_mode()
def measure_escalation(slim: SlimVerifier, ids, kv_length: int, tokens: int, repeats: int) -> dict:
    """An escalating round's full pass after a slim pass: from scratch vs resumed from the slim pass's hidden
    states at the route's first skip (progressive verification). A late first skip shares more."""
    from ..core.progressive import ProgressiveVerifier

    seq = ids[0].tolist()
    shared = ProgressiveVerifier(slim, slim.config.vocab_size, slim.device, slim_cache="own")
    separate = SlimVerifier(slim.verifier, resolve_route("none", slim.config.num_hidden_layers))
    cache = DynamicCache()
    separate(ids[:, :kv_length], past_key_values=cache, logits_to_keep=1)
    for name in ("slim", "full"):
        shared.view(name).logits(seq, kv_length, 1)
    times = {"scratch": [], "resumed": []}
    device = slim.device
    for r in range(repeats + 1):  # the first is a warm-up
        t0 = clock(device)
        separate(ids[:, kv_length:kv_length + tokens], past_key_values=cache, logits_to_keep=tokens)
        t1 = clock(device)
        shared.view("slim").logits(seq, kv_length + tokens, tokens)
        t2 = clock(device)
        shared.view("full").logits(seq, kv_length + tokens, tokens)
        t3 = clock(device)
        cache.crop(-tokens)
        shared.rollback(kv_length)
        if r:
            times["scratch"].append((t1 - t0) * 1000)
            times["resumed"].append((t3 - t2) * 1000)
    ratios = [b / a for a, b in zip(times["scratch"], times["resumed"])]
    return {"tokens": tokens, "shared_sublayers": slim.first_skip, "sublayers": slim.sublayers,
            "full_ms": round(statistics.median(times["scratch"]), 2),
            "resumed_full_ms": round(statistics.median(times["resumed"]), 2),
            "ratio": round(statistics.median(ratios), 3)}


def measure_route(pair, route, texts: dict, gamma: int = 5, kv_length: int = 256, repeats: int = 9,
                  cost: bool = True) -> Route:
    """The route with measured numbers in its meta: for each named text set ("calibration", "held_out")
    the top-1 agreement and KL against the full verifier, the weight shares, and (if `cost`) timings."""
    n = pair.verifier.config.num_hidden_layers
    route = resolve_route(route, n)
    meta = dict(route.meta)
    for key, texts_ in texts.items():
        tf = texts_ if isinstance(texts_, TeacherForced) else TeacherForced(pair.verifier, texts_)
        result = tf.evaluate(skip_set(route))
        meta[key] = {"source": tf.texts.source, "sequences": len(tf.texts.sequences),
                     "scored_tokens": tf.texts.scored_tokens, "top1_agreement": round(result.agreement, 4),
                     "kl": round(result.kl, 5)}
    meta["weights"] = weight_share(pair.verifier, route)
    if cost:
        meta["cost"] = measure_cost(pair, route, gamma, kv_length, repeats)
    meta.setdefault("model", model_identity(pair))
    return Route(route.name, route.skip, n, meta)
