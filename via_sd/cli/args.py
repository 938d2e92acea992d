"""Arguments shared by the sub-commands: which pair to load, how to decode, progress lines on stderr."""

from __future__ import annotations

import argparse
import sys
import warnings


def add_pair_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default=None, help="embedded (default), gpu, cpu, tiny or random")
    parser.add_argument("--drafter", help="who drafts: model (default), lookup, hybrid or early-exit; or the drafter "
                        "model: a hub id, local folder or .gguf file (instead of a preset)")
    parser.add_argument("--verifier", help="hub id, local folder or .gguf file (instead of a preset)")
    parser.add_argument("--route", help="slim verifier route: shipped name, .json file, 'none', or attn.7,mlp.12")
    parser.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda when available)")
    parser.add_argument("--weights", default="auto",
                        help="auto (int4 on CPU, bf16 on CUDA), fp32, bf16 or int4 (bench: a comma list)")


def add_decode_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gamma", type=gamma_value, default="auto",
                        help="draft tokens per round: auto (from the measured cost profile, each round) or 1..64")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--draft-stop", type=float, default=None,
                        help="end a round's drafting once the drafter's p(x) falls below this (0 = never)")
    parser.add_argument("--thresholds", choices=["paper", "fastest", "lossless"], default="paper",
                        help="threshold preset; --accept/--escalate/--signal override its values")
    parser.add_argument("--max-unverified", type=int, default=None,
                        help="send a round to a verifier after this many tokens in a row kept with none (0 = never)")
    parser.add_argument("--accept", type=float, default=None, help="tier A threshold (default: shipped)")
    parser.add_argument("--escalate", type=float, default=None, help="tier C threshold (default: shipped)")
    parser.add_argument("--signal", choices=["slim", "draft"], default=None, help="whose confidence sorts tokens")
    parser.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    parser.add_argument("--lookup-ngram", type=int, default=3, help="prompt lookup: the longest n-gram matched")
    parser.add_argument("--lookup-tokens", type=int, default=10, help="prompt lookup: the most tokens one match drafts")
    parser.add_argument("--exit-layer", type=int, default=0, help="early exit: the verifier's layers that draft "
                        "(0: half of them)")


def gamma_value(text: str):
    """--gamma: "auto" or a whole number (DecodeConfig checks the range)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"gamma must be 'auto' or a whole number, got {text!r}") from None


def parse_route(text: str | None):
    """A --route / --routes value: "attn.7,mlp.12" becomes a list of sub-layers, anything else stays a name."""
    if text and ("," in text or text.startswith(("attn.", "mlp."))):
        return [s.strip() for s in text.split(",") if s.strip()]
    return text


def print_progress(message: str, fraction: float) -> None:
    print(f"[{fraction:4.0%}] {message}", file=sys.stderr, flush=True)


def pair_from_args(args, weights: str | None = None):
    """The pair the flags name, with the route a face gives it at once (a provisional one never waits on a search)."""
    from .. import NoRouteWarning, load_pair
    from ..core.pair import no_route_message
    from ..route_search.resolve import pick_route

    with warnings.catch_warnings():  # said once below, after a route searched earlier was looked for
        warnings.simplefilter("ignore", NoRouteWarning)
        pair = load_pair(**pair_spec(args, weights), progress=print_progress)
    pick_route(pair, progress=print_progress)
    if pair.route.meta.get("missing"):
        print(f"warning: {no_route_message(pair.drafter_name, pair.verifier_name)}", file=sys.stderr, flush=True)
    return pair


def pair_spec(args, weights: str | None = None) -> dict:
    """load_pair's arguments for the pair the flags name (a cluster's workers each load it from these)."""
    model = None if drafter_kind(args) else args.drafter  # --drafter names who drafts, or the drafter model
    preset = args.preset or (None if model or args.verifier else "embedded")
    return {"preset": preset, "drafter": model, "verifier": args.verifier, "route": parse_route(args.route),
            "device": args.device, "weights": weights or getattr(args, "weights", "auto")}


def drafter_kind(args) -> str | None:
    """--drafter as who drafts (model, lookup, hybrid, early-exit), or None when it names a drafter model."""
    from ..core.config import DRAFTERS

    return args.drafter if getattr(args, "drafter", None) in DRAFTERS else None


def config_from_args(args):
    from .. import DecodeConfig, Thresholds

    base = Thresholds.preset(getattr(args, "thresholds", "paper"))
    thresholds = Thresholds(accept=base.accept if args.accept is None else args.accept,
                            escalate=base.escalate if args.escalate is None else args.escalate,
                            signal=args.signal or base.signal)
    return DecodeConfig(gamma=args.gamma, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                        top_p=args.top_p, seed=args.seed, thresholds=thresholds, chat=not args.no_chat,
                        draft_stop=DecodeConfig.draft_stop if args.draft_stop is None else args.draft_stop,
                        max_unverified=(DecodeConfig.max_unverified if getattr(args, "max_unverified", None) is None
                                        else args.max_unverified),
                        drafter=drafter_kind(args) or "model", lookup_ngram=getattr(args, "lookup_ngram", 3),
                        lookup_tokens=getattr(args, "lookup_tokens", 10), exit_layer=getattr(args, "exit_layer", 0))
