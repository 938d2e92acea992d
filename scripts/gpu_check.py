"""The GPU check: the real decode loop and forward-pass costs at verification shapes. Needs no download.

    python scripts/gpu_check.py                      # GPU: Qwen2.5 0.5B -> 7B, bf16; JSON to $OUT/gpu_check.json
    python scripts/gpu_check.py --out FILE.json      # ... or to FILE.json
    python scripts/gpu_check.py --cpu-smoke --out /tmp/check.json   # the same, tiny and on CPU, seconds
    python scripts/gpu_check.py --pair embedded --device cpu --out ...  # the embedded pair's shapes

Builds random-weight models from the real configurations (written inline below), then
1. decodes: `via_sd.generate` with AR, SD, VIA-SD (the engine's defaults; progressive with the slim
   view's own cache; separate slim / full passes) and VIA-SD under the `lossless` thresholds, greedy,
   --decode-tokens new tokens each, and reports whether greedy SD equals AR (and if not, where it first
   differs and the verifier's logit margin there), whether progressive equals separate, whether
   lossless equals SD, the time and tokens/s of each method, and any error (a failing method is
   reported, the others still run);
2. times forward passes over n new tokens for n in --lengths after --context cached tokens: the
   drafter (1 logit row kept), the full verifier and the slim verifier of each route (gamma+1 rows
   kept, as when verifying); each time is the median of --iters calls after warm-up calls, with every
   GPU synchronized around each call; the cache is cut back after every call.
Random weights decode nonsense and rarely agree (acceptance near 0, every round rejects): the decode
part checks mechanics, exactness and devices, not speed-ups. The slim verifier is via_sd's own
(routing.SlimVerifier), the one forward the engine and route search run. One JSON file comes out; feed
it to `python -m via_sd bench ... --gpu-costs FILE`, which prices the forward calls recorded in real
traces with it (a projection, labelled as such). Sized for a few minutes on one H200 (not yet run on
one: no GPU was lent while it was written; `--cpu-smoke` is tested in tests/test_exact.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from via_sd import DecodeConfig, ModelPair, Thresholds, generate  # noqa: E402
from via_sd.core.pair import char_tokenizer  # noqa: E402
from via_sd.core.provisional import provisional_route  # noqa: E402
from via_sd.core.routing import SlimVerifier, resolve_route, shipped_routes  # noqa: E402

_QWEN = dict(hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-6,
             rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"}, use_sliding_window=False,
             attention_dropout=0.0)
QWEN25_05B = dict(_QWEN, vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True)
QWEN25_15B = dict(_QWEN, vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                  num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True)
QWEN25_7B = dict(_QWEN, vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                 num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False)
TINY_DRAFTER = dict(_QWEN, vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
TINY_VERIFIER = dict(TINY_DRAFTER, num_hidden_layers=4)

PAIRS = {
    "gpu": {"drafter": ("Qwen2.5-0.5B-Instruct", QWEN25_05B), "verifier": ("Qwen2.5-7B-Instruct", QWEN25_7B)},
    "embedded": {"drafter": ("Qwen2.5-Coder-0.5B-Instruct", QWEN25_05B),
                 "verifier": ("Qwen2.5-Coder-1.5B-Instruct", QWEN25_15B)},
    "tiny": {"drafter": ("tiny-qwen2-2L", TINY_DRAFTER), "verifier": ("tiny-qwen2-4L", TINY_VERIFIER)},
}
DEFAULT_LENGTHS = "1,2,3,4,5,6,8,12,16,24,32,64,128,256,512"
TINY_ROUTE = "attn.1,mlp.2"
PROMPT = "Write a function that returns the n-th Fibonacci number, then explain how it works.\n"
EOS = 1  # the char tokenizer's end-of-sequence id, kept out of random models' outputs so every run is full length
SMOKE = ["--device", "cpu", "--tiny", "--lengths", "1,2,6", "--iters", "1", "--warmup", "0", "--context", "16",
         "--decode-tokens", "24"]


def build(config_kwargs: dict, device: torch.device, dtype: torch.dtype):
    """A random-weight Qwen2 causal LM made directly on `device` in `dtype`, end-of-sequence suppressed."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(Qwen2Config(**config_kwargs))
    finally:
        torch.set_default_dtype(previous)
    suppress = torch.zeros(model.config.vocab_size, device=device, dtype=dtype)
    suppress[EOS] = float("-inf")
    model.lm_head.register_forward_hook(lambda _m, _i, out: out + suppress)
    model.generation_config.eos_token_id = None
    return model.eval()


def sync() -> None:
    """Waits for every GPU: a verifier may be spread over several."""
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            torch.cuda.synchronize(index)


def routes_for(args, num_layers: int) -> dict:
    """label -> Route: the --route values, else every shipped route made for this many layers, else the
    provisional rule's route."""
    if args.route:
        wanted = args.route
    elif args.tiny:
        wanted = [TINY_ROUTE]
    else:
        wanted = [name for name, path in shipped_routes().items()
                  if json.loads(path.read_text()).get("num_layers") in (None, num_layers)]
    out = {}
    for text in wanted:
        spec = [s.strip() for s in text.split(",") if s.strip()] if "," in text or text.startswith(("attn.", "mlp.")) \
            else text
        route = resolve_route(spec, num_layers)
        out[route.name if route.name != "custom" else ",".join(route.skip)] = route
    if not out:
        route = provisional_route(num_layers)
        out[route.name] = route
    return out


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where two token lists differ (a length difference counts), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@torch.inference_mode()
def margin_at(pair: ModelPair, prompt_ids: list[int], tokens: list[int], i: int, other: int) -> dict:
    """The full verifier's logits at output position i (one pass over the prefix): its top two and the two
    tokens the runs chose; a tiny gap means a near-tie that batch-shape rounding can flip."""
    ids = torch.tensor([prompt_ids + tokens[:i]], device=pair.slim.device)
    logits = pair.verifier(ids, logits_to_keep=1).logits[0, -1, :pair.vocab_size].float()
    top = torch.topk(logits, 2)
    return {"index": i, "tokens": [tokens[i], other] if i < len(tokens) else None,
            "logits": [float(logits[tokens[i]]), float(logits[other])] if i < len(tokens) and other is not None
            else None, "top2_gap": float(top.values[0] - top.values[1])}


def compare(pair, prompt_ids, reference: list[int], other: list[int]) -> dict:
    i = first_difference(reference, other)
    if i is None:
        return {"equal": True}
    out = {"equal": False, "first_difference": i, "agreeing_share": sum(
        x == y for x, y in zip(reference, other)) / max(len(reference), 1)}
    if i < min(len(reference), len(other)):
        out["at_first_difference"] = margin_at(pair, prompt_ids, reference, i, other[i])
    return out


def decode_check(drafter, verifier, route, names, device, dtype, tokens: int, gamma: int, errors: list) -> dict:
    """AR, SD, VIA-SD (progressive, separate, lossless) through via_sd.generate on the built models."""
    weights = {torch.bfloat16: "bf16", torch.float32: "fp32"}.get(dtype, str(dtype).replace("torch.", ""))
    pair = ModelPair(drafter, verifier, SlimVerifier(verifier, route), char_tokenizer(), names[0], names[1], device,
                     dtype, weights)
    runs = {"ar": ("ar", {}), "sd": ("sd", {}), "via": ("via", {}),  # the engine's defaults (progressive)
            "via_own_cache": ("via", {"progressive": True, "slim_cache": "own"}),
            "via_separate": ("via", {"progressive": False}),
            "via_lossless": ("via", {"thresholds": Thresholds.preset("lossless")})}
    results, ids = {}, {}
    for label, (method, extra) in runs.items():
        options = {"thresholds": Thresholds.preset("paper"), **extra}
        config = DecodeConfig(gamma=gamma, max_new_tokens=tokens, temperature=0.0, **options)
        print(f"decode: {label} ({tokens} tokens)", file=sys.stderr, flush=True)
        try:
            sync()
            t0 = time.perf_counter()
            trace = generate(pair, PROMPT, method, config)
            sync()
            seconds = time.perf_counter() - t0
        except Exception as err:  # a device error in one method is a finding; the others still run
            errors.append({"where": f"decode {label}", "error": repr(err), "traceback": traceback.format_exc()})
            continue
        ids[label] = trace.token_ids
        summary = trace.summary
        results[label] = {"new_tokens": len(trace.token_ids), "seconds": round(seconds, 3),
                          "tokens_per_s": round(len(trace.token_ids) / seconds, 2), "rounds": len(trace.rounds),
                          "full_calls": summary.get("full_calls"), "tier_counts": summary.get("tier_counts"),
                          "mean_accepted_length": summary.get("mean_accepted_length")}
    prompt_ids = pair.encode(PROMPT)
    out = {"prompt_tokens": len(prompt_ids), "max_new_tokens": tokens, "gamma": gamma, "route": list(route.skip),
           "thresholds": "paper", "methods": results}
    # progressive with the slim view's own cache is the same slim network as separate passes; the default
    # slim_cache="full" (the slim view reads the full verifier's cache) is a different one by design
    for key, (a, b) in {"sd_equals_ar": ("ar", "sd"), "progressive_equals_separate": ("via_separate", "via_own_cache"),
                        "lossless_equals_sd": ("sd", "via_lossless")}.items():
        out[key] = compare(pair, prompt_ids, ids[a], ids[b]) if a in ids and b in ids else {"equal": None}
    return out


@torch.inference_mode()
def time_forward(forward, vocab: int, context: int, n: int, keep: int, iters: int, warmup: int) -> float:
    """Median ms of a forward over n new tokens after `context` cached tokens."""
    gen = torch.Generator(device="cpu").manual_seed(n)
    cache = DynamicCache()
    device = forward.device
    forward(input_ids=torch.randint(vocab, (1, context), generator=gen).to(device), past_key_values=cache,
            use_cache=True, logits_to_keep=1)
    ids = torch.randint(vocab, (1, n), generator=gen).to(device)
    times = []
    for i in range(warmup + iters):
        sync()
        start = time.perf_counter()
        logits = forward(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=keep).logits
        torch.softmax(logits.float(), dim=-1)  # the engine turns every kept row into probabilities
        sync()
        if i >= warmup:
            times.append((time.perf_counter() - start) * 1000.0)
        cache.crop(-n)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", choices=sorted(PAIRS), default="gpu", help="whose configurations to build")
    parser.add_argument("--tiny", action="store_true", help="tiny configs (same as --pair tiny): a quick check")
    parser.add_argument("--cpu-smoke", action="store_true", help="everything, tiny, on CPU: " + " ".join(SMOKE))
    parser.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None,
                        help="default: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--route", action="append", help="slim route (name, .json or attn.3,attn.4); repeatable")
    parser.add_argument("--gamma", type=int, default=5, help="draft length: verifiers keep gamma+1 logit rows")
    parser.add_argument("--context", type=int, default=256, help="tokens already in the KV cache")
    parser.add_argument("--lengths", default=DEFAULT_LENGTHS, help="new tokens per timed forward, comma-separated")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--decode-tokens", type=int, default=256, help="new tokens per decode run (0: no decoding)")
    parser.add_argument("--out", default=None, help="results file (JSON); default $OUT/gpu_check.json")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args((SMOKE + argv) if "--cpu-smoke" in argv else argv)
    if args.out is None:
        if not os.environ.get("OUT"):
            parser.error("say where the JSON goes: --out FILE, or set $OUT")
        args.out = str(Path(os.environ["OUT"]) / "gpu_check.json")
    if args.tiny:
        args.pair = "tiny"
    if args.device is None:
        if not torch.cuda.is_available():
            parser.error("no CUDA device here: pass --device cpu (and --tiny for a quick check), or --cpu-smoke")
        args.device = "cuda"
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    lengths = sorted({int(v) for v in args.lengths.split(",")})
    keep = args.gamma + 1

    spec = PAIRS[args.pair]
    started = time.time()
    torch.manual_seed(0)
    drafter = build(spec["drafter"][1], device, dtype)
    verifier = build(spec["verifier"][1], device, dtype)
    routes = routes_for(args, verifier.config.num_hidden_layers)
    built_s = time.time() - started
    vocab = min(drafter.config.vocab_size, verifier.config.vocab_size)
    errors = []

    decode = None
    if args.decode_tokens:
        names = (f"random {spec['drafter'][0]}", f"random {spec['verifier'][0]}")
        decode = decode_check(drafter, verifier, next(iter(routes.values())), names, device, dtype,
                              args.decode_tokens, args.gamma, errors)
        print(json.dumps({k: v for k, v in decode.items() if k != "methods"}), file=sys.stderr)

    def timings(forward, rows):
        out = []
        for n in lengths:
            try:
                out.append(time_forward(forward, vocab, args.context, n, min(rows, n), args.iters, args.warmup))
            except Exception as err:
                errors.append({"where": f"forward n={n}", "error": repr(err), "traceback": traceback.format_exc()})
                out.append(None)
                break
            print(f"  n={n:4d}: {out[-1]:9.2f} ms", file=sys.stderr, flush=True)
        return out

    ms = {}
    print(f"drafter {spec['drafter'][0]}", file=sys.stderr)
    ms["drafter"] = timings(drafter, 1)
    print(f"full verifier {spec['verifier'][0]}", file=sys.stderr)
    ms["full"] = timings(verifier, keep)
    ms["slim"] = {}
    for label, route in routes.items():
        print(f"slim verifier, route {label} ({len(route.skip)} sub-layers skipped)", file=sys.stderr)
        ms["slim"][label] = timings(SlimVerifier(verifier, route), keep)

    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "cpu")
    result = {
        "schema": "via-sd-gpu-costs/1", "pair": args.pair,
        "models": {"drafter": spec["drafter"][0], "verifier": spec["verifier"][0]},
        "configs": {"drafter": spec["drafter"][1], "verifier": spec["verifier"][1]},
        "device": device.type, "device_name": device_name, "dtype": str(dtype).replace("torch.", ""),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "context": args.context, "gamma": args.gamma, "iters": args.iters, "warmup": args.warmup,
        "lengths": lengths, "ms": ms, "routes": {label: list(r.skip) for label, r in routes.items()},
        "decode": decode, "errors": errors,
        "peak_memory_mb": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
        "build_s": built_s, "elapsed_s": time.time() - started, "command": " ".join(["scripts/gpu_check.py", *argv]),
        "note": "random weights built from the real configurations; forward time does not depend on weight values",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))

    at = {n: k for k, n in enumerate(lengths)}
    print(f"{args.pair} pair on {device_name} ({result['dtype']}), context {args.context}: costs in ms")
    print("| n | drafter | full | " + " | ".join(f"slim {label}" for label in ms["slim"]) + " |")
    print("|---|---|---|" + "---|" * len(ms["slim"]))
    cell = lambda v: "error" if v is None else f"{v:.2f}"  # noqa: E731
    for n, k in at.items():
        rows = [ms["drafter"], ms["full"], *ms["slim"].values()]
        print(f"| {n} | " + " | ".join(cell(r[k] if k < len(r) else None) for r in rows) + " |")
    if decode:
        for label, r in decode["methods"].items():
            print(f"{label}: {r['new_tokens']} tokens in {r['seconds']:.2f} s ({r['tokens_per_s']:.1f} tokens/s)")
        print(f"greedy SD == AR: {decode['sd_equals_ar']}; progressive == separate: "
              f"{decode['progressive_equals_separate']}; lossless == SD: {decode['lossless_equals_sd']}")
    for err in errors:
        print(f"ERROR in {err['where']}: {err['error']}")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
