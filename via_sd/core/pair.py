"""Load a drafter / verifier pair: presets, hub ids, local folders, GGUF files.

`weights=` picks the precision (weights/settings.py): "auto" is int4 on CPU and bf16 on CUDA; "fp32",
"bf16" and "int4" work with every source. A verifier is spread over several GPUs with
accelerate's `device_map="auto"`. Remote code is never trusted. The slim verifier is a routed view of the
verifier (see routing.py), so a pair holds two sets of weights, not three.
"""

from __future__ import annotations

import gc
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from .catalog import NO_ROUTE, PRESETS, ModelLoadError, NoRouteWarning  # noqa: F401 (re-exported)
from .opening import Openings
from .provisional import provisional_route
from .routing import Route, SlimVerifier, resolve_route
from .shared_vocab import check_shared_tokenizer, load_tokenizer, same_tokenizer_files

Progress = Callable[[str, float], None]


def unrouted(num_layers: int) -> Route:
    """The route of a pair loaded without one: skips nothing, and says it is missing (`Route.meta["missing"]`)."""
    return Route("none", (), num_layers, {"missing": True})


def no_route_message(drafter: str, verifier: str) -> str:
    """NO_ROUTE, and how to get a route for this pair."""
    return (f"{NO_ROUTE} (tier B saves nothing). Search one once, cached for this verifier: in the app's model "
            f"panel, or python -m via_sd route --drafter {drafter} --verifier {verifier} --out route.json; then "
            "pass route='route.json' (--route route.json)")


@dataclass
class ModelPair:
    """A drafter, a full verifier and its slim view, sharing one tokenizer."""

    drafter: torch.nn.Module
    verifier: torch.nn.Module
    slim: SlimVerifier
    tokenizer: object
    drafter_name: str
    verifier_name: str
    device: torch.device
    dtype: torch.dtype
    weights: str = "fp32"                # the resolved setting: fp32 | bf16 | int4
    weights_requested: str | None = None  # what the caller asked for ("auto" when chosen for them)
    # the chat template's opening, read once into each kind of cache a run starts from (via_sd.core.opening); one
    # object for the pair and its copies (dataclasses.replace: the app's per-run views with another route)
    openings: Openings | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if self.openings is None:
            self.openings = Openings(self.tokenizer)

    @property
    def route(self) -> Route:
        return self.slim.route

    @property
    def vocab_size(self) -> int:
        """Logits are compared on the ids both models have (padding ids beyond are dropped)."""
        return min(self.drafter.config.vocab_size, self.verifier.config.vocab_size)

    @property
    def eos_ids(self) -> set[int]:
        ids = set()
        for source in (self.tokenizer.eos_token_id, getattr(self.verifier.generation_config, "eos_token_id", None)):
            ids.update(source if isinstance(source, (list, tuple)) else [source] if source is not None else [])
        return ids

    def encode(self, prompt: str, chat: bool = True) -> list[int]:
        """Prompt -> token ids, through the chat template when the tokenizer has one."""
        if chat and getattr(self.tokenizer, "chat_template", None):
            prompt = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
            return self.tokenizer(prompt, add_special_tokens=False).input_ids
        return self.tokenizer(prompt).input_ids

    def describe(self) -> dict:
        return {"drafter": self.drafter_name, "verifier": self.verifier_name, "route": self.route.name,
                "skipped": list(self.route.skip), "skip_fraction": self.route.skip_fraction,
                "weights": self.weights, "weights_requested": self.weights_requested or self.weights,
                "drafter_weights": getattr(self.drafter, "via_sd_weights", self.weights),
                "verifier_weights": getattr(self.verifier, "via_sd_weights", self.weights),
                "kernels": self.kernels()}

    def kernels(self) -> str:
        """The rule that picks each pass's matmul path, and what its numbers depend on (two traces that differ can
        be told apart): int4's fixed kernel rule on CPU, else the dtype's matmuls on this device."""
        from ..weights.linears import kernel_rule

        if self.weights == "int4":
            return kernel_rule(self.verifier)
        where = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" \
            else torch.backends.cpu.get_cpu_capability()
        return f"torch {str(self.dtype).replace('torch.', '')} matmuls (torch {torch.__version__}, {where})"

    @property
    def costs(self):
        """The pair's cost profile at hand (via_sd.cost.model.CostProfile, via_sd.core.profile.profile_at_hand):
        measured on this machine (or corrected from its runs since), else a shipped prior, else measured now (its
        cost: BENCHMARKS.md)."""
        from .profile import profile_at_hand

        return profile_at_hand(self)

    def set_route(self, route) -> None:
        """Switch the slim verifier's route (weights stay shared)."""
        self.slim = SlimVerifier(self.verifier, resolve_route(route, self.verifier.config.num_hidden_layers))


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _report(progress: Progress | None, message: str, fraction: float) -> None:
    if progress is not None:
        progress(message, fraction)


def _load_model(source: str, dtype: torch.dtype, device: torch.device, spread: bool, weights: str = "fp32",
                exact_top1: bool = True):
    """A causal LM from a hub id, a local folder, a .gguf file or a cache folder (`_check_source` passed).
    `exact_top1`: see build.build_model (True for a verifier, False for a drafter)."""
    from transformers import AutoModelForCausalLM

    from ..weights.gguf_pack import Entries, build_model, gguf_config
    from ..weights.paths import MODEL_FILE
    from ..weights.settings import apply_weights

    if Path(source, MODEL_FILE).is_file() and Path(source, "config.json").is_file():  # a cache folder (embedded.py)
        from transformers import GenerationConfig

        from ..weights.built import build_folder, built_model

        options = {"exact_top1": exact_top1}
        model = built_model(source, weights, options, lambda: build_folder(source, weights, options))
        model.generation_config = GenerationConfig.from_pretrained(source)
        return model.to(device).eval()
    if source.endswith(".gguf") and weights == "int4" and Path(source).is_file():  # straight from the blocks
        from ..weights.gguf_file import GgufFile

        gguf = GgufFile(source)
        config = gguf_config(source, gguf)
        return build_model(config, Entries.from_gguf(source, config, gguf), weights, exact_top1=exact_top1).eval()
    kwargs = {"dtype": dtype, "trust_remote_code": False}
    folder = source
    if source.endswith(".gguf"):
        folder, kwargs["gguf_file"] = str(Path(source).parent), Path(source).name
    if spread:
        kwargs["device_map"] = "auto"  # accelerate places layers over every visible GPU
    model = AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    if not spread:
        model.to(device)
    return apply_weights(model.eval(), weights)


def _check_source(source: str) -> None:
    """A missing .gguf file or a folder that holds no saved model, named before anything is read."""
    if source.endswith(".gguf") and not Path(source).is_file():
        raise ModelLoadError(f"GGUF file {source} does not exist")
    if Path(source).is_dir() and not Path(source, "config.json").is_file():
        raise ModelLoadError(f"{source} is a folder without config.json: point at a saved model folder")


def _shared_tokenizer(drafter: str, verifier: str, sources: tuple[str, str], progress: Progress | None):
    """The verifier's tokenizer, once the drafter's is known to be the same (read before any weights)."""
    _report(progress, "reading the tokenizers", 0.02)
    if same_tokenizer_files(*sources):  # one tokenizer, read once (the embedded pair's: 1.2-2.5 s a read)
        _check_source(sources[0])
        _check_source(sources[1])
        try:
            return load_tokenizer(sources[1])
        except Exception as err:
            raise ModelLoadError(f"could not read the tokenizer of {verifier!r}: {type(err).__name__}: {err}") from err
    tokenizers = []
    for name, source in zip((drafter, verifier), sources):
        _check_source(source)
        try:
            tokenizers.append(load_tokenizer(source))
        except Exception as err:
            raise ModelLoadError(f"could not read the tokenizer of {name!r}: {type(err).__name__}: {err}") from err
    check_shared_tokenizer(*tokenizers, drafter, verifier)
    return tokenizers[1]


def _resolve_source(source: str, progress: Progress | None) -> str:
    if source.startswith("embedded:"):
        from ..weights.embedded import embedded_model_dirs

        drafter_dir, verifier_dir = embedded_model_dirs(progress=progress)
        return str(drafter_dir if source == "embedded:drafter" else verifier_dir)
    return source


def load_pair(preset: str | None = None, *, drafter: str | None = None, verifier: str | None = None,
              route=None, device=None, dtype=None, weights: str = "auto",
              progress: Progress | None = None) -> ModelPair:
    """Load a preset ("embedded", "gpu", "cpu", "tiny", "random") or a free drafter/verifier choice.

    `route`: a shipped route name, a JSON path, a list like ["attn.7", "mlp.12"], or "none". A free pair given none
    runs `unrouted` and warns (NoRouteWarning: NO_ROUTE); `via_sd.route_search.pick_route` then finds a route searched
    for this verifier earlier, `route_for` searches one. The two tokenizers are compared before any weights are read
    (vocabulary, special tokens, sample text: `shared_vocab`); a mismatch is a ValueError naming what differs.
    `weights`: "auto" (int4 on CPU, bf16 on CUDA; fp32 for the tiny "random" pair), "fp32", "bf16",
    or "int4" (see weights/settings.py). `device`: "cpu", "cuda" (an error when torch sees no CUDA device) or a torch.device.
    """
    from ..weights.settings import apply_weights, resolve_weights

    if preset is not None:
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}: choose one of {', '.join(PRESETS)}")
        spec = PRESETS[preset]
        drafter, verifier = drafter or spec["drafter"], verifier or spec["verifier"]
        route = spec["route"] if route is None else route
    if not drafter or not verifier:
        raise ValueError("name a preset, or both a drafter and a verifier (hub id, folder or .gguf file)")
    device = torch.device(device) if device is not None else default_device()
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={str(device)!r} was asked for, but this torch build sees no CUDA device "
                         f"(torch {torch.__version__}): leave device unset or use 'cpu'")
    requested = weights or "auto"
    if drafter.startswith("random:"):  # mechanics only: auto keeps the tiny models in fp32
        weights = resolve_weights("fp32" if requested == "auto" else requested, device)
        pair = tiny_random_pair(route=route)
        if weights != "fp32":
            apply_weights(pair.drafter, weights)
            apply_weights(pair.verifier, weights)
            pair.dtype = torch.bfloat16 if weights == "bf16" else torch.float32
        if device.type != "cpu":
            pair.drafter.to(device)
            pair.verifier.to(device)
            pair.device = device
        _batch_invariant(weights, pair.verifier, pair.drafter)
        pair.weights, pair.weights_requested = weights, requested
        return pair
    weights = resolve_weights(requested, device)
    dtype = dtype or (torch.bfloat16 if weights == "bf16" else torch.float32)

    sources = (_resolve_source(drafter, progress), _resolve_source(verifier, progress))
    v_tok = _shared_tokenizer(drafter, verifier, sources, progress)  # a mismatched pair loads no weights
    models = []
    try:
        _build_apart(sources, weights, progress)
        _report(progress, f"loading drafter {drafter}", 0.05)
        d_model = _load_model(sources[0], dtype, device, spread=False, weights=weights, exact_top1=False)
        models.append(d_model)
        _report(progress, f"loading verifier {verifier}", 0.5)
        spread = device.type == "cuda" and torch.cuda.device_count() > 1
        v_model = _load_model(sources[1], dtype, device, spread=spread, weights=weights)
        models.append(v_model)
        _batch_invariant(weights, v_model, d_model)
        n = v_model.config.num_hidden_layers
        slim = SlimVerifier(v_model, unrouted(n) if route is None and preset is None else resolve_route(route, n))
    except Exception as err:
        models.clear()  # nothing half-loaded stays in memory
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if isinstance(err, (ValueError, ModelLoadError)):
            raise
        raise ModelLoadError(f"could not load the pair {drafter!r} -> {verifier!r}: {err}") from err
    names = {"embedded:drafter": "Qwen2.5-Coder-0.5B-Instruct (embedded)",
             "embedded:verifier": "Qwen2.5-Coder-1.5B-Instruct (embedded)"}
    pair = ModelPair(d_model, v_model, slim, v_tok, names.get(drafter, drafter), names.get(verifier, verifier),
                     device, dtype, weights, requested)
    if preset is not None and route is None:  # no shipped route: a rule's at once (faces then call pick_route)
        pair.set_route(provisional_route(v_model.config.num_hidden_layers))
    if pair.route.meta.get("missing"):  # the faces look for a cached searched route (pick_route) and say so too
        warnings.warn(no_route_message(drafter, verifier), NoRouteWarning, stacklevel=2)
    _report(progress, "models ready", 1.0)
    return pair


def _build_apart(sources: tuple[str, str], weights: str, progress: Progress | None) -> None:
    """A first start of a pair of cache folders: both int4 models built and kept by child processes at once
    (built.build_apart), then opened as a restart opens them."""
    from ..weights.built import build_apart, to_build

    jobs = to_build([(sources[0], weights, {"exact_top1": False}), (sources[1], weights, {"exact_top1": True})])
    if jobs:
        _report(progress, "building the int4 models (first start only)", 0.05)
        build_apart(jobs)


def _batch_invariant(weights: str, *models) -> None:
    """int4: the linears compute every row on its own; row attention makes the rest do so, so a verification pass
    gives bit for bit the logits of one-token steps (greedy SD == greedy AR), and the drafter's transformers forward
    the lean forward's attention (both the kernel's fixed order)."""
    if weights == "int4":
        from ..weights.row_attention import use_row_attention

        for model in models:
            use_row_attention(model)


def char_tokenizer():
    """A character-level tokenizer (printable ASCII + newline) for tiny test models."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<eos>": 1}
    for ch in ["\n", *map(chr, range(32, 127))]:
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")


def tiny_random_pair(seed: int = 0, drafter_layers: int = 2, verifier_layers: int = 4, hidden: int = 64,
                     route=None, eos: bool = False) -> ModelPair:
    """A random-weight Llama drafter/verifier pair with a character tokenizer; builds in well under a second.

    `eos=False` keeps the end-of-sequence logit at -inf so runs always reach max_new_tokens.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = char_tokenizer()

    def build(layers: int, offset: int):
        torch.manual_seed(seed + offset)
        cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                          num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=2048, eos_token_id=tokenizer.eos_token_id,
                          pad_token_id=tokenizer.eos_token_id, bos_token_id=None, tie_word_embeddings=False)
        model = LlamaForCausalLM(cfg).eval()
        with torch.no_grad():  # std 0.02 init gives near-uniform outputs; sharper ones exercise every tier
            model.lm_head.weight.mul_(40.0)
        model.generation_config.eos_token_id = tokenizer.eos_token_id if eos else None
        if not eos:
            _suppress_token(model, tokenizer.eos_token_id)
        return model

    verifier = build(verifier_layers, 1)
    with torch.no_grad():  # later layers refine rather than overwrite, as in trained models
        for layer in verifier.model.layers[drafter_layers:]:
            layer.self_attn.o_proj.weight.mul_(0.3)
            layer.mlp.down_proj.weight.mul_(0.3)
    drafter = build(drafter_layers, 2)
    # The drafter is the verifier's embedding, first layers and head, so the two often agree, as a
    # real drafter and verifier of one family do (independent random models would never agree).
    drafter.load_state_dict(verifier.state_dict(), strict=False)
    slim = SlimVerifier(verifier, resolve_route(route, verifier_layers))
    return ModelPair(drafter, verifier, slim, tokenizer, "random-llama-2L", "random-llama-4L",
                     torch.device("cpu"), torch.float32)


def _suppress_token(model, token_id: int) -> None:
    """Adds -inf to one output logit, so that token is never chosen."""
    bias = torch.zeros(model.config.vocab_size)
    bias[token_id] = float("-inf")
    model.lm_head.register_buffer("suppress", bias, persistent=False)
    model.lm_head.register_forward_hook(lambda mod, _inp, out: out + mod.suppress)
