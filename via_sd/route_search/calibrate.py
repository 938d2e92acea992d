"""Calibration text: the token sequences on which a slim verifier is compared with its full verifier."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..core.routing import ROUTES_DIR
from .cache import model_identity, route_cache_dir, same_model, slug
from .progress import report, stopped

CALIBRATION_DIR = ROUTES_DIR / "calibration"
PROMPTS_DIR = ROUTES_DIR.parent / "prompts"
# (task file, line): prompts outside the benchmark's mixed.jsonl; calibration and held-out never share one.
CALIBRATION_PROMPTS = [("code", 1), ("math", 2), ("qa", 2), ("translation", 3)]
HELD_OUT_PROMPTS = [("code", 2), ("math", 1), ("qa", 1), ("translation", 1), ("summarization", 1)]
CALIBRATION_TOKENS, HELD_OUT_TOKENS = 48, 64


@dataclass
class Calibration:
    """Token sequences compared teacher-forced: the tokens from `starts[i]` on are scored, the rest is context."""

    sequences: list[list[int]]
    starts: list[int]
    source: str = ""
    prompts: list[str] = field(default_factory=list)

    def __post_init__(self):
        if not self.sequences or len(self.sequences) != len(self.starts):
            raise ValueError("calibration needs at least one sequence and one start per sequence")
        for seq, start in zip(self.sequences, self.starts):
            if not 1 <= start < len(seq):
                raise ValueError(f"a calibration sequence of {len(seq)} tokens cannot be scored from token {start}")

    @property
    def scored_tokens(self) -> int:
        return sum(len(seq) - start for seq, start in zip(self.sequences, self.starts))

    def to_dict(self) -> dict:
        return {"source": self.source, "prompts": self.prompts, "starts": self.starts, "sequences": self.sequences}

    @classmethod
    def from_dict(cls, data: dict) -> "Calibration":
        return cls([list(map(int, s)) for s in data["sequences"]], [int(s) for s in data["starts"]],
                   data.get("source", ""), list(data.get("prompts", [])))


def task_prompts(picks) -> list[str]:
    """Prompts from assets/prompts/<task>.jsonl at the given line numbers."""
    prompts = []
    for task, line in picks:
        rows = (PROMPTS_DIR / f"{task}.jsonl").read_text(encoding="utf-8").splitlines()
        prompts.append(json.loads(rows[line])["prompt"])
    return prompts


def generate_calibration(pair, prompts: list[str], max_new_tokens: int, source: str = "", progress=None,
                         stop=None) -> Calibration:
    """The full verifier's own greedy continuations of `prompts` (through the chat template when there is one).
    `stop` (anything with `is_set()`), checked before each prompt, ends it with KeyboardInterrupt."""
    from ..core.decoding import DecodeConfig, generate

    config = DecodeConfig(max_new_tokens=max_new_tokens, temperature=0.0)
    sequences, starts = [], []
    for i, prompt in enumerate(prompts):
        if stopped(stop):
            raise KeyboardInterrupt
        report(progress, f"calibration: the full verifier continues prompt {i + 1}/{len(prompts)}", i / len(prompts))
        prompt_ids = pair.encode(prompt, chat=config.chat)
        trace = generate(pair, prompt, "ar", config)
        sequences.append(prompt_ids + trace.token_ids)
        starts.append(len(prompt_ids))
    return Calibration(sequences, starts, source, list(prompts))


def text_calibration(tokenizer, text: str, source: str, chunk: int = 256) -> Calibration:
    """Plain text as calibration: cut into chunks, every token after a chunk's first is scored."""
    ids = tokenizer(text).input_ids
    chunks = [ids[i:i + chunk] for i in range(0, len(ids), chunk)]
    chunks = [c for c in chunks if len(c) >= 2]
    if not chunks:
        raise ValueError(f"{source} holds too little text to calibrate on")
    return Calibration(chunks, [1] * len(chunks), source)


def calibration_from_file(pair, path: str, progress=None) -> Calibration:
    """A user-given file: prompts (.jsonl, continued by the full verifier), a calibration .json, or plain text."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"calibration file {path} does not exist")
    if file.suffix == ".jsonl":
        prompts = [json.loads(line)["prompt"] for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
        return generate_calibration(pair, prompts, CALIBRATION_TOKENS, f"{file.name}: full-verifier continuations",
                                    progress)
    if file.suffix == ".json":
        data = json.loads(file.read_text(encoding="utf-8"))
        return Calibration.from_dict(data.get("calibration", data))
    return text_calibration(pair.tokenizer, file.read_text(encoding="utf-8"), f"{file.name}: plain text")


def default_texts(pair, progress=None, save_to: Path | None = None, stop=None) -> tuple[Calibration, Calibration]:
    """(calibration, held-out) texts for this verifier: a shipped or cached file, else generated now and cached
    (`stop`: see generate_calibration)."""
    identity = model_identity(pair)
    for folder in (CALIBRATION_DIR, route_cache_dir() / "calibration"):
        for path in sorted(folder.glob("*.json")):
            data = json.loads(path.read_text(encoding="utf-8"))
            if same_model(data.get("model"), identity):
                return Calibration.from_dict(data["calibration"]), Calibration.from_dict(data["held_out"])
    calibration = generate_calibration(pair, task_prompts(CALIBRATION_PROMPTS), CALIBRATION_TOKENS,
                                       "assets/prompts: full-verifier continuations", progress, stop)
    held_out = generate_calibration(pair, task_prompts(HELD_OUT_PROMPTS), HELD_OUT_TOKENS,
                                    "assets/prompts (other prompts): full-verifier continuations", progress, stop)
    path = save_to or route_cache_dir() / "calibration" / f"{slug(pair.verifier_name)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"model": identity, "calibration": calibration.to_dict(),
                                "held_out": held_out.to_dict()}), encoding="utf-8")
    return calibration, held_out
