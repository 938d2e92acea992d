"""Forward-pass costs at verification shapes, for a projected GPU speed-up. Needs no model download.

    python scripts/gpu_check.py --out artifacts/gpu_costs.json             # GPU: Qwen2.5 0.5B -> 7B, bf16
    python scripts/gpu_check.py --device cpu --tiny --out /tmp/costs.json  # mechanics check, seconds
    python scripts/gpu_check.py --pair embedded --device cpu --out ...     # the embedded pair's shapes

Builds random-weight models from the real configurations (written inline below; the time of a
forward pass does not depend on the weight values), fills each model's KV cache with --context
tokens, then times forward passes over n new tokens for n in --lengths: the drafter (1 logit
row kept), the full verifier and the slim verifier of each route (gamma+1 rows kept, as when
verifying). Each time is the median of --iters CUDA-synchronized calls after warm-up calls; the
cache is cut back after every call. One JSON file comes out; feed it to
`python -m via_sd bench ... --gpu-costs FILE`, which prices the forward calls recorded in real
traces with it (a projection, labelled as such).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from via_sd.routing import SlimVerifier, resolve_route, shipped_routes  # noqa: E402

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


def build(config_kwargs: dict, device: torch.device, dtype: torch.dtype):
    """A random-weight Qwen2 causal LM made directly on `device` in `dtype`."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(Qwen2Config(**config_kwargs))
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def routes_for(args, num_layers: int) -> dict:
    """label -> Route: the --route values, else every shipped route made for this many layers."""
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
    return out


@torch.inference_mode()
def time_forward(forward, vocab: int, context: int, n: int, keep: int, iters: int, warmup: int,
                 device: torch.device) -> float:
    """Median ms of a forward over n new tokens after `context` cached tokens."""
    cuda = device.type == "cuda"
    gen = torch.Generator(device="cpu").manual_seed(n)
    cache = DynamicCache()
    forward(input_ids=torch.randint(vocab, (1, context), generator=gen).to(device), past_key_values=cache,
            use_cache=True, logits_to_keep=1)
    ids = torch.randint(vocab, (1, n), generator=gen).to(device)
    times = []
    for i in range(warmup + iters):
        if cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        logits = forward(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=keep).logits
        torch.softmax(logits.float(), dim=-1)  # the engine turns every kept row into probabilities
        if cuda:
            torch.cuda.synchronize(device)
        if i >= warmup:
            times.append((time.perf_counter() - start) * 1000.0)
        cache.crop(-n)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", choices=sorted(PAIRS), default="gpu", help="whose configurations to build")
    parser.add_argument("--tiny", action="store_true", help="tiny configs (same as --pair tiny): a quick check")
    parser.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None,
                        help="default: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--route", action="append", help="slim route (name, .json or attn.3,attn.4); repeatable")
    parser.add_argument("--gamma", type=int, default=5, help="draft length: verifiers keep gamma+1 logit rows")
    parser.add_argument("--context", type=int, default=256, help="tokens already in the KV cache")
    parser.add_argument("--lengths", default=DEFAULT_LENGTHS, help="new tokens per timed forward, comma-separated")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", required=True, help="results file (JSON)")
    args = parser.parse_args(argv)
    if args.tiny:
        args.pair = "tiny"
    if args.device is None:
        if not torch.cuda.is_available():
            parser.error("no CUDA device here: pass --device cpu (and --tiny for a quick check)")
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

    def timings(forward, rows):
        out = []
        for n in lengths:
            out.append(time_forward(forward, vocab, args.context, n, min(rows, n), args.iters, args.warmup, device))
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
        "peak_memory_mb": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
        "build_s": built_s, "elapsed_s": time.time() - started,
        "note": "random weights built from the real configurations; forward time does not depend on weight values",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))

    at = {n: k for k, n in enumerate(lengths)}
    one, verify = at.get(1), at.get(keep)
    print(f"{args.pair} pair on {device_name} ({result['dtype']}), context {args.context}: costs in ms")
    print("| n | drafter | full | " + " | ".join(f"slim {label}" for label in ms["slim"]) + " |")
    print("|---|---|---|" + "---|" * len(ms["slim"]))
    for n, k in at.items():
        print(f"| {n} | {ms['drafter'][k]:.2f} | {ms['full'][k]:.2f} | "
              + " | ".join(f"{v[k]:.2f}" for v in ms["slim"].values()) + " |")
    if one is not None and verify is not None:
        print(f"drafter(1) / full(1) = {ms['drafter'][one] / ms['full'][one]:.3f}; "
              f"full({keep}) / full(1) = {ms['full'][verify] / ms['full'][one]:.3f}; "
              + "; ".join(f"slim {label}({keep}) / full({keep}) = {v[verify] / ms['full'][verify]:.3f}"
                          for label, v in ms["slim"].items()))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
