"""Side-by-side benchmark: AR, plain SD, VIA-SD and transformers' assisted generation on one pair.

    python -m via_sd bench --preset embedded --prompts assets/prompts/mixed.jsonl \
        --methods ar,sd,via,hf --max-new-tokens 128 --repeats 3 --json out.json
    python -m via_sd bench ... --sweep accept=0.3:0.9:0.1,escalate=0.0:0.6:0.1 --signals slim,draft

Runs are interleaved (per repeat, per prompt, one run of each method in turn, the order rotating)
after a warm-up, so a noisy machine slows every method alike. Speed-ups are medians of paired
ratios: method vs baseline on the same prompt in the same repeat. `tokens_per_s` counts the whole
call (prompt encoding and prefill included) with one clock for every method, since transformers'
`generate` cannot be split into prefill and decode; the engine's decode-only rate is kept as
`decode_tokens_per_s`. Acceptance statistics are pooled over runs (vLLM's way: accepted length =
emitted tokens / verification rounds, bonus included). `hf` is
`verifier.generate(assistant_model=drafter)` with the same draft length and the same early stop
(`draft_stop`, transformers' `assistant_confidence_threshold`; off by default).

Where things are: inputs (prompt files, grids), run (timed runs, the interleaved benchmark), hf (the
transformers baseline), calls (forward calls rebuilt from a trace), metrics (aggregation, targets),
sweep, project (GPU projection), report (markdown tables), llama_peer (llama.cpp as an optional
peer: `--methods ar,llama-ar,llama-sd,llama-lookup` once `pip install -r requirements-peers.txt` built it; without
it those methods are skipped with one line). The command line is via_sd/cli/bench.py.

Python API (the app uses it for small sweeps):
    result = run_bench(pair, prompts, methods=("ar", "sd", "via"), config=DecodeConfig(...), repeats=3)
    sweep = run_sweep(pair, prompts, config, accept=[0.5, 0.7], escalate=[0.0, 0.2], signals=["slim"])
    print(markdown(result)); print(markdown_sweep(sweep))
"""

from ..core.lazy import lazy_names

# The public names load on first use (as via_sd's own): `via_sd.bench.methods` and `via_sd.bench.inputs` import no
# torch, so the app checks a /bench request's methods and prompts before the engine is imported.
_PUBLIC = {
    "calls": ("MODELS", "PHASES", "call_lengths", "forward_calls", "trace_record"),
    "hf": ("generate_hf",),
    "inputs": ("DEFAULT_PROMPTS", "as_prompts", "load_prompts", "parse_grid", "parse_values"),
    "metrics": ("FIDELITY_TARGET", "analysis", "metrics", "paired_ratios", "summarize_bench", "targets"),
    "project": ("project",),
    "report": ("NAMES", "markdown", "markdown_sweep"),
    "llama_peer": ("NOT_INSTALLED",),
    "methods": ("BENCH_METHODS", "LLAMA_METHODS", "OUR_METHODS", "SCHEMA"),
    "run": ("machine_info", "peak_memory", "run_bench", "run_once", "score_runs"),
    "sweep": ("pareto", "run_sweep"),
}
__all__, __getattr__, __dir__ = lazy_names(__name__, globals(), _PUBLIC)
