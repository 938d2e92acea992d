"""`python -m via_sd generate`: decode one prompt, tokens colored by tier, the summary on stderr."""

from __future__ import annotations

import os
import sys

from .args import add_decode_arguments, add_pair_arguments, config_from_args, pair_from_args

# Background colors per tier (Okabe-Ito, as in the app); replaced tokens are underlined.
ANSI = {"draft": "\x1b[30;48;2;0;158;115m", "slim": "\x1b[30;48;2;230;159;0m", "full": "\x1b[97;48;2;0;114;178m"}
RESET, UNDERLINE = "\x1b[0m", "\x1b[4m"


def add_parser(sub) -> None:
    gen = sub.add_parser("generate", help="decode one prompt, tokens colored by tier")
    add_pair_arguments(gen)
    add_decode_arguments(gen)
    gen.add_argument("--method", choices=["ar", "sd", "via"], default="via")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--json", help="write the trace to this file")
    gen.set_defaults(run=cmd_generate)


def colored(token: dict) -> str:
    style = ANSI[token["tier"]] + (UNDERLINE if token["outcome"] == "replaced" else "")
    return "\n".join(style + part + RESET if part else "" for part in token["text"].split("\n"))


def format_summary(trace) -> str:
    s = trace.summary
    tiers = " ".join(f"{k}={v}" for k, v in s["tier_counts"].items())
    gammas = [r["gamma"] for r in trace.rounds if r.get("gamma")]
    rounds = f"gamma {sum(gammas) / len(gammas):.1f} on average, " if gammas else ""
    return (f"{trace.method}: {s['new_tokens']} tokens, {s['tokens_per_s']:.2f} tok/s "
            f"(the cost model predicted {s.get('predicted_tokens_per_s') or 0:.2f}), {rounds}"
            f"mean accepted length {s['mean_accepted_length']:.2f}, rejection rate {s['rejection_rate']:.2f}, "
            f"full-model calls {s['full_calls']}, tiers {tiers}, wall {s['wall_ms'] / 1000:.1f} s")


def cmd_generate(args) -> int:
    from .. import stream
    from ..route_search.resolve import how_made

    pair = pair_from_args(args)
    config = config_from_args(args)
    print(how_made(pair.route), file=sys.stderr)
    tty = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    shown, trace = 0, None
    for trace in stream(pair, args.prompt, args.method, config):
        for token in trace.tokens[shown:]:
            sys.stdout.write(colored(token) if tty else token["text"])
        shown = len(trace.tokens)
        sys.stdout.flush()
    print()
    if tty:
        print(f"{ANSI['draft']} accepted draft {RESET} {ANSI['slim']} slim verifier {RESET} "
              f"{ANSI['full']} full model {RESET} {UNDERLINE}underlined{RESET} = replaced", file=sys.stderr)
    print(format_summary(trace), file=sys.stderr)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(trace.to_json(indent=1))
        print(f"trace written to {args.json}", file=sys.stderr)
    return 0
