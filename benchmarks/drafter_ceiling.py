"""How fast greedy SD with the pair's own drafter could be at the measured costs: the ceiling over every policy.

For each prompt, AR decodes greedily: its tokens are what any lossless greedy SD emits. The drafter then reads
prompt + those tokens in one teacher-forced pass. A draft chain stays on the verifier's tokens exactly as long as its
drafts are kept, so the drafter's teacher-forced top-1 tells, at every position, how many of its greedy drafts from
there the verifier would keep. Every way of decoding is then priced in milliseconds with the pair's cost profile
(a drafter step draft(1), a verifier pass over k rows verify(k), and the prompt reads each run recorded):

    oracle   the least time over every choice of round sizes, knowing which drafts will be kept (dynamic
             programming from the end; each drafter step at draft(1), whatever it catches up on): no greedy SD
             with this drafter at these costs takes less
    fixed-G  G drafts every round, the best G of 1..8
    ours     the engine's own SD run (gamma auto), its recorded forwards priced the same way
    AR       the engine's AR run, priced the same way

SD / AR is AR's priced time over each one's, the prompt reads included (AR reads the prompt with the verifier, SD
with both models). "as timed" divides the two engine runs' forwards as their clocks timed them, "measured" their wall
times, back to back: what the priced ratio loses to the minute's speed and to everything a profile does not price.
`--c` re-prices with the drafter's step at that share of a verifier step.

    .venv/bin/python -m benchmarks.drafter_ceiling --prompts assets/prompts/held_out.jsonl --tokens 64
    .venv/bin/python -m benchmarks.drafter_ceiling --preset random --limit 1 --tokens 8
"""

from __future__ import annotations

import statistics

from benchmarks.harness import parser, prompts, run_main
from benchmarks.lookup_ceiling import least
from via_sd import DecodeConfig, generate, load_pair
from via_sd.core.cached import drafter_cache
from via_sd.cost.model import call_ms, reads_prompt, scaled

MAX_DRAFTS = 16  # the profile's rows reach 17
FIXED = range(1, 9)


def kept_runs(drafter_top1: list[int], seq: list[int], start: int) -> dict[int, int]:
    """{i: how many of the drafter's greedy drafts from position i the verifier keeps} for i past the prompt read;
    drafter_top1[j] is the drafter's top-1 for seq[start + 1 + j] (having read seq[:start + 1 + j])."""
    runs, end = {}, len(seq)
    run = 0
    for i in range(end - 1, start, -1):
        run = run + 1 if drafter_top1[i - start - 1] == seq[i] else 0
        runs[i] = run
    return runs


def oracle_ms(runs: dict[int, int], start: int, end: int, profile) -> float:
    """The least milliseconds to emit seq[start + 1:end] knowing `runs` (lookup_ceiling.least): a round of d drafts
    costs d drafter steps and a verifier pass over d + 1 rows."""
    return least({i: min(k, MAX_DRAFTS) for i, k in runs.items()}, start, end,
                 lambda d: d * profile.draft(1) + profile.verify(d + 1))


def fixed_ms(runs: dict[int, int], start: int, end: int, profile, gamma: int) -> float:
    """Milliseconds to emit seq[start + 1:end] drafting `gamma` tokens every round (fewer only at the end)."""
    ms, i = 0.0, start + 1
    while i < end:
        d = min(gamma, end - i - 1)
        ms += d * profile.draft(1) + profile.verify(d + 1)
        i += min(runs[i], d) + 1
    return ms


def teacher_forced_top1(pair, seq: list[int], start: int) -> list[int]:
    """The drafter's top-1 for every position after seq[start], fed seq one token at a time as a run feeds it (its
    frequency-ranked head also scores the tokens it has seen: weights/heads.FrequentHead)."""
    model = drafter_cache(pair.drafter, pair.vocab_size, pair.drafter.device, pair.drafter.device)
    model.logits(seq, start, 1)  # the prompt but its last token
    return [int(model.logits(seq, j + 1, 1)[-1].argmax()) for j in range(start, len(seq) - 1)]


def measure(pair, prompt: str, tokens: int) -> dict:
    """One prompt: the engine's AR and SD runs (back to back), and how many drafts the verifier keeps where."""
    config = DecodeConfig(max_new_tokens=tokens, gamma="auto")
    ar = generate(pair, prompt, "ar", config)
    sd = generate(pair, prompt, "sd", config)
    if sd.token_ids != ar.token_ids:
        raise RuntimeError(f"SD's output differs from AR's on {prompt[:40]!r}: greedy SD must be lossless")
    prompt_ids = pair.encode(prompt, chat=True)
    seq, start = prompt_ids + ar.token_ids, len(prompt_ids)
    runs = kept_runs(teacher_forced_top1(pair, seq, start), seq, start)
    kept = [runs[i] for i in range(start + 1, len(seq))]
    ar_calls, sd_calls = ([c for r in t.rounds for c in r["calls"]] for t in (ar, sd))
    return {"tokens": len(ar.token_ids), "runs": runs, "start": start, "end": len(seq),
            "ar_calls": ar_calls, "sd_calls": sd_calls, "kept_share": sum(k > 0 for k in kept) / max(len(kept), 1),
            "timed": sum(c["ms"] for c in ar_calls) / sum(c["ms"] for c in sd_calls),
            "measured": ar.summary["wall_ms"] / sd.summary["wall_ms"]}


def prices(row: dict, profile) -> dict:
    """Each policy's ms for one prompt under `profile`: AR's and ours from their recorded forwards, the oracle and
    the fixed ones from the kept runs and SD's recorded prompt reads."""
    price = lambda calls: sum(call_ms(profile, c) for c in calls)  # noqa: E731
    read = price(c for c in row["sd_calls"] if reads_prompt(c))
    ms = {"AR": price(row["ar_calls"]), "ours": price(row["sd_calls"]),
          "oracle": read + oracle_ms(row["runs"], row["start"], row["end"], profile)}
    for g in FIXED:
        ms[f"fixed-{g}"] = read + fixed_ms(row["runs"], row["start"], row["end"], profile, g)
    return ms


def summary(tables: list[dict]) -> str:
    total = lambda key: sum(t[key] for t in tables)  # noqa: E731
    best = min(FIXED, key=lambda g: total(f"fixed-{g}"))
    return (f"oracle {total('AR') / total('oracle'):.2f}x, best fixed (G {best}) "
            f"{total('AR') / total(f'fixed-{best}'):.2f}x, ours {total('AR') / total('ours'):.2f}x")


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--c", type=float, default=None,
                    help="also price every policy with a drafter step at this share of a verifier step")
    args = ap.parse_args(argv)
    pair = load_pair(args.preset)
    profile = pair.costs
    names = pair.describe()
    print(f"{names['drafter']} -> {names['verifier']}: c {profile.c:.3f}, V(2..9) = "
          + " / ".join(f"{profile.V(k):.2f}" for k in range(2, 10)) + f" ({profile.source})")
    print("\n| prompt | tokens | positions where a draft is kept | oracle | best fixed | ours, priced | "
          "ours, its forwards as timed | ours, measured |")
    print("|---|---|---|---|---|---|---|---|")
    rows, tables = [], []
    for n, item in enumerate(prompts(args), 1):
        rows.append(measure(pair, item["prompt"], args.tokens))
        ms = prices(rows[-1], profile)
        tables.append(ms)
        best = min(FIXED, key=lambda g: ms[f"fixed-{g}"])
        print(f"| {n} | {rows[-1]['tokens']} | {rows[-1]['kept_share']:.0%} | {ms['AR'] / ms['oracle']:.2f}x | "
              f"{ms['AR'] / ms[f'fixed-{best}']:.2f}x (G {best}) | {ms['AR'] / ms['ours']:.2f}x | "
              f"{rows[-1]['timed']:.2f}x | {rows[-1]['measured']:.2f}x |", flush=True)
    print(f"\nSD / AR over all {len(rows)} prompts (summed priced times): {summary(tables)}; measured, the median "
          f"over the prompts: {statistics.median(r['measured'] for r in rows):.2f}x")
    if args.c is not None:
        print(f"with c {args.c:.3f} (the drafter's prompt read scaled alike): "
              f"{summary([prices(r, scaled(profile, c=args.c)) for r in rows])}")
    return 0


if __name__ == "__main__":
    run_main(main)
