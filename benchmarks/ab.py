"""Paired A/B runs over any DecodeConfig field: each prompt runs every value back to back, the order rotating.

    .venv/bin/python -m benchmarks.ab reuse_opening=true,false --methods ar,sd,via:fastest   # the chat opening
    .venv/bin/python -m benchmarks.ab progressive=true,false --methods via:paper --set gamma=5 --tokens 24
    .venv/bin/python -m benchmarks.ab slim_cache=own,full --methods via:paper,via:fastest --agreement

For every method (ar, sd, or via:PRESET) and value of the field: the median paired speed ratio against the first
value (whole runs), round 0's milliseconds (it reads the prompt), the median slim + full milliseconds of the
rounds that ran both verifiers (what progressive verification changes), verifier rows read, tier shares, how
many runs emitted the same tokens as the first value's, and with --agreement the full model's teacher-forced
agreement (via_sd.bench.fidelity). Greedy, gamma="auto" unless --set says otherwise.
"""

from __future__ import annotations

import dataclasses
import statistics

from benchmarks.harness import by_item, paired, paired_ratio, parser, prompts, run_main
from via_sd import DecodeConfig, Thresholds, generate, load_pair

FIELDS = {f.name: f for f in dataclasses.fields(DecodeConfig) if f.name != "thresholds"}


def value(field: str, text: str):
    """`text` as a value of DecodeConfig's `field` (its default's type; gamma: "auto" or a whole number)."""
    if field not in FIELDS:
        raise SystemExit(f"unknown DecodeConfig field {field!r}: use one of {', '.join(sorted(FIELDS))}")
    default = getattr(DecodeConfig(), field)
    try:
        if isinstance(default, bool):
            if text.lower() not in ("true", "false"):
                raise ValueError
            return text.lower() == "true"
        if field == "gamma":
            return text if text == "auto" else int(text)
        return type(default)(text)
    except ValueError:
        raise SystemExit(f"{field} takes a value like {default!r}, got {text!r}") from None


def setting(spec: str) -> tuple[str, Thresholds]:
    """"ar", "sd" or "via:PRESET" -> (method, thresholds)."""
    method, _, preset = spec.partition(":")
    if method not in ("ar", "sd", "via"):
        raise SystemExit(f"--methods: {spec!r} is not ar, sd or via:PRESET")
    return method, Thresholds.preset(preset or "paper") if method == "via" else Thresholds()


def round0_ms(trace) -> float:
    return trace.rounds[1]["start_ms"] if len(trace.rounds) > 1 else trace.summary["wall_ms"]


def measure(pair, agreement: bool):
    def run(item: dict, name: str, cfg_method) -> dict:
        method, cfg = cfg_method
        trace = generate(pair, item["prompt"], method, cfg)
        both = [r["slim_ms"] + r["full_ms"] for r in trace.rounds[1:] if r["slim_called"] and r["full_called"]]
        out = {"tokens_per_s": trace.summary["tokens_per_s"], "round0_ms": round0_ms(trace), "escalating_ms": both,
               "rows": sum(c["rows"] for r in trace.rounds for c in r["calls"] if c["model"] != "drafter"),
               "tiers": trace.summary["tier_counts"], "tokens": trace.token_ids}
        if agreement:
            from via_sd.bench.fidelity import measure_fidelity

            out["agreement"] = measure_fidelity(pair, trace)["agreement"]
        return out
    return run


def report(rows: list[dict], names: list[str], agreement: bool) -> None:
    first = by_item(rows, names[0])
    for name in names:
        runs = list(by_item(rows, name).values())
        tiers = {t: sum(r["tiers"][t] for r in runs) for t in ("draft", "slim", "full")}
        both = [ms for r in runs for ms in r["escalating_ms"]]
        same = sum(r["tokens"] == first[r["i"]]["tokens"] for r in runs)
        line = (f"| {name} | {statistics.median(r['tokens_per_s'] for r in runs):.2f} | "
                f"{paired_ratio(rows, name, names[0]):.3f}x | {statistics.median(r['round0_ms'] for r in runs):.0f} | "
                f"{f'{statistics.median(both):.0f} ({len(both)})' if both else '-'} | {sum(r['rows'] for r in runs)} | "
                + "/".join(f"{100 * tiers[t] / max(sum(tiers.values()), 1):.0f}%" for t in tiers)
                + f" | {same}/{len(runs)} |")
        if agreement:
            line += f" {statistics.mean(r['agreement'] for r in runs):.3f} |"
        print(line, flush=True)


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("field", help="FIELD=A,B,...: a DecodeConfig field and the values to compare (the first: the base)")
    ap.add_argument("--methods", default="via:paper", help="ar, sd, via:PRESET, comma-separated")
    ap.add_argument("--set", action="append", default=[], help="FIELD=VALUE held fixed in every run")
    ap.add_argument("--agreement", action="store_true", help="also the full model's teacher-forced agreement")
    args = ap.parse_args(argv)
    field, _, values = args.field.partition("=")
    values = [value(field, v) for v in values.split(",") if v] if values else []
    if len(values) < 2:
        raise SystemExit(f"{args.field!r}: give a field and at least two values, e.g. progressive=true,false")
    fixed = {k: value(k, v) for k, v in (s.partition("=")[::2] for s in args.set)}
    pair, items = load_pair(args.preset), prompts(args)
    for spec in args.methods.split(","):
        method, th = setting(spec)
        base = dict(max_new_tokens=args.tokens, thresholds=th, **fixed)
        generate(pair, "Warm up.", method, DecodeConfig(**{**base, "max_new_tokens": 4}))  # and the opening read
        settings = {f"{spec} {field}={v}": (method, DecodeConfig(**{**base, field: v})) for v in values}
        rows = paired(items, settings, measure(pair, args.agreement))
        print(f"\n{spec}, {len(items)} prompts of {args.prompts}, {args.tokens} new tokens, "
              f"{pair.describe()['verifier']}")
        print("| setting | tokens/s | x first (paired median) | round 0 ms | slim + full ms of escalating rounds (n) "
              "| verifier rows | tiers A/B/C | same tokens as first |" + (" agreement |" if args.agreement else ""))
        print("|---|---|---|---|---|---|---|---|" + ("---|" if args.agreement else ""))
        report(rows, list(settings), args.agreement)
    return 0


if __name__ == "__main__":
    run_main(main)
