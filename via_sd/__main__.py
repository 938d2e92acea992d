"""Command line: `python -m via_sd generate | bench | route | setup`."""

from __future__ import annotations

import argparse
import os
import sys

# Background colors per tier (Okabe-Ito, as in the app); replaced tokens are underlined.
ANSI = {"draft": "\x1b[30;48;2;0;158;115m", "slim": "\x1b[30;48;2;230;159;0m", "full": "\x1b[97;48;2;0;114;178m"}
RESET, UNDERLINE = "\x1b[0m", "\x1b[4m"


def add_pair_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default=None, help="embedded (default), gpu, cpu, tiny or random")
    parser.add_argument("--drafter", help="hub id, local folder or .gguf file (instead of a preset)")
    parser.add_argument("--verifier", help="hub id, local folder or .gguf file (instead of a preset)")
    parser.add_argument("--route", help="slim verifier route: shipped name, .json file, 'none', or attn.7,mlp.12")
    parser.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda when available)")


def add_decode_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gamma", type=int, default=5, help="draft tokens per round")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--draft-stop", type=float, default=None,
                        help="end a round's drafting once the drafter's p(x) falls below this (0 = never)")
    parser.add_argument("--accept", type=float, default=None, help="tier A threshold (default: shipped)")
    parser.add_argument("--escalate", type=float, default=None, help="tier C threshold (default: shipped)")
    parser.add_argument("--signal", choices=["slim", "draft"], default=None, help="whose confidence sorts tokens")
    parser.add_argument("--no-chat", action="store_true", help="do not apply the chat template")


def pair_from_args(args):
    from . import load_pair

    route = args.route
    if route and ("," in route or route.startswith(("attn.", "mlp."))):
        route = [s.strip() for s in route.split(",") if s.strip()]
    preset = args.preset or (None if args.drafter or args.verifier else "embedded")

    def progress(message: str, fraction: float) -> None:
        print(f"[{fraction:4.0%}] {message}", file=sys.stderr, flush=True)

    return load_pair(preset, drafter=args.drafter, verifier=args.verifier, route=route, device=args.device,
                     progress=progress)


def config_from_args(args):
    from . import DecodeConfig, Thresholds

    base = Thresholds()
    thresholds = Thresholds(accept=base.accept if args.accept is None else args.accept,
                            escalate=base.escalate if args.escalate is None else args.escalate,
                            signal=args.signal or base.signal)
    return DecodeConfig(gamma=args.gamma, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                        top_p=args.top_p, seed=args.seed, thresholds=thresholds, chat=not args.no_chat,
                        draft_stop=DecodeConfig.draft_stop if args.draft_stop is None else args.draft_stop)


def colored(token: dict) -> str:
    style = ANSI[token["tier"]] + (UNDERLINE if token["outcome"] == "replaced" else "")
    return "\n".join(style + part + RESET if part else "" for part in token["text"].split("\n"))


def format_summary(trace) -> str:
    s = trace.summary
    tiers = " ".join(f"{k}={v}" for k, v in s["tier_counts"].items())
    return (f"{trace.method}: {s['new_tokens']} tokens, {s['tokens_per_s']:.2f} tok/s, "
            f"mean accepted length {s['mean_accepted_length']:.2f}, rejection rate {s['rejection_rate']:.2f}, "
            f"full-model calls {s['full_calls']}, tiers {tiers}, wall {s['wall_ms'] / 1000:.1f} s")


def cmd_generate(args) -> int:
    from . import stream

    pair = pair_from_args(args)
    config = config_from_args(args)
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


def cmd_setup(args) -> int:
    from .embedded import embedded_model_dirs

    drafter_dir, verifier_dir = embedded_model_dirs()
    print(f"embedded pair ready:\n  drafter  {drafter_dir}\n  verifier {verifier_dir}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m via_sd", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="decode one prompt, tokens colored by tier")
    add_pair_arguments(gen)
    add_decode_arguments(gen)
    gen.add_argument("--method", choices=["ar", "sd", "via"], default="via")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--json", help="write the trace to this file")
    gen.set_defaults(run=cmd_generate)

    setup = sub.add_parser("setup", help="assemble, verify and convert the embedded pair once")
    setup.set_defaults(run=cmd_setup)

    from . import bench, route_search

    bench.add_parser(sub, add_pair_arguments, add_decode_arguments)
    route_search.add_parser(sub, add_pair_arguments)

    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nstopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
