"""The slim verifier: the full verifier run with some sub-layers skipped (intra-model routing).

A route names the skipped sub-layers as "attn.7" / "mlp.12". The slim verifier shares every
weight with the full verifier (nothing is copied) and keeps its own KV cache, which only the
attention sub-layers it runs ever fill. The first and last layers are never skipped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

ROUTES_DIR = Path(__file__).resolve().parent.parent / "assets" / "routes"
_SUBLAYER = re.compile(r"^(attn|mlp)\.(\d+)$")


@dataclass(frozen=True)
class Route:
    """Which sub-layers the slim verifier skips, plus how the route was made (free-form `meta`)."""

    name: str
    skip: tuple[str, ...] = ()
    num_layers: int | None = None
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def skip_fraction(self) -> float:
        return len(self.skip) / (2 * self.num_layers) if self.num_layers else 0.0

    def skipped(self, kind: str, layer: int) -> bool:
        return f"{kind}.{layer}" in self.skip

    def to_dict(self) -> dict:
        return {"name": self.name, "skip": list(self.skip), "num_layers": self.num_layers,
                "skip_fraction": self.skip_fraction, **self.meta}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, data: dict, name: str | None = None) -> "Route":
        if not isinstance(data, dict) or "skip" not in data:
            raise ValueError("a route file must be a JSON object with a 'skip' list of sub-layers")
        meta = {k: v for k, v in data.items() if k not in ("name", "skip", "num_layers", "skip_fraction")}
        return cls(name=name or data.get("name", "custom"), skip=tuple(data["skip"]),
                   num_layers=data.get("num_layers"), meta=meta)


def validate_skip(skip, num_layers: int) -> tuple[str, ...]:
    """Checks sub-layer names against a verifier with `num_layers` layers; returns them sorted."""
    out = []
    for item in skip:
        m = _SUBLAYER.match(str(item))
        if not m:
            raise ValueError(f"unknown sub-layer {item!r}: write 'attn.N' or 'mlp.N' with a layer number N")
        layer = int(m.group(2))
        if not 0 <= layer < num_layers:
            raise ValueError(f"sub-layer {item!r} is outside the verifier's layers 0..{num_layers - 1}")
        if layer in (0, num_layers - 1):
            raise ValueError(f"sub-layer {item!r} is in the first or last layer, which a route never skips")
        out.append(f"{m.group(1)}.{layer}")
    return tuple(sorted(set(out), key=lambda s: (int(s.split(".")[1]), s)))


def shipped_routes() -> dict[str, Path]:
    return {p.stem: p for p in sorted(ROUTES_DIR.glob("*.json"))}


def resolve_route(route, num_layers: int) -> Route:
    """A Route from: None/"none" (skip nothing), a shipped route name, a JSON path, a list of
    sub-layer names, or a Route."""
    if route is None or route == "none":
        return Route("none", (), num_layers)
    if isinstance(route, Route):
        data, name = route.to_dict(), route.name
    elif isinstance(route, (list, tuple)):
        data, name = {"skip": list(route)}, "custom"
    elif isinstance(route, (str, Path)) and str(route) in shipped_routes():
        path = shipped_routes()[str(route)]
        data, name = json.loads(path.read_text()), path.stem
    elif isinstance(route, (str, Path)) and str(route).endswith(".json"):
        path = Path(route)
        if not path.is_file():
            raise ValueError(f"route file {path} does not exist")
        data, name = json.loads(path.read_text()), path.stem
    else:
        known = ", ".join(["none", *shipped_routes()])
        raise ValueError(f"unknown route {route!r}: use one of [{known}], a .json file, or a list like ['attn.7']")
    if data.get("num_layers") not in (None, num_layers):
        raise ValueError(f"route {name!r} was made for a {data['num_layers']}-layer verifier, "
                         f"this verifier has {num_layers} layers")
    base = Route.from_dict(data, name)
    return Route(base.name, validate_skip(base.skip, num_layers), num_layers, base.meta)


def _decoder_parts(verifier):
    """(base model with embed_tokens/layers/norm/rotary_emb, output head) of a HF causal LM."""
    base = verifier.base_model
    for attr in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if not hasattr(base, attr):
            raise TypeError(f"{type(verifier).__name__} is not a Llama/Qwen2/Mistral/Gemma-style decoder "
                            f"(no '{attr}'); the slim verifier cannot route it")
    layer = base.layers[0]
    for attr in ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm"):
        if not hasattr(layer, attr):
            raise TypeError(f"{type(layer).__name__} has no '{attr}'; the slim verifier cannot route it")
    return base, verifier.get_output_embeddings()


class SlimVerifier:
    """The verifier's own modules, run in order, skipping the sub-layers its route names.

    Callable like a HF model: `slim(input_ids, past_key_values=cache).logits`.
    """

    def __init__(self, verifier, route: Route):
        self.verifier = verifier
        self.base, self.lm_head = _decoder_parts(verifier)
        self.config = self.base.config
        n = self.config.num_hidden_layers
        if not isinstance(route, Route):
            raise ValueError(f"route must be a via_sd.Route, got {type(route).__name__}: use resolve_route(...)")
        if route.num_layers not in (None, n):
            raise ValueError(f"route {route.name!r} was made for a {route.num_layers}-layer verifier, "
                             f"this verifier has {n} layers")
        validate_skip(route.skip, n)  # a route may not skip the first or last layer
        self.route = route
        self.layer_types = list(getattr(self.config, "layer_types", None) or ["full_attention"] * n)
        self._gemma_norms = hasattr(self.base.layers[0], "pre_feedforward_layernorm")

    @property
    def device(self) -> torch.device:
        return self.base.embed_tokens.weight.device

    def parameters(self):
        """The parameters the slim pass uses: all of them belong to the verifier."""
        seen = set()
        used = [self.base.embed_tokens, self.base.norm, self.lm_head]
        for i, layer in enumerate(self.base.layers):
            if not self.route.skipped("attn", i):
                used += [layer.input_layernorm, layer.self_attn]
            if not self.route.skipped("mlp", i):
                used += [layer.post_attention_layernorm, layer.mlp]
        for module in used:
            for p in module.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield p

    def _attention(self, layer, h, **kwargs):
        x, _ = layer.self_attn(hidden_states=layer.input_layernorm(h), **kwargs)
        if self._gemma_norms:  # Gemma normalizes the attention output before the residual add
            x = layer.post_attention_layernorm(x)
        return h + x

    def _mlp(self, layer, h):
        if self._gemma_norms:
            return h + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(h)))
        return h + layer.mlp(layer.post_attention_layernorm(h))

    @torch.inference_mode()
    def __call__(self, input_ids, past_key_values=None, use_cache=True, logits_to_keep: int = 0, **_):
        h = self.base.embed_tokens(input_ids.to(self.device))
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        position_ids = torch.arange(past, past + h.shape[1], device=h.device).unsqueeze(0)
        mask_kwargs = dict(config=self.config, inputs_embeds=h, attention_mask=None,
                           past_key_values=past_key_values, position_ids=position_ids)
        masks = {"full_attention": create_causal_mask(**mask_kwargs)}
        if "sliding_attention" in self.layer_types:
            masks["sliding_attention"] = create_sliding_window_causal_mask(**mask_kwargs)
        position_embeddings = self.base.rotary_emb(h, position_ids)
        for i, layer in enumerate(self.base.layers):
            h = h.to(layer.input_layernorm.weight.device)  # layers may sit on several GPUs (device_map)
            if not self.route.skipped("attn", i):
                h = self._attention(layer, h, attention_mask=masks[self.layer_types[i]],
                                    position_ids=position_ids, past_key_values=past_key_values,
                                    position_embeddings=tuple(t.to(h.device) for t in position_embeddings))
            if not self.route.skipped("mlp", i):
                h = self._mlp(layer, h)
        h = self.base.norm(h.to(self.base.norm.weight.device))
        if logits_to_keep:
            h = h[:, -logits_to_keep:]
        logits = self.lm_head(h.to(self.lm_head.weight.device))
        return SimpleNamespace(logits=logits, past_key_values=past_key_values)
