"""How fast any prompt-lookup policy could be, next to a fixed-length one, on the same prompts.

Decodes each prompt with AR (greedy), then replays its output round by round under the pair's measured cost
profile: at each position the lookup's match (n-grams up to 3, up to 10 tokens) is what any policy could draft,
and AR's next tokens say how many of them the verifier keeps. Four policies, each priced in one-token verifier
passes (V(k) for a pass over k rows; prompt lookup itself costs nothing):

    oracle   the fewest passes over every choice of drafts from the lookup's matches (knowing which will be kept):
             no policy that drafts from them spends fewer
    ours     the engine's own prompt lookup (lookup.PromptLookup with gamma="auto"), its decisions replayed
    fixed-N  drafts min(N, match) tokens whenever there is a match (transformers' prompt_lookup_num_tokens=N)
    AR       one pass a token

Prints, per prompt and over all of them, each policy's tokens per pass and oracle / fixed-N and ours / fixed-N,
without and with the prompt read (the same for every policy, from the profile). `assets/prompts/copy-tune.jsonl`
is a second set of copy prompts to try policies on, so that `copy.jsonl` can report them.

    .venv/bin/python -m benchmarks.lookup_ceiling --prompts assets/prompts/copy.jsonl --tokens 96
    .venv/bin/python -m benchmarks.lookup_ceiling --prompts assets/prompts/copy-tune.jsonl --tokens 96 --sweep
    .venv/bin/python -m benchmarks.lookup_ceiling --preset random --limit 2 --tokens 8
"""

from __future__ import annotations

import statistics

from benchmarks.harness import parser, prompts, run_main
from via_sd import DecodeConfig, generate, load_pair
from via_sd.bench.hf import HF_LOOKUP_TOKENS
from via_sd.core.lookup import LOOKUP_NGRAM, LOOKUP_TOKENS, PromptLookup, lookup
from via_sd.core.proposal import Outcome
from via_sd.cost.model import RoundCost


def kept_at(seq: list[int], i: int) -> tuple[int, int]:
    """(the lookup's match length at position i, how many of its tokens the verifier keeps)."""
    match, _ = lookup(seq[:i], LOOKUP_NGRAM, LOOKUP_TOKENS)
    return len(match), next((k for k, t in enumerate(match) if i + k >= len(seq) or t != seq[i + k]), len(match))


def matches(seq: list[int], start: int) -> dict:
    """kept_at for every position after the prompt read: what any policy could draft there."""
    return {i: kept_at(seq, i) for i in range(start + 1, len(seq))}


def least(kept: dict[int, int], start: int, end: int, round_cost) -> float:
    """The least cost of emitting seq[start + 1:end] over every choice of round sizes, knowing `kept` ({i: how many
    drafts from position i the verifier keeps}): a round of d <= kept[i] drafts (drafting past it widens the pass for
    no token) costs round_cost(d) and emits d + 1 tokens. Dynamic programming from the end."""
    best = {end: 0.0}
    for i in range(end - 1, start, -1):
        best[i] = min(round_cost(d) + best[min(i + d + 1, end)] for d in range(kept[i] + 1))
    return best[start + 1]


def replay(seq: list[int], start: int, profile, fixed: int, at: dict | None = None) -> dict:
    """Passes each policy spends to emit seq[start + 1:] (seq[start] comes from the prompt read). The oracle's is
    the least over every choice of drafts from the lookup's matches (`least`). `at`: matches(seq, start), when
    already known."""
    end, at = len(seq), matches(seq, start) if at is None else at
    oracle = least({i: kept for i, (_, kept) in at.items()}, start, end, lambda d: profile.V(d + 1))
    return {"oracle": oracle, f"fixed-{fixed}": fixed_passes(at, start, end, profile, fixed),
            "ours": ours(seq, start, profile)}


def fixed_passes(at: dict, start: int, end: int, profile, fixed: int) -> float:
    """Passes a lookup of min(fixed, match) drafts at every match spends (transformers' prompt_lookup_num_tokens)."""
    passes, i = 0.0, start + 1
    while i < end:
        match, kept = at[i]
        drafts = min(fixed, match)
        passes += profile.V(drafts + 1)
        i += min(kept, drafts) + 1
    return passes


def ours(seq: list[int], start: int, profile) -> float:
    """Passes the engine's prompt lookup spends, its rounds replayed as greedy SD with gamma="auto" runs them."""
    lk = PromptLookup(DecodeConfig(drafter="lookup"), profile, RoundCost("sd", False), 1 << 30)
    passes, i = 0.0, start + 1
    while i < len(seq):
        drafts = lk.propose(seq[:i], len(seq) - i).tokens
        kept = next((k for k, t in enumerate(drafts) if t != seq[i + k]), len(drafts))
        passes += profile.V(len(drafts) + 1)  # no drafts: an AR step, V(1) = 1
        emitted = seq[i:i + kept + 1]
        lk.update(Outcome("lookup" if drafts else None, kept, kept < len(drafts), [], None, i, emitted))
        i += len(emitted)
    return passes


def main(argv=None) -> int:
    ap = parser(__doc__, prompts="assets/prompts/copy.jsonl", tokens=96)
    ap.add_argument("--fixed", type=int, default=HF_LOOKUP_TOKENS,
                    help="the fixed policy's draft length (default: the bench's transformers peer, hf-lookup)")
    ap.add_argument("--sweep", action="store_true",
                    help="also: ours with other proven windows (lookup.LOOKUP_PROVEN_WINDOW), fixed lookups of 3-6")
    args = ap.parse_args(argv)
    pair = load_pair(args.preset)
    profile = pair.costs
    fixed = f"fixed-{args.fixed}"
    print(f"{pair.describe()['verifier']}: V(2..6) = " + " / ".join(f"{profile.V(k):.2f}" for k in range(2, 7)))
    print(f"\n| prompt | tokens | AR passes | {fixed} tokens/pass | ours | oracle | ours / {fixed} | "
          f"oracle / {fixed} | both, with the prompt read |")
    print("|---|---|---|---|---|---|---|---|---|")
    gains, gains_read, mine, mine_read, runs = [], [], [], [], []
    for n, item in enumerate(prompts(args), 1):
        prompt = item["prompt"]
        trace = generate(pair, prompt, "ar", DecodeConfig(max_new_tokens=args.tokens))
        prompt_ids = pair.encode(prompt, chat=True)
        seq = prompt_ids + trace.token_ids
        at = matches(seq, len(prompt_ids))
        passes = replay(seq, len(prompt_ids), profile, args.fixed, at)
        emitted = len(trace.token_ids) - 1
        read = profile.prompt("full", len(prompt_ids)) / profile.verify(1)  # yields the first token
        runs.append((seq, len(prompt_ids), read, passes[fixed], at))
        gain = passes[fixed] / passes["oracle"] if passes["oracle"] else 1.0
        gain_read = (read + passes[fixed]) / (read + passes["oracle"])
        own = passes[fixed] / passes["ours"] if passes["ours"] else 1.0
        own_read = (read + passes[fixed]) / (read + passes["ours"])
        gains.append(gain)
        gains_read.append(gain_read)
        mine.append(own)
        mine_read.append(own_read)
        print(f"| {n} | {len(trace.token_ids)} | {emitted} | {emitted / max(passes[fixed], 1e-9):.2f} | "
              f"{emitted / max(passes['ours'], 1e-9):.2f} | {emitted / max(passes['oracle'], 1e-9):.2f} | "
              f"{own:.2f}× | {gain:.2f}× | {own_read:.2f}× / {gain_read:.2f}× |")
    print(f"\nmedian oracle / {fixed}: {statistics.median(gains):.2f}× over the decoding rounds, "
          f"{statistics.median(gains_read):.2f}× with the prompt read")
    print(f"median ours / {fixed}: {statistics.median(mine):.2f}× over the decoding rounds, "
          f"{statistics.median(mine_read):.2f}× with the prompt read")
    if args.sweep:
        sweep(runs, profile, fixed)
    return 0


def sweep(runs: list, profile, fixed: str) -> None:
    """Other policies against the fixed one, median over the prompts with the prompt read: the engine's lookup with
    each proven window (the least draft limit once the answer has copied) and fixed lookups of 3 to 6 tokens."""
    import via_sd.core.lookup as lookup_module

    def line(name, spend):
        ratios = [(read + base) / (read + spend(seq, start, at)) for seq, start, read, base, at in runs]
        print(f"{name}: {statistics.median(ratios):.3f}× {fixed}'s passes (median), "
              f"{statistics.geometric_mean(ratios):.3f}× (geo-mean)")

    print()
    default = lookup_module.LOOKUP_PROVEN_WINDOW
    try:
        for window in (default, 4, 6, 8, 10):
            lookup_module.LOOKUP_PROVEN_WINDOW = window
            name = f"ours, proven window {window}" + (" (the engine's)" if window == default else "")
            line(name, lambda s, i, _: ours(s, i, profile))
    finally:
        lookup_module.LOOKUP_PROVEN_WINDOW = default
    for n in (3, 4, 5, 6):
        line(f"fixed-{n}", lambda s, i, at, n=n: fixed_passes(at, i, len(s), profile, n))


if __name__ == "__main__":
    run_main(main)
