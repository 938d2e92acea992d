"""Settings from the page, checked and turned into engine objects; a bad one raises UserError, whose
message the page shows as it is (never a stack trace), and a client reads as the refusal (`refuse`)."""

from __future__ import annotations

import bisect
import re

import gradio as gr

from via_sd import DecodeConfig, Thresholds
from via_sd.core.bounds import BOUNDS, MAX_FIXED_GAMMA, MAX_NEW_TOKENS, SEED_MAX, Bound  # noqa: F401 (SEED_MAX)
from via_sd.core.config import DRAFTERS, MIN_TEMPERATURE
from via_sd.core.trace_check import SIGNALS

MAX_PROMPT_CHARS = 6000
MAX_NAME_CHARS = 200  # a route's or preset's name
MAX_ROUTE_SKIPS = 1024  # sub-layers a route given as a list may skip
GAMMA = Bound(True, 0, MAX_FIXED_GAMMA)  # the page's gamma: 0 = "auto", else the engine's fixed length
# the knobs `via_sd generate` sets that the page has no control for: their bounds here, their defaults DecodeConfig's
TOP_P = Bound(False, 0.0, 1.0)  # and above 0
MAX_UNVERIFIED = Bound(True, 0, MAX_NEW_TOKENS)  # 0: no bound; a bound above max_new_tokens never binds
EXIT_LAYER = Bound(True, 0, 4096)  # 0: half the verifier's layers
KNOBS = {"top_p": DecodeConfig.top_p, "draft_stop": DecodeConfig.draft_stop,
         "max_unverified": DecodeConfig.max_unverified, "chat": DecodeConfig.chat,
         "lookup_ngram": DecodeConfig.lookup_ngram, "lookup_tokens": DecodeConfig.lookup_tokens,
         "exit_layer": DecodeConfig.exit_layer}
_SURROGATE = re.compile("[\ud800-\udfff]")
MAX_GRID = 24  # settings in one measured sweep
MAX_GRID_CHARS = 400  # characters in one grid field: checked before the text is parsed


class UserError(ValueError):
    """Bad input: shown in the page as a plain message, never as a stack trace."""


def refuse(message) -> gr.Error:
    """The error a client reads (and the page shows as an error toast): the message, no stack trace in the log or
    the reply."""
    return gr.Error(str(message), print_exception=False)


def check_prompt(prompt) -> str:
    if prompt is not None and not isinstance(prompt, str):
        raise UserError(f"prompt must be text (a string of 1 to {MAX_PROMPT_CHARS:,} characters), got "
                        f"{type(prompt).__name__}.")
    if not isinstance(prompt, str) or not prompt.strip():
        raise UserError("The prompt is empty: type a prompt or pick an example.")
    if (lone := _SURROGATE.search(prompt)) is not None:
        raise UserError(f"prompt holds a lone surrogate (no character: an escape such as \\ud800) at character "
                        f"{lone.start():,}; send text as UTF-8.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise UserError(f"The prompt has {len(prompt):,} characters; the limit here is {MAX_PROMPT_CHARS:,}. "
                        "Shorten it.")
    return prompt


def shown(value) -> str:
    """A refused value as the message shows it: short, its type plain where it is no number or text."""
    if isinstance(value, (dict, list, tuple)):
        return f"a {type(value).__name__}"
    return repr(value)[:30]


def number(name: str, value, bound: Bound | None = None):
    """A setting as a number (an int when `bound` is whole), within `bound` (`config.BOUNDS[name]` by default), or
    UserError naming it, its problem and the allowed range: the page's message for the API too."""
    bound = bound or BOUNDS[name]
    if not bound.allows(value):
        raise UserError(f"Settings: {name} must be {bound.allowed}, got {shown(value)}.")
    return int(value) if bound.whole else float(value)


def choice(name: str, value, allowed) -> str:
    """A setting that is one of `allowed` (strings), or UserError naming it and the choices."""
    if not isinstance(value, str) or value not in allowed:
        raise UserError(f"Settings: {name} must be one of {', '.join(map(repr, allowed))}, got {shown(value)}.")
    return value


def name(field: str, value) -> str:
    """A name (a route, a preset) checked by what it names later; here: a non-empty string of bounded length."""
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_NAME_CHARS:
        raise UserError(f"Settings: {field} must be a name of 1 to {MAX_NAME_CHARS} characters, got {shown(value)}.")
    return value


def route(value):
    """The slim verifier's route: a name ("default", "none", a shipped route's) or, from Python, a list of the
    sub-layers it skips ("attn.1", "mlp.2"); whether it fits the verifier is checked when the pair is viewed."""
    if isinstance(value, list) and len(value) <= MAX_ROUTE_SKIPS and all(
            isinstance(v, str) and 0 < len(v) <= MAX_NAME_CHARS for v in value):
        return value
    if isinstance(value, list):
        raise UserError(f"Settings: route must be a name or a list of at most {MAX_ROUTE_SKIPS} sub-layer names "
                        f"(\"attn.1\", \"mlp.2\"), got {shown(value)}.")
    return name("route", value)


def flag(field: str, value) -> bool:
    """true or false, nothing that merely looks like one ("yes", 2)."""
    if not isinstance(value, bool):
        raise UserError(f"Settings: {field} must be true or false, got {shown(value)}.")
    return value


def make_thresholds(accept, escalate, signal="slim") -> Thresholds:
    accept, escalate = number("accept", accept), number("escalate", escalate)
    signal = choice("signal", signal, SIGNALS)
    try:
        return Thresholds(accept=accept, escalate=escalate, signal=signal)
    except (TypeError, ValueError) as err:
        raise UserError(f"Thresholds: {err}") from err


def check_gamma(value):
    """The page's 0 or the CLI's "auto" (the engine picks each round's length), else a fixed length."""
    if value == "auto":
        return "auto"
    if not GAMMA.allows(value):
        raise UserError(f"Settings: gamma must be {GAMMA.allowed} (0 or \"auto\": picked each round), "
                        f"got {shown(value)}.")
    return "auto" if value == 0 else int(value)


def check_knobs(top_p=KNOBS["top_p"], draft_stop=KNOBS["draft_stop"], max_unverified=KNOBS["max_unverified"],
                chat=KNOBS["chat"], lookup_ngram=KNOBS["lookup_ngram"], lookup_tokens=KNOBS["lookup_tokens"],
                exit_layer=KNOBS["exit_layer"]) -> dict:
    """The rest of what `via_sd generate` sets, checked by name (DecodeConfig's defaults): DecodeConfig's keywords."""
    top_p = number("top_p", top_p, TOP_P)
    if top_p <= 0:
        raise UserError(f"Settings: top_p must be a number above 0 and at most 1, got {shown(top_p)}.")
    return {"top_p": top_p, "draft_stop": number("draft_stop", draft_stop),
            "max_unverified": number("max_unverified", max_unverified, MAX_UNVERIFIED), "chat": flag("chat", chat),
            "lookup_ngram": number("lookup_ngram", lookup_ngram),
            "lookup_tokens": number("lookup_tokens", lookup_tokens),
            "exit_layer": number("exit_layer", exit_layer, EXIT_LAYER)}


def make_config(gamma, accept, escalate, signal, temperature, max_new_tokens, seed, drafter="model",
                **knobs) -> DecodeConfig:
    """A run's DecodeConfig from the page's settings and, by name, the other knobs of `via_sd generate` (`KNOBS`)."""
    thresholds = make_thresholds(accept, escalate, signal)
    gamma, max_new_tokens = check_gamma(gamma), number("max_new_tokens", max_new_tokens)
    temperature, seed = number("temperature", temperature), number("seed", seed)
    drafter = choice("drafter", drafter, DRAFTERS)
    unknown = sorted(set(knobs) - set(KNOBS))
    if unknown:
        raise UserError(f"Settings: no setting named {', '.join(unknown)}; the others are {', '.join(KNOBS)}.")
    knobs = check_knobs(**knobs)
    try:
        return DecodeConfig(gamma=gamma, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                            thresholds=thresholds, drafter=drafter, **knobs)
    except (TypeError, ValueError) as err:
        raise UserError(f"Settings: {err}") from err


def parse_grid(text, name: str) -> list[float]:
    """"0.3, 0.6" -> [0.3, 0.6]: sorted, distinct, each in [0, 1]."""
    hint = f"{name}: write numbers between 0 and 1 separated by commas, e.g. 0.3, 0.6, 0.9"
    if not isinstance(text, (str, int, float)) or isinstance(text, bool) or len(str(text)) > MAX_GRID_CHARS:
        raise UserError(f"{name}: write at most {MAX_GRID_CHARS} characters of numbers between 0 and 1 separated "
                        "by commas, e.g. 0.3, 0.6, 0.9")
    try:
        values = sorted({round(float(v), 4) for v in str(text).replace(";", ",").split(",") if v.strip()})
    except ValueError:
        raise UserError(hint) from None
    if not values or any(not 0.0 <= v <= 1.0 for v in values):
        raise UserError(hint)
    return values


def grid_size(accept_values: list[float], escalate_values: list[float]) -> int:
    """How many (accept, escalate) settings have escalate <= accept: counted from the sorted values, so
    a huge grid is refused before it is built."""
    return sum(bisect.bisect_right(escalate_values, a + 1e-9) for a in accept_values)


def check_round(k, rounds: int | None) -> int:
    """The learn round `k` (1-based) as an int, or UserError naming it and the rounds this trace has (None: there is
    no trace yet, and any whole number from 1 is a round)."""
    if not Bound(True, 1, float("inf")).allows(k):
        of = "from 1" if rounds is None else f"from 1 to {rounds} (the rounds of this trace)"
        raise UserError(f"Settings: round must be a whole number {of}, got {shown(k)}.")
    if rounds is not None and k > rounds:
        raise UserError(f"Round {int(k)} does not exist: this trace has {rounds} round(s); pick a whole number from 1 "
                        f"to {rounds}.")
    return int(k)


def input_schemas() -> dict:
    """What the checks above allow of each setting a client sends, as JSON Schema (docs/api.md, `api.compare_schema`),
    from the same bounds: tests/test_api_schema.py checks that it refuses exactly what they refuse."""
    text = {"type": "string", "pattern": "\\S"}  # not blank
    name = {**text, "maxLength": MAX_NAME_CHARS}
    return {
        "prompt": {**text, "maxLength": MAX_PROMPT_CHARS, "description": "no lone surrogates"},
        "preset": name,
        "gamma": {"anyOf": [GAMMA.json_schema(), {"const": "auto"}],
                  "description": "0 or \"auto\": the engine picks each round's from the cost profile"},
        "accept": BOUNDS["accept"].json_schema(),
        "escalate": {**BOUNDS["escalate"].json_schema(), "description": "at most accept"},
        "signal": {"enum": list(SIGNALS)},
        "temperature": {**BOUNDS["temperature"].json_schema(),
                        "description": f"0 (greedy) or at least {MIN_TEMPERATURE}"},
        "max_new_tokens": BOUNDS["max_new_tokens"].json_schema(),
        "seed": BOUNDS["seed"].json_schema(),
        "route": {"anyOf": [name, {"type": "array", "maxItems": MAX_ROUTE_SKIPS,
                                   "items": {"type": "string", "minLength": 1, "maxLength": MAX_NAME_CHARS}}]},
        "with_ar": {"type": "boolean"},
        "drafter": {"enum": list(DRAFTERS)},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "draft_stop": {**BOUNDS["draft_stop"].json_schema(), "description": "0: never"},
        "max_unverified": {**MAX_UNVERIFIED.json_schema(), "description": "0: no bound"},
        "chat": {"type": "boolean"},
        "lookup_ngram": BOUNDS["lookup_ngram"].json_schema(),
        "lookup_tokens": BOUNDS["lookup_tokens"].json_schema(),
        "exit_layer": {**EXIT_LAYER.json_schema(), "description": "0: half the verifier's layers"},
    }
