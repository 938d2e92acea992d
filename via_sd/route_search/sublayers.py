"""Sub-layers of a verifier: names ("attn.N" / "mlp.N"), skip ratios, and the share of weights each one holds."""

from __future__ import annotations

from ..core.routing import Route

MAX_RATIO = 0.9


def sublayer_name(k: int) -> str:
    """Sub-layer k in execution order: 2*layer is the attention, 2*layer+1 the MLP."""
    return f"{'attn' if k % 2 == 0 else 'mlp'}.{k // 2}"


def sublayer_index(name: str) -> int:
    kind, layer = name.split(".")
    return 2 * int(layer) + (kind == "mlp")


def skippable(num_layers: int) -> list[int]:
    """Every sub-layer outside the first and last layer."""
    return list(range(2, 2 * num_layers - 2))


def check_ratio(ratio: float) -> float:
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 <= ratio <= MAX_RATIO:
        raise ValueError(f"skip ratio must lie in [0, {MAX_RATIO}], got {ratio!r}")
    return float(ratio)


def skip_count(num_layers: int, ratio: float) -> int:
    """How many sub-layers a skip ratio means for this verifier; a clear error when it cannot be done."""
    check_ratio(ratio)
    count = round(ratio * 2 * num_layers)
    most = len(skippable(num_layers))
    if count > most:
        raise ValueError(f"skip ratio {ratio} means {count} of {2 * num_layers} sub-layers, but a {num_layers}-layer "
                         f"verifier keeps its first and last layer, so at most {most} "
                         f"(ratio {most / (2 * num_layers):.2f}) can be skipped")
    return count


def skip_set(route: Route) -> frozenset:
    return frozenset(sublayer_index(s) for s in route.skip)


def skip_names(skip) -> tuple[str, ...]:
    return tuple(sublayer_name(k) for k in sorted(skip))


def sublayer_sizes(verifier) -> tuple[list[int], int]:
    """Bytes of weights of every sub-layer in execution order (norms included), and of the whole
    forward (embedding lookup excluded, output head included): decode reads each of them once per
    step. Bytes, not parameter counts, so that mixed low-bit weights (int4 codes two to a byte, int8,
    fp32 norms) weigh what they cost to read."""
    base, head = verifier.base_model, verifier.get_output_embeddings()

    def count(*modules) -> int:
        return sum(p.numel() * p.element_size() for m in modules for p in m.parameters())

    sizes = []
    for layer in base.layers:
        if hasattr(layer, "pre_feedforward_layernorm"):  # Gemma: two norms around each sub-layer
            sizes += [count(layer.self_attn, layer.input_layernorm, layer.post_attention_layernorm),
                      count(layer.mlp, layer.pre_feedforward_layernorm, layer.post_feedforward_layernorm)]
        else:
            sizes += [count(layer.self_attn, layer.input_layernorm), count(layer.mlp, layer.post_attention_layernorm)]
    return sizes, sum(sizes) + count(base.norm, head)


def weight_share(verifier, route: Route) -> dict:
    """Weight-byte shares (a noise-free proxy of decode cost): `read` = the share a slim forward uses;
    `shared_prefix` = the share before the first skipped sub-layer, which an escalating round could
    reuse from the slim pass instead of recomputing."""
    sizes, total = sublayer_sizes(verifier)
    skip = skip_set(route)
    first = min(skip) if skip else len(sizes)
    return {"read": round(1 - sum(sizes[k] for k in skip) / total, 4),
            "shared_prefix": round(sum(sizes[:first]) / total, 4)}
