"""The weights and the machinery that runs them: GGUF codes and their cache (gguf_codes, gguf_pack, embedded,
paths), the `weights=` settings and the build of a model in one (settings, build), the int4 / int8 linears and the
kernel rule every pass follows (linears), fused matmuls (fused), low-bit embeddings and heads (heads), attention one
row at a time over a cache (row_attention), the lean forward of drafter and verifier (lean_forward), and ATen's
code path pinned before torch's first operation (numerics), and which CPU this is (machine).

The lowest layer: imports nothing else of the project."""
