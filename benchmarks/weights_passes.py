"""Per weights setting: verifier pass cost over 1 and 6 new tokens, prefill, drafter cost, agreement with fp32.

    .venv/bin/python -m benchmarks.weights_passes --weights fp32,int4

Every setting's pair is loaded at once (fp32 + int4: about 11 GB), and the measurements are
interleaved round by round, the order rotating, so the ratios to fp32 are paired (medians of
per-round ratios) even on a busy machine. Passes run after a 120-token context held in the KV
cache (rolled back after every pass), --repeat rounds; prefill is one forward over a 150-token
prompt (2 rounds). Agreement: the fp32 verifier continues each prompt greedily
for --tokens tokens; every setting (fp32 included) then reads prompt + that continuation in one
forward, and we count how often its top-1 equals fp32's top-1 at the same position
(teacher-forced top-1 agreement with fp32).

    .venv/bin/python -m benchmarks.weights_passes --drafter --repeat 20

--drafter: the drafter's levers, int4, side by side in one process: one drafter step (one new token
after a 200-token context) for the drafter as it was (separate matmuls, whole head), fused q/k/v and
gate/up, the frequency-ranked head at several N, and both, and both run by the lean forward (via_sd/weights/lean_forward.py,
as decoding runs the drafter now); each round also times one verifier
one-token pass (as shipped, and with its matmuls fused: logits compared bit for bit), so c = drafter
step / verifier pass is a ratio of neighbours. Then prompt reads of 40 and 200 tokens by each model,
int4 kernel (the rule fixed in code, linears.KERNEL_RULE) vs de-quantized bf16 matmuls.

    .venv/bin/python -m benchmarks.weights_passes --prompt-reads 32,128,512

--prompt-reads: what the kernel rule costs a prompt read: each model (int4) reads prompts of these lengths through
torch's int4 kernel (the rule, via_sd/weights/linears.py) and through de-quantized bf16 matmuls, paired: one JSON
line per (length, model), the best of two reads each way, alternating, and kernel / dense (below 1: the kernel is
faster).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from benchmarks.harness import parser, prompts as load, run_main
from via_sd import load_pair
from via_sd.bench.inputs import DEFAULT_PROMPTS
from via_sd.weights.lean_forward import LeanDecoder


class Passes:
    """One model with a 120-token context in its KV cache; times a pass over `new` tokens, then rolls back."""

    def __init__(self, model, context: torch.Tensor):
        self.model, self.cache = model, DynamicCache()
        with torch.inference_mode():
            model(context, past_key_values=self.cache, use_cache=True, logits_to_keep=1)

    @torch.inference_mode()
    def ms(self, new: int) -> float:
        vocab = self.model.config.vocab_size
        low, high = (1000, 20000) if vocab > 20000 else (vocab // 4, vocab)  # as random_ids
        extra = torch.randint(low, high, (1, new), generator=torch.Generator().manual_seed(new))
        start = time.perf_counter()
        self.model(extra, past_key_values=self.cache, use_cache=True, logits_to_keep=new)
        elapsed = time.perf_counter() - start
        self.cache.crop(-new)
        return elapsed * 1000


@torch.inference_mode()
def continuation(model, ids: list[int], tokens: int) -> list[int]:
    out = model.generate(torch.tensor([ids]), max_new_tokens=tokens, do_sample=False, min_new_tokens=tokens)
    return out[0, len(ids):].tolist()


@torch.inference_mode()
def top1(model, refs) -> list[list[int]]:
    """Teacher-forced top-1 at every continuation position (one forward over prompt + continuation)."""
    return [model(torch.tensor([ids + cont])).logits[0, len(ids) - 1:-1].argmax(-1).tolist() for ids, cont in refs]


def agreement(mine: list[list[int]], reference: list[list[int]]) -> float:
    pairs = [(a, b) for x, y in zip(mine, reference) for a, b in zip(x, y)]
    return sum(a == b for a, b in pairs) / len(pairs)


def _step(model, cache) -> float:
    """ms of one new token after the cached context (rolled back after)."""
    with torch.inference_mode():
        start = time.perf_counter()
        model(torch.tensor([[1234]]), past_key_values=cache, use_cache=True, logits_to_keep=1)
        elapsed = time.perf_counter() - start
    cache.crop(-1)
    return elapsed * 1000


def _lean_step(model, seq) -> float:
    """ms of one new token after the cached context, through the lean forward (rolled back after)."""
    model.rollback(len(seq) - 1)
    start = time.perf_counter()
    model.logits(seq, len(seq), 1)
    return (time.perf_counter() - start) * 1000


MAX_DENSE = 64 << 20  # larger weights (the output heads) stayed on the kernel, as in the engine's dense path


def _dense_forward(m):
    """The de-quantize-once-per-call path the engine had before its kernel rule (linears.KERNEL_RULE): the packed codes
    de-quantized to bf16 blocks of 64 output rows inside every call, then bf16 matmuls (oneDNN)."""
    from via_sd.weights.linears import BLOCK_N

    n, k, g, nb = m.out_features, m.in_features, m.group, m.out_features // BLOCK_N
    sz = m.scales.float()
    scale, shift = [t.to(torch.bfloat16).reshape(k // g, nb, BLOCK_N).permute(1, 0, 2).contiguous()[:, :, None]
                    for t in (sz[..., 0], sz[..., 1] - 8 * sz[..., 0])]

    def forward(x):
        shape, x = x.shape, x.reshape(-1, k).to(torch.bfloat16)
        packed, q = m.packed.view(nb, k, BLOCK_N // 2), torch.empty(nb, k, BLOCK_N, dtype=torch.uint8)
        torch.bitwise_and(packed, 15, out=q[..., :BLOCK_N // 2])
        torch.bitwise_right_shift(packed, 4, out=q[..., BLOCK_N // 2:])
        w = q.to(torch.bfloat16).view(nb, k // g, g, BLOCK_N).mul_(scale).add_(shift).view(nb, k, BLOCK_N)
        y = torch.matmul(x, w).permute(1, 0, 2).reshape(x.shape[0], n).float()
        return (y if m.bias is None else y + m.bias).view(*shape[:-1], n)

    return forward


def _set_dense(model, dense: bool) -> None:
    """Every int4 linear the old dense path took (whole 64-row blocks, at most MAX_DENSE weights) run by that path
    (dense), or by the kernel as shipped: kept here to measure what the fixed kernel rule costs a prompt read."""
    from via_sd.weights.linears import Int4Linear

    for m in model.modules():
        if isinstance(m, Int4Linear):
            m.__dict__.pop("forward", None)
            if dense and m.layout == "torch" and m.out_features % 64 == 0 and m.out_features * m.in_features <= MAX_DENSE:
                m.forward = _dense_forward(m)


def prompt_read_ms(model, ids: torch.Tensor) -> dict:
    """{"kernel": ms, "dense": ms}: the best of two reads of the prompt `ids` each way, alternating; the model is
    left on the kernel."""
    got = {}
    for path in ("kernel", "dense", "kernel", "dense"):
        _set_dense(model, path == "dense")
        with torch.inference_mode():
            start = time.perf_counter()
            model(ids, logits_to_keep=1)
            got.setdefault(path, []).append((time.perf_counter() - start) * 1000)
    _set_dense(model, False)
    return {k: round(min(v), 1) for k, v in got.items()}


def drafter_levers(args) -> int:
    from transformers import AutoConfig

    from via_sd.weights.embedded import embedded_model_dirs
    from via_sd.weights.gguf_pack import Entries, build_model

    drafter_dir, verifier_dir = embedded_model_dirs()
    def build(folder, **kw):
        config = AutoConfig.from_pretrained(folder)
        return build_model(config, Entries.from_folder(folder, config), "int4", **kw)

    models = {"verifier": build(verifier_dir, fuse=False), "verifier fused": build(verifier_dir, fuse=True),
              "drafter as was": build(drafter_dir, exact_top1=False, fuse=False, frequent=None),
              "fused": build(drafter_dir, exact_top1=False, fuse=True, frequent=None)}
    for n in map(int, args.heads.split(",")):
        models[f"head {n}"] = build(drafter_dir, exact_top1=False, fuse=False, frequent=n)
        models[f"fused + head {n}"] = build(drafter_dir, exact_top1=False, fuse=True, frequent=n)
    context = torch.randint(1000, 20000, (1, 200), generator=torch.Generator().manual_seed(0))
    caches = {}
    with torch.inference_mode():
        for name, model in models.items():
            caches[name] = DynamicCache()
            model(context, past_key_values=caches[name], use_cache=True, logits_to_keep=1)
        probe = torch.tensor([[1234, 99, 4242]])
        same = [torch.equal(models[v](torch.cat([context, probe], 1)).logits[0, -3:],
                            models[v + " fused"](torch.cat([context, probe], 1)).logits[0, -3:]) for v in ["verifier"]]
    print(f"verifier logits, fused vs separate, bit for bit: {same}", flush=True)
    seq = context[0].tolist() + [1234]
    lean = {}  # the shipped drafter run by via_sd/weights/lean_forward.py's forward instead of transformers'
    for n in map(int, args.heads.split(",")):
        lean[f"fused + head {n}, lean forward"] = LeanDecoder(models[f"fused + head {n}"], 151936, "cpu", "cpu")
        lean[f"fused + head {n}, lean forward"].logits(seq, 200, 1)
    times = {name: [] for name in [*models, *lean]}
    names = list(times)
    for rep in range(args.repeat + 1):
        order = names[rep % len(names):] + names[:rep % len(names)]
        for name in order:
            times[name].append(_lean_step(lean[name], seq) if name in lean else _step(models[name], caches[name]))
    keep = {k: v[1:] for k, v in times.items()}  # round 0 warms up
    rows = []
    for name in names:
        c = [t / v for t, v in zip(keep[name], keep["verifier"])]
        vs_was = [t / w for t, w in zip(keep[name], keep["drafter as was"])]
        rows.append({"model": name, "median_ms": round(statistics.median(keep[name]), 1),
                     "c": round(statistics.median(c), 3), "vs_drafter_as_was": round(statistics.median(vs_was), 3)})
        print(json.dumps(rows[-1]), flush=True)
    reads = []
    for length in (40, 200):
        ids = torch.randint(1000, 20000, (1, length), generator=torch.Generator().manual_seed(length))
        for name in ("verifier", "drafter as was"):
            row = {"prompt": length, "model": name, **prompt_read_ms(models[name], ids)}
            row["dense_over_kernel"] = round(row["dense"] / row["kernel"], 2)
            reads.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"steps": rows, "prompt_reads": reads, "verifier_fused_equal": same}, indent=1))
    return 0


def prompt_reads(args) -> int:
    pair = load_pair(args.preset, weights=args.weights if "," not in args.weights else "int4")
    for length in map(int, args.prompt_reads.split(",")):
        ids = random_ids(pair, length, length)
        for name, model in (("verifier", pair.verifier), ("drafter", pair.drafter)):
            ms = prompt_read_ms(model, ids)
            print(json.dumps({"prompt": length, "model": name, "kernel_ms": ms["kernel"], "dense_ms": ms["dense"],
                              "kernel_over_dense": round(ms["kernel"] / ms["dense"], 2)}), flush=True)
    return 0


def random_ids(pair, length: int, seed: int) -> torch.Tensor:
    """Token ids 1000..20000 (the embedded pair's ordinary tokens), within a smaller vocabulary's upper part."""
    low, high = (1000, 20000) if pair.vocab_size > 20000 else (pair.vocab_size // 4, pair.vocab_size)
    return torch.randint(low, high, (1, length), generator=torch.Generator().manual_seed(seed))


def main(argv=None) -> int:
    ap = parser(__doc__, prompts=str(DEFAULT_PROMPTS))
    ap.set_defaults(limit=4)  # prompts for the agreement; --tokens: greedy fp32 tokens per prompt
    ap.add_argument("--weights", default="fp32,int4,bf16", help="settings to compare (--prompt-reads: one, else int4)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--reference", default="/tmp/via-sd-fp32-continuations.json",
                    help="fp32 continuations are cached here (reused when present)")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--drafter", action="store_true", help="the drafter's levers and prompt reads (int4, embedded)")
    ap.add_argument("--heads", default="16384,32768", help="--drafter: N of the frequency-ranked heads")
    ap.add_argument("--prompt-reads", help="lengths, e.g. 32,128,512: the kernel rule's cost of a prompt read")
    args = ap.parse_args(argv)
    if args.drafter:
        return drafter_levers(args)
    if args.prompt_reads:
        return prompt_reads(args)

    settings = args.weights.split(",")
    prompts = [p["prompt"] for p in load(args)]
    ref_path, refs, ref_top1, rows = Path(args.reference), None, None, []
    if ref_path.is_file():
        saved = json.loads(ref_path.read_text())
        if (saved.get("prompts"), saved.get("tokens"), saved.get("preset", "embedded")) == (prompts, args.tokens,
                                                                                          args.preset):
            refs, ref_top1 = saved["refs"], saved.get("top1")
    if (refs is None or ref_top1 is None) and "fp32" not in settings:
        settings = ["fp32", *settings]
    settings = sorted(settings, key=lambda w: w != "fp32")  # fp32 first: it is the reference
    pairs, load_s = {}, {}
    for weights in settings:  # all loaded at once, so every measurement below is interleaved (paired)
        t0 = time.perf_counter()
        pairs[weights] = load_pair(args.preset, weights=weights, route="none")
        load_s[weights] = round(time.perf_counter() - t0, 1)
    context, prompt150 = random_ids(pairs[settings[0]], 120, 0), random_ids(pairs[settings[0]], 150, 1)
    if refs is None:  # fp32 defines the reference continuations
        refs = [(ids, continuation(pairs["fp32"].verifier, ids, args.tokens)) for ids in map(pairs["fp32"].encode, prompts)]
    top = {w: top1(pair.verifier, refs) for w, pair in pairs.items()}
    if "fp32" in top:  # compared with fp32's own teacher-forced top-1 (not the generated text, which
        ref_top1 = top["fp32"]  # min_new_tokens keeps from ending where fp32 would stop)
        ref_path.write_text(json.dumps({"prompts": prompts, "tokens": args.tokens, "preset": args.preset, "refs": refs,
                                        "top1": ref_top1}))
    passes = {w: {"verifier": Passes(p.verifier, context), "drafter": Passes(p.drafter, context)} for w, p in pairs.items()}
    kinds = {"verify1_ms": ("verifier", 1), "verify6_ms": ("verifier", 6), "drafter1_ms": ("drafter", 1)}
    times = {w: {k: [] for k in [*kinds, "prefill150_ms"]} for w in pairs}
    for rep in range(args.repeat + 1):  # round 0 warms up
        order = settings[rep % len(settings):] + settings[:rep % len(settings)]
        for w in order:
            for key, (who, new) in kinds.items():
                times[w][key].append(passes[w][who].ms(new))
            if rep < 3:  # prefill is long: warm-up + 2
                with torch.inference_mode():
                    t0 = time.perf_counter()
                    pairs[w].verifier(prompt150, logits_to_keep=1)
                    times[w]["prefill150_ms"].append((time.perf_counter() - t0) * 1000)
    med = {w: {k: statistics.median(v[1:]) for k, v in t.items()} for w, t in times.items()}
    for w in settings:
        m = med[w]
        row = {"weights": w, "load_s": load_s[w], **{k: round(v, 1) for k, v in m.items()},
               "verify6_over_1": round(m["verify6_ms"] / m["verify1_ms"], 2),
               "drafter_over_verifier": round(m["drafter1_ms"] / m["verify1_ms"], 3),
               "agreement": round(agreement(top[w], ref_top1), 4)}
        if "fp32" in med and w != "fp32":  # paired: median over rounds of fp32 time / this time
            for k in ("verify1_ms", "verify6_ms", "prefill150_ms"):
                ratios = [a / b for a, b in zip(times["fp32"][k][1:], times[w][k][1:])]
                row[f"speedup_{k[:-3]}"] = round(statistics.median(ratios), 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    keys = list(rows[0])
    print("\n| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k in keys) + " |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    run_main(main)
