"""The method: the tier rule and the round plan (plan), speculative sampling (sampling), one round (round), the
drafters behind two methods (proposal, drafters, lookup, early_exit), the three decoders over one round loop
(decoding, config), a model with its KV cache (cached), the chat opening read once (opening), the slim verifier and
its routes (routing, progressive, provisional), what can be loaded (catalog), loading a pair (pair), measuring what
its passes cost here (profile), the trace the pictures read (record, text, trace, trace_check), and a package's
names loaded on first use (lazy).

Imports only `weights/` and `cost/` below it. `plan`, `trace_check` and `catalog` import without torch."""
