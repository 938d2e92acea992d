"""The method: the tier rule and the round plan (plan), speculative sampling (sampling), one round (round), the
drafters behind two methods (proposal, drafters, lookup, early_exit), the three decoders over one round loop
(decoding, config), a model with its KV cache (cached), the chat opening read once (opening), the
slim verifier and its routes (routing, progressive, provisional), loading a pair (pair), measuring what its passes
cost here (profile), and the trace the pictures read (record, text, trace, trace_check).

Imports only `weights/` and `cost/` below it. `plan` and `trace_check` import without torch."""
