"""The slim verifier: the full verifier run with some sub-layers skipped (intra-model routing).

A route names the skipped sub-layers as "attn.7" / "mlp.12". The slim verifier shares every
weight with the full verifier (nothing is copied); its KV cache is its own when it runs alone, and
shared with the full verifier for the sub-layers before the route's first skip under progressive
verification (`progressive.ProgressiveVerifier`). The first and last layers are never skipped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import DynamicCache
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from ..weights.lean_cache import LeanCache
from ..weights.lean_forward import LeanNet, exact
from .catalog import ROUTES_DIR, shipped_routes  # noqa: F401 (re-exported)
from ..weights.row_attention import extending

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


# Decoder families whose forward pass the slim verifier reproduces exactly (route "none" equals the
# verifier's logits, tests/test_architectures.py); anything else is refused when the pair loads.
FAMILIES = {
    "llama": "Llama (Llama 3.x's rope scaling included)", "mistral": "Mistral (sliding window in every layer)",
    "qwen2": "Qwen2", "qwen3": "Qwen3 (RMS norm of each head's queries and keys, inside attention)",
    "phi3": "Phi-3 (fused qkv_proj and gate_up_proj; sliding window in every layer)",
    "gemma2": "Gemma2 (sandwich norms, final logit soft-capping)",
    "gemma3_text": "Gemma3 (sliding and global layers, rotary per layer type, soft-capping)",
    "granite": "Granite (embedding, residual and logit multipliers)",
}

# families without `layer_types` whose every layer slides when the config sets a window (their models pick one mask)
EVERY_LAYER_SLIDES = ("mistral", "phi3")


def _decoder_parts(verifier):
    """(base model with embed_tokens/layers/norm/rotary_emb, output head) of a HF causal LM."""
    kind = getattr(verifier.config, "model_type", None)
    if kind not in FAMILIES:
        raise ValueError(f"the slim verifier cannot route a {kind!r} verifier ({type(verifier).__name__}): it "
                         f"reproduces only these decoder families exactly: {', '.join(FAMILIES)}; pick a verifier "
                         "of one of them")
    return verifier.base_model, verifier.get_output_embeddings()


class SlimVerifier:
    """The verifier's own modules, run in order, skipping the sub-layers its route names.

    Callable like a HF model: `slim(input_ids, past_key_values=cache).logits`. Sub-layer k is
    attention of layer k // 2 when k is even, its MLP when odd; `run` executes a range of them, so
    the slim and the full verifier can share the sub-layers before the first skipped one
    (progressive verification, see `ProgressiveVerifier`), and route search can skip any set of them
    and resume from a recorded state (route_search.teacher). This is the one forward of the slim, full
    and progressive verifier: the engine, route search and scripts/gpu_check.py all run it.

    Several GPUs / offloading (accelerate's device_map): every module is entered through its
    accelerate hook, the decoder layer's included (which moves the hidden states, masks and rotary
    tensors to the layer's device and brings offloaded weights in), so nothing assumes one device.
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
        window = self.config.model_type in EVERY_LAYER_SLIDES and getattr(self.config, "sliding_window", None)
        every = "sliding_attention" if window else "full_attention"
        self.layer_types = list(getattr(self.config, "layer_types", None) or [every] * n)
        self._gemma_norms = hasattr(self.base.layers[0], "pre_feedforward_layernorm")
        cfg = verifier.config
        self._embedding_scale = getattr(cfg, "embedding_multiplier", 1.0) if cfg.model_type == "granite" else 1.0
        self._residual_scale = getattr(cfg, "residual_multiplier", 1.0) if cfg.model_type == "granite" else 1.0
        self._logits_scale = getattr(cfg, "logits_scaling", 1.0) if cfg.model_type == "granite" else 1.0
        self._softcap = getattr(cfg, "final_logit_softcapping", None)
        self._rotary_per_type = cfg.model_type == "gemma3_text"
        self.skipped = [self.route.skipped("mlp" if k % 2 else "attn", k // 2) for k in range(2 * n)]
        self.skip_set = frozenset(k for k, s in enumerate(self.skipped) if s)

    @property
    def device(self) -> torch.device:
        """Where input ids go (the embedding's execution device)."""
        return _device_of(self.base.embed_tokens)

    @property
    def sublayers(self) -> int:
        return 2 * self.config.num_hidden_layers

    @property
    def first_skip(self) -> int:
        """The first skipped sub-layer (all of them when the route skips none): slim and full agree before it."""
        return self.skipped.index(True) if True in self.skipped else self.sublayers

    @property
    def lean(self) -> LeanNet | None:
        """The lean forward of this verifier (weights/lean_forward.py) where it gives the same bits, else None."""
        if "_lean" not in self.__dict__:
            self._lean = LeanNet(self.verifier) if exact(self.verifier) else None
        return self._lean

    def new_cache(self):
        """An empty KV cache for `run`: the lean forward's where it runs, else transformers' DynamicCache."""
        return self.lean.new_cache() if self.lean is not None else DynamicCache()

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

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.base.embed_tokens(input_ids.to(self.device)) * self._embedding_scale

    def run(self, h: torch.Tensor, start: int, cache, sublayers: range, skip=True, record: list | None = None):
        """Runs `sublayers` on hidden states h of positions start.. and returns the hidden states after them.

        `skip`: True skips the route's sub-layers, False none, a set of sub-layer indices those (route
        search). `cache` holds every attention sub-layer run here for the positions before start (None: no
        cache, start 0). `record`, a list, receives the hidden states entering every sub-layer of the range."""
        skipped = self.skip_set if skip is True else frozenset(skip or ())
        if isinstance(cache, LeanCache) and record is None:  # the same operations, without the per-layer machinery
            return self.lean.run(h, start, cache, sublayers, skipped)
        ran = [k for k in sublayers if k % 2 == 0 and k not in skipped]
        context = self._attention_inputs(h, start, cache, ran[0] // 2) if ran else {}
        with extending(start > 0):  # low-bit linears: a pass over a cache computes each row as a step would
            for i, group in groupby(sublayers, key=lambda k: k // 2):
                h = self._layer(i, list(group), h, skipped, cache, context, record)
        return h

    def _attention_inputs(self, h, start: int, cache, layer_idx: int) -> dict:
        """Masks, rotary embeddings and positions per layer type, made once per pass (on h's device)."""
        position_ids = torch.arange(start, start + h.shape[1], device=h.device).unsqueeze(0)
        mask_kwargs = dict(config=self.config, inputs_embeds=h, attention_mask=None, past_key_values=cache,
                           position_ids=position_ids, layer_idx=layer_idx)  # every layer run holds `start` tokens
        masks = {"full_attention": create_causal_mask(**mask_kwargs)}
        if "sliding_attention" in self.layer_types:
            masks["sliding_attention"] = create_sliding_window_causal_mask(**mask_kwargs)
        if self._rotary_per_type:
            rotary = {t: self.base.rotary_emb(h, position_ids, t) for t in set(self.layer_types)}
        else:
            rotary = dict.fromkeys(set(self.layer_types), self.base.rotary_emb(h, position_ids))
        return {kind: dict(attention_mask=masks[kind], position_embeddings=rotary[kind], position_ids=position_ids)
                for kind in set(self.layer_types)}

    def _layer(self, i: int, sublayers: list, h, skipped, cache, context: dict, record):
        """Sub-layers of decoder layer i, entered once through the layer's accelerate hook when it has one."""
        if all(k in skipped for k in sublayers):
            if record is not None:
                record.extend([h] * len(sublayers))
            return h
        layer, inputs = self.base.layers[i], context.get(self.layer_types[i], {})
        hook = getattr(layer, "_hf_hook", None)
        if hook is not None:  # accelerate: to the layer's device, offloaded weights brought in
            (h,), inputs = hook.pre_forward(layer, h, **inputs)
        else:
            device = _device_of(layer.input_layernorm)
            h, inputs = h.to(device), {k: _to(v, device) for k, v in inputs.items()}
        for k in sublayers:
            if record is not None:
                record.append(h)
            if k in skipped:
                continue
            h = self._attention(layer, h, past_key_values=cache, **inputs) if k % 2 == 0 else self._mlp(layer, h)
        return hook.post_forward(layer, h) if hook is not None else h

    def _attention(self, layer, h, **kwargs):
        x, _ = layer.self_attn(hidden_states=layer.input_layernorm(h), **kwargs)
        if self._gemma_norms:  # Gemma normalizes the attention output before the residual add
            x = layer.post_attention_layernorm(x)
        return h + x * self._residual_scale

    def _mlp(self, layer, h):
        if self._gemma_norms:
            return h + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(h)))
        return h + layer.mlp(layer.post_attention_layernorm(h)) * self._residual_scale

    def head(self, h: torch.Tensor, logits_to_keep: int = 0) -> torch.Tensor:
        """Final norm and output head (with the family's logit scaling / soft-capping)."""
        if logits_to_keep:
            h = h[:, -logits_to_keep:]
        h = self.base.norm(_to_module(self.base.norm, h))
        logits = self.lm_head(_to_module(self.lm_head, h))
        if self._logits_scale != 1.0:
            logits = logits / self._logits_scale
        if self._softcap is not None:
            logits = torch.tanh(logits / self._softcap) * self._softcap
        return logits

    @torch.inference_mode()
    def __call__(self, input_ids, past_key_values=None, use_cache=True, logits_to_keep: int = 0, **_):
        start = past_key_values.get_seq_length() if past_key_values is not None else 0
        h = self.run(self.embed(input_ids), start, past_key_values, range(self.sublayers), skip=True)
        return SimpleNamespace(logits=self.head(h, logits_to_keep), past_key_values=past_key_values)


def _device_of(module) -> torch.device:
    """Where `module` computes: its accelerate hook's execution device, else where its weights are."""
    hook = getattr(module, "_hf_hook", None)
    for h in getattr(hook, "hooks", [hook]):  # one hook, or accelerate's SequentialHook of several
        device = getattr(h, "execution_device", None)
        if device is not None:
            return torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    return next(module.parameters()).device


def _to(value, device):
    """A tensor, a tuple of tensors or None, on `device`."""
    if isinstance(value, tuple):
        return tuple(t.to(device) for t in value)
    return value.to(device) if value is not None else None


def _to_module(module, h: torch.Tensor) -> torch.Tensor:
    """h for `module`: its accelerate hook moves inputs itself; without one, h goes to its weights."""
    return h if hasattr(module, "_hf_hook") else h.to(_device_of(module))
