"""The markdown tables of a benchmark or sweep result (add a column here)."""

from __future__ import annotations

from .calls import PHASES
from .drafter_methods import NAMES as DRAFTER_NAMES
from .metrics import FIDELITY_TARGET, median, median_ratio, paired_ratios, run_key

NAMES = {"ar": "AR", "sd": "SD", "via": "VIA-SD", "hf": "HF assisted", "llama-ar": "llama.cpp AR",
         "llama-sd": "llama.cpp SD", "llama-lookup": "llama.cpp lookup"}
NAMES.update(DRAFTER_NAMES)  # sd-lookup, hf-exit, ... (drafter_methods.py)


def _f(value, fmt="{:.2f}", none="–"):
    return none if value is None else fmt.format(value)


def markdown(result: dict) -> str:
    """The bench result as markdown: per task, per position, where the time goes, projection,
    targets, and the summary table last."""
    s, cfg = result["summary"], result["config"]
    th, methods = cfg["thresholds"], result["methods"]
    lines = []
    tasks = [t for t in s[methods[0]] if t != "all"]
    if len(tasks) > 1:
        both, hf = "via" in methods and "sd" in methods, "sd" in methods and "hf" in methods
        lines += ["| task | " + " | ".join(f"{NAMES[m]} tokens/s" for m in methods)
                  + (" | VIA-SD × SD | VIA-SD agreement" if both else "") + (" | SD × HF" if hf else "") + " |",
                  "|---|" + "---|" * (len(methods) + 2 * both + hf)]
        for t in tasks:
            row = [_f(s[m][t]["tokens_per_s"]) for m in methods]
            if both:
                row += [_f(s["via"][t]["speedup_vs_sd"], "{:.2f}×"), _f(s["via"][t]["agreement"], "{:.3f}")]
            if hf:
                row.append(_f(median_ratio([r for r in result["runs"] if r["task"] == t], "sd", "hf"), "{:.2f}×"))
            lines.append(f"| {t} | " + " | ".join(row) + " |")
        lines.append("")
    positions = max((len(s[m]["all"]["acceptance_by_position"] or []) for m in methods), default=0)
    if positions:  # as many columns as the longest round drafted (gamma may be "auto")
        lines += ["Per-position acceptance (share of drafts at position k kept):", "",
                  "| method | " + " | ".join(f"k={k}" for k in range(1, positions + 1)) + " |",
                  "|---|" + "---|" * positions]
        for m in methods:
            acc = s[m]["all"]["acceptance_by_position"]
            if acc and any(v is not None for v in acc):
                cells = [_f(v) for v in acc] + ["–"] * (positions - len(acc))
                lines.append(f"| {NAMES[m]} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += [*_time_md(result), ""]
    if result.get("projection"):
        p = result["projection"]
        lines += [f"**Projected** ({p['label']}):", "", "| method | projected tokens/s | × AR | × SD |",
                  "|---|---|---|---|"]
        for m, v in p["summary"].items():
            lines.append(f"| {NAMES.get(m, m)} | {_f(v['tokens_per_s'], '{:.1f}')} | "
                         f"{_f(v['speedup_vs_ar'], '{:.2f}×')} | {_f(v['speedup_vs_sd'], '{:.2f}×')} |")
        lines += [f"- {n}" for n in p["notes"]] + [""]
    lines += [*_peers_md(result), *_targets_md(result), *_whole_runs_md(result), ""]
    lines += [f"**{result['models']['drafter']} → {result['models']['verifier']}**, route "
              f"`{result['models']['route']}` ({len(result['models']['skipped'])} sub-layers skipped), "
              f"{result['machine']['device']} {result['models'].get('weights') or result['machine']['dtype']} weights, "
              f"gamma {cfg['gamma']}, "
              f"{cfg['max_new_tokens']} new tokens, temperature {cfg['temperature']}, thresholds accept "
              f"{th['accept']} / escalate {th['escalate']} (signal {th['signal']}), {len(result['prompts'])} "
              f"prompt(s) × {result['repeats']} repeat(s); medians, speed-ups from paired runs; peak memory: "
              f"{s[methods[0]]['all']['peak_memory_kind']}.", "",
              "| method | tokens/s | × AR | × SD | decode tokens/s: measured / predicted (error) | mean gamma | "
              "accepted length | rejection rate (paper: tier A kept) | "
              "verified rejection rate | unverified share | full calls / token | "
              "tiers draft/slim/full | agreement | Δ log-prob vs AR | same output as AR | peak memory (MiB) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in methods:
        a = s[m]["all"]
        tiers = "/".join(f"{100 * a['tier_shares'][t]:.0f}%" for t in ("draft", "slim", "full")) \
            if a["tier_shares"] else "–"
        lines.append(f"| {NAMES[m]} | {_f(a['tokens_per_s'])} | {_f(a['speedup_vs_ar'], '{:.2f}×')} | "
                     f"{_f(a['speedup_vs_sd'], '{:.2f}×')} | {_f(a.get('decode_tokens_per_s'))} / "
                     f"{_f(a.get('predicted_tokens_per_s'))} ({_f(a.get('prediction_error'), '{:+.0%}')}) | "
                     f"{_f(a.get('gamma_mean'), '{:.1f}')} | {_f(a['mean_accepted_length'])} | "
                     f"{_f(a['rejection_rate'])} | {_f(a.get('verified_rejection_rate'))} | "
                     f"{_f(a.get('unverified_share'))} | {_f(a['full_calls_per_token'])} | {tiers} | "
                     f"{_f(a['agreement'], '{:.3f}')} | {_f(a['logprob_delta_vs_ar'], '{:+.3f}')} | "
                     f"{_f(a['identical_to_ar'], '{:.0%}')} | {_f(a['peak_memory_mb'], '{:.0f}')} |")
    return "\n".join(lines)


def _whole_runs_md(result: dict) -> list[str]:
    """× AR read two more ways: over the runs whose AR reply ran all max_new_tokens (one that ends early pays both
    prompt reads for fewer tokens), and over every run's tokens and time summed (each pair's own machine). Rates are
    new tokens over a run's wall time (a run's tokens_per_s): a method whose output is not AR's may emit another
    number of tokens."""
    runs, n = result["runs"], result["config"]["max_new_tokens"]
    ar = {run_key(r): r for r in runs if r["method"] == "ar"}
    methods = [m for m in result["methods"] if m != "ar" and not m.startswith("llama-")]
    if not ar or not methods:
        return []
    whole = {k for k, r in ar.items() if r["new_tokens"] == n}
    prompts = len({k[0] for k in whole})
    rate = lambda runs: sum(r["new_tokens"] for r in runs) / max(sum(r["wall_ms"] for r in runs), 1e-9)  # noqa: E731
    parts = []
    for m in methods:
        paired = {run_key(p): p["ratio"] for p in paired_ratios(runs, m, "ar")}  # same machine, tokens_per_s
        mine = [r for r in runs if r["method"] == m and run_key(r) in paired]
        summed = rate(mine) / max(rate([ar[run_key(r)] for r in mine]), 1e-9)
        parts.append(f"{NAMES[m]} {_f(median([v for k, v in paired.items() if k in whole]), '{:.2f}×')} AR over "
                     f"those, {summed:.2f}× over all tokens and time")
    return [f"Whole runs: the AR reply ran all {n} new tokens on {prompts} of {len(result['prompts'])} prompt(s); "
                + "; ".join(parts) + " (a run's wall time, its prompt reads included; medians of paired runs).", ""]


def _peers_md(result: dict) -> list[str]:
    """The llama.cpp peer (llama_peer.py): its speed against our AR and its own, or why it was skipped."""
    s, runs, skipped = result["summary"], result["runs"], result.get("skipped_methods") or {}
    out = [f"Skipped {', '.join(skipped)}: {'; '.join(sorted(set(skipped.values())))}", ""] if skipped else []
    peers = [m for m in result["methods"] if m.startswith("llama-")]
    if not peers:
        return out
    out += ["llama.cpp peer (the same Q4_K_M verifier file, greedy, runs paired with ours; medians):", "",
            "| method | tokens/s | × our AR | × llama.cpp AR | same output as our AR | as llama.cpp AR | "
            "prompt ids as ours |", "|---|---|---|---|---|---|---|"]
    own = {run_key(r): r["token_ids"] for r in runs if r["method"] == "llama-ar"}
    share = lambda rs, ok: sum(map(ok, rs)) / len(rs) if rs else None  # noqa: E731
    for m in peers:
        a, mine = s[m]["all"], [r for r in runs if r["method"] == m]
        as_own = share([r for r in mine if run_key(r) in own], lambda r: r["token_ids"] == own[run_key(r)])
        same_prompt = share(mine, lambda r: bool(r.get("prompt_ids_match_ours")))
        out.append(f"| {NAMES[m]} | {_f(a['tokens_per_s'])} | {_f(a['speedup_vs_ar'], '{:.2f}×')} | "
                   f"{_f(median_ratio(runs, m, 'llama-ar'), '{:.2f}×')} | {_f(a.get('identical_to_ar'), '{:.0%}')} | "
                   f"{_f(as_own, '{:.0%}')} | {_f(same_prompt, '{:.0%}')} |")
    return out + [""]


def _targets_md(result: dict) -> list[str]:
    t, out = result["targets"], ["Targets:"]
    if "sd_vs_hf" in t:
        x = t["sd_vs_hf"]
        output = {True: "identical", False: "DIFFERENT", None: "sampled (not compared)"}[x["identical_output"]]
        out.append(f"- SD vs HF assisted generation: {_f(x['speed_ratio'], '{:.2f}×')} (target ≥ 1.00×), output "
                   f"{output} — {'met' if x['met'] else 'MISSED'}")
    if "via_vs_sd" in t:
        x = t["via_vs_sd"]
        missed = ", ".join(k for k, v in x["parts"].items() if not v)
        out.append(f"- VIA-SD vs SD: {_f(x['speedup_vs_sd'], '{:.2f}×')} (target ≥ 1.10×), agreement "
                   f"{_f(x['agreement'], '{:.3f}')} (≥ 0.95), rejection rate lower by {_f(x['rejection_drop'])} "
                   f"(≥ 0.10) — {'met' if x['met'] else f'MISSED ({missed})'}")
    return out if len(out) > 1 else []


def _time_md(result: dict) -> list[str]:
    s, a = result["summary"], result["analysis"]
    traced = [m for m in result["methods"] if s[m]["all"]["phase_shares"]]
    if not traced:
        return []
    out = ["Where the time goes (ms per emitted token, by phase; share of wall time in brackets):", "",
           "| method | " + " | ".join(PHASES) + " | total |", "|---|" + "---|" * (len(PHASES) + 1)]
    for m in traced:
        ms, sh = s[m]["all"]["ms_per_token"], s[m]["all"]["phase_shares"]
        out.append(f"| {NAMES[m]} | " + " | ".join(f"{ms[p]:.0f} ({100 * sh[p]:.0f}%)" for p in PHASES)
                   + f" | {sum(ms.values()):.0f} |")
    c = a["costs"]
    out += ["", "Forward-pass costs (ms per call, mean tokens fed per call):", "",
            f"- drafter: {_f(c['drafter_ms_per_call'], '{:.1f}')} ms/call; full verifier at 1 token (AR): "
            f"{_f(c['full_ms_per_call_ar'], '{:.1f}')} ms; full verifier verifying (SD, "
            f"{_f(c['full_tokens_per_call_sd'], '{:.1f}')} tokens): {_f(c['full_ms_per_call_sd'], '{:.1f}')} ms; "
            f"slim verifier (VIA, {_f(c['slim_tokens_per_call_via'], '{:.1f}')} tokens): "
            f"{_f(c['slim_ms_per_call_via'], '{:.1f}')} ms; full verifier in VIA "
            f"({_f(c['full_tokens_per_call_via'], '{:.1f}')} tokens): {_f(c['full_ms_per_call_via'], '{:.1f}')} ms.",
            f"- ratios: drafter / full(1 token) = {_f(c['ratio_drafter_to_full_ar'])}, "
            f"full(verify) / full(1 token) = {_f(c['ratio_full_sd_to_full_ar'])}, "
            f"slim / full(verify) = {_f(c['ratio_slim_to_full_sd'])}."]
    if c.get("drafter_prompt_ms_per_run") is not None:  # (ms/call above leave the prompt reads out)
        out.append(f"- prompt reads, once a run: SD's drafter {c['drafter_prompt_ms_per_run']:.0f} ms "
                   f"({c['drafter_prompt_tokens_per_run']:.0f} tokens), which AR does not pay; the full verifier's "
                   f"{_f(c.get('full_prompt_ms_per_run_ar'), '{:.0f}')} ms, which both pay.")
    g = a.get("via_gap")
    if g:
        out.append(f"- VIA-SD {g['ms_per_token_via']:.0f} ms/token vs SD {g['ms_per_token_sd']:.0f}; full calls per "
                   f"token {_f(g['full_calls_per_token']['via'])} vs {_f(g['full_calls_per_token']['sd'])}, plus "
                   f"{_f(g['slim_calls_per_token_via'])} slim calls per token. For 1.10× SD with everything else as "
                   f"measured, a slim call may cost at most {_f(g['slim_ms_per_call_for_target'], '{:.0f}')} ms "
                   f"(slim / full(verify) ≤ {_f(g['slim_to_full_ratio_for_target'])}; ≤ 0 means unreachable "
                   "by a cheaper slim pass alone).")
    return out


def _best_md(b: dict | None) -> str:
    if b is None:
        return f"No point reached agreement ≥ {FIDELITY_TARGET}."
    return (f"Fastest with agreement ≥ {FIDELITY_TARGET}: route {b['route']}, signal {b['signal']}, accept "
            f"{b['accept']:.2f}, escalate {b['escalate']:.2f}: {_f(b['speedup'], '{:.2f}×')} SD, agreement "
            f"{b['fidelity']:.3f}.")


def markdown_sweep(sweep: dict) -> str:
    cfg = sweep["config"]
    sd = sweep["sd"]
    lines = [f"Threshold sweep: {len(sweep['prompts'])} prompts × {sweep['repeats']} repeats, gamma {cfg['gamma']}, "
             f"{cfg['max_new_tokens']} new tokens; speed-up = median paired tokens/s ratio over plain SD "
             f"({_f(sd['tokens_per_s'])} tokens/s, agreement {_f(sd['fidelity'], '{:.3f}')}); fidelity = full-model "
             "top-1 agreement. ★ = on the speed-up vs fidelity frontier.", "", _best_md(sweep["best"]), "",
             "| route | signal | accept | escalate | × SD | agreement | rejection rate (paper: tier A kept) | "
             "verified rejection rate | unverified share | accepted length | "
             "full calls / token | slim calls / token | tiers draft/slim/full | frontier |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in sorted(sweep["points"], key=lambda p: -(p["speedup"] or 0)):
        tiers = "/".join(f"{100 * p['tier_shares'][t]:.0f}%" for t in ("draft", "slim", "full"))
        lines.append(f"| {p['route']} | {p['signal']} | {p['accept']:.2f} | {p['escalate']:.2f} | "
                     f"{_f(p['speedup'], '{:.2f}×')} | {_f(p['fidelity'], '{:.3f}')} | {_f(p['rejection_rate'])} | "
                     f"{_f(p.get('verified_rejection_rate'))} | {_f(p.get('unverified_share'))} | "
                     f"{_f(p['mean_accepted_length'])} | {_f(p['full_calls_per_token'])} | "
                     f"{_f(p['slim_calls_per_token'])} | {tiers} | {'★' if p['pareto'] else ''} |")
    lines.append(f"| SD | – | – | – | 1.00× | {_f(sd['fidelity'], '{:.3f}')} | {_f(sd['rejection_rate'])} | "
                 f"{_f(sd.get('verified_rejection_rate'))} | 0.00 | {_f(sd['mean_accepted_length'])} | – | – | – | |")
    return "\n".join(lines)
