"""The benchmark's method names and its result schema, without the engine: the app checks a /bench request's
methods and lists them in its tools before torch is imported (app.py serves the page first)."""

SCHEMA = "via-sd-bench/1"
KINDS = {"lookup": "lookup", "hybrid": "hybrid", "exit": "early-exit"}  # a drafter method's suffix -> its drafter
HF_SELF = {"hf-lookup": "prompt_lookup_num_tokens", "hf-exit": "assistant_early_exit"}  # transformers' own drafters
DRAFTER_METHODS = tuple(f"{m}-{k}" for m in ("sd", "via") for k in KINDS) + tuple(HF_SELF)
LLAMA_METHODS = ("llama-ar", "llama-sd", "llama-lookup")  # the optional llama.cpp peer (llama_peer.py)
OUR_METHODS = ("ar", "sd", "via", "hf") + DRAFTER_METHODS  # the default: every method of ours (drafter_methods.py)
BENCH_METHODS = OUR_METHODS + LLAMA_METHODS  # the peer's only when asked for
