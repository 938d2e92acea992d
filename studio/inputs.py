"""Settings from the page, checked and turned into engine objects; a bad one raises UserError, whose
message the page shows as it is (never a stack trace)."""

from __future__ import annotations

import bisect

from via_sd import DecodeConfig, Thresholds

MAX_PROMPT_CHARS = 6000
SEED_MAX = 2**32 - 1
MAX_GRID = 24  # settings in one measured sweep
MAX_GRID_CHARS = 400  # characters in one grid field: checked before the text is parsed


class UserError(ValueError):
    """Bad input: shown in the page as a plain message, never as a stack trace."""


def check_prompt(prompt) -> str:
    if not isinstance(prompt, str) or not prompt.strip():
        raise UserError("The prompt is empty: type a prompt or pick an example.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise UserError(f"The prompt has {len(prompt):,} characters; the limit here is {MAX_PROMPT_CHARS:,}. "
                        "Shorten it.")
    return prompt


def number(name: str, value, whole: bool = False, lo=None, hi=None):
    """A setting as a number (an int when `whole`), or UserError naming it: the page's message for the API too."""
    kind = "a whole number" if whole else "a number"
    span = f" from {lo:,} to {hi:,}" if lo is not None else ""
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
          and abs(value) != float("inf"))
    if not ok or (whole and not float(value).is_integer()) or (lo is not None and not lo <= value <= hi):
        raise UserError(f"Settings: {name} must be {kind}{span}, got {str(value)[:30]}.")
    return int(value) if whole else float(value)


def make_thresholds(accept, escalate, signal="slim") -> Thresholds:
    accept, escalate = number("accept", accept, lo=0, hi=1), number("escalate", escalate, lo=0, hi=1)
    try:
        return Thresholds(accept=accept, escalate=escalate, signal=signal or "slim")
    except (TypeError, ValueError) as err:
        raise UserError(f"Thresholds: {err}") from err


def make_config(gamma, accept, escalate, signal, temperature, max_new_tokens, seed, drafter="model") -> DecodeConfig:
    thresholds = make_thresholds(accept, escalate, signal)
    gamma, max_new_tokens = number("gamma", gamma, whole=True), number("max_new_tokens", max_new_tokens, whole=True)
    temperature, seed = number("temperature", temperature), number("seed", seed, whole=True, lo=0, hi=SEED_MAX)
    try:  # gamma 0 on the page: the engine picks each round's length from the cost profile (gamma="auto")
        return DecodeConfig(gamma="auto" if gamma == 0 else gamma, max_new_tokens=max_new_tokens,
                            temperature=temperature, seed=seed, thresholds=thresholds, drafter=drafter or "model")
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


def check_round(k, rounds: int) -> int:
    """The learn round `k` (1-based) as an int, or UserError saying which rounds exist."""
    valid = isinstance(k, (int, float)) and not isinstance(k, bool) and k == k and float(k).is_integer()
    if not valid or not 1 <= k <= rounds:
        raise UserError(f"Round {str(k)[:20]} does not exist: this trace has {rounds} round(s); pick a whole "
                        f"number from 1 to {rounds}.")
    return int(k)
