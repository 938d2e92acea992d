"""The measurements behind BENCHMARKS.md, one module each, run from the repository root as

    .venv/bin/python -m benchmarks.<name> [--preset embedded] [--help]

Each shares the harness (benchmarks/harness.py): one prompt loader, one paired-and-rotated run, one lock (it takes
/tmp/via-sd-heavy.lock itself, unless a process it runs under holds it already). tests/test_benchmarks.py runs
every one on the tiny random pair.

    ab             paired A/B runs over any DecodeConfig field (the chat opening, progressive verification, the
                   slim verifier's cache, ...): speed, round 0, escalating rounds, agreement, same tokens
    cost_targets   AR, SD, VIA-SD paper and fastest, interleaved per prompt: the cost-aware targets
    first_token    how soon the engine decides its first token
    lookup_ceiling prompt lookup's passes against a fixed lookup and the oracle
    memory         load time and peak memory of a pair (or of the app) around one comparison
    weights_passes per weights setting: pass costs, prompt reads, the drafter's levers, agreement with fp32
    code_path_cost what the machine-independent forward costs
    app_timings    the app's responsiveness targets in headless Chromium
"""
