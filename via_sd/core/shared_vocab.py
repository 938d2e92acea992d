"""One tokenizer for the drafter and the verifier: the check made before either model's weights are read.

Speculative decoding hands the drafter's token ids to the verifier, so both must map text to the same ids: the same
vocabulary (token -> id), the same special tokens (the chat template's markers, end of sequence, padding), and
the same ids for sample text (a normalizer or a BOS token of one model only shows there). `tokenizer_difference`
names the first of these that differs, in words a person can act on; `load_tokenizer` reads a model's tokenizer
alone, so a mismatched pair is refused in seconds with nothing loaded.
"""

from __future__ import annotations

import time
from pathlib import Path


# Sentences whose token ids a drafter and verifier must agree on.
PROBES = ["Hello, world! 123", "def f(x):\n    return x * 2", "Résumé: naïve café, 東京."]
SHOWN = 3  # examples named per difference


def _auto_tokenizer():
    """transformers' AutoTokenizer. Its first import can fail while another thread is importing transformers' modules
    (the app's load thread while a visitor's own pair is checked): Python hands one of two threads that import each
    other's modules a partly made module, and a full suite saw "cannot import name 'AutoTokenizer'" refuse the own
    pair twice in five runs. That failure passes once the other import is done, so it is tried again (3 times)."""
    for attempt in range(3):
        try:
            from transformers import AutoTokenizer
            return AutoTokenizer
        except ImportError:
            if attempt == 2:
                raise
            time.sleep(0.5)


def load_tokenizer(source: str):
    """The tokenizer of a hub id, a saved model folder or a .gguf file (never remote code)."""
    AutoTokenizer = _auto_tokenizer()
    if source.endswith(".gguf"):
        from ..weights.gguf_pack import gguf_tokenizer

        return gguf_tokenizer(source)
    return AutoTokenizer.from_pretrained(source, trust_remote_code=False)


def same_tokenizer_files(a: str, b: str) -> bool:
    """Two model folders whose tokenizer files (tokenizer*, vocab, merges, special and added tokens) are the same set,
    byte for byte: one tokenizer, so it is read once and needs no comparison. A chat template file is not compared:
    it turns a conversation into text, and a pair renders its prompts with the verifier's alone (the embedded pair's
    two differ in their tool-calling branch; reading and comparing both tokenizers cost 2.5-3.7 s of a start)."""
    def files(folder: Path) -> dict[str, Path]:
        return {p.name: p for p in folder.iterdir() if p.is_file() and (p.name.startswith("tokenizer") or p.name in (
            "vocab.json", "merges.txt", "special_tokens_map.json", "added_tokens.json"))}

    a, b = Path(a), Path(b)
    if not (a.is_dir() and b.is_dir()):
        return False
    fa, fb = files(a), files(b)
    return bool(fa) and fa.keys() == fb.keys() and all(fa[n].read_bytes() == fb[n].read_bytes() for n in fa)


def special_tokens(tokenizer) -> dict[str, int]:
    """Every special token of a tokenizer with its id: the named ones (eos, pad, ...) and the added special ones."""
    found = {tok: tokenizer.convert_tokens_to_ids(tok) for tok in tokenizer.all_special_tokens}
    for token_id, added in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(added, "special", False):
            found[str(added)] = int(token_id)
    return found


def _examples(tokens, mapping: dict | None = None) -> str:
    shown = sorted(tokens, key=str)[:SHOWN]
    words = [f"{t!r} = {mapping[t]}" if mapping else repr(t) for t in shown]
    more = f" and {len(tokens) - SHOWN} more" if len(tokens) > SHOWN else ""
    return ", ".join(words) + more


def _mapping_difference(what: str, drafter: dict, verifier: dict) -> str | None:
    """"vocabularies differ: ..." naming tokens only one side has and tokens whose ids differ; None if equal."""
    if drafter == verifier:
        return None
    only_d, only_v = set(drafter) - set(verifier), set(verifier) - set(drafter)
    moved = {t for t in set(drafter) & set(verifier) if drafter[t] != verifier[t]}
    parts = []
    if only_d:
        parts.append(f"{len(only_d)} only in the drafter's ({_examples(only_d)})")
    if only_v:
        parts.append(f"{len(only_v)} only in the verifier's ({_examples(only_v)})")
    if moved:
        parts.append(f"{len(moved)} with other ids (drafter {_examples(moved, drafter)}; "
                     f"verifier {_examples(moved, verifier)})")
    return f"{what} differ (drafter {len(drafter)}, verifier {len(verifier)}): " + "; ".join(parts)


def tokenizer_difference(drafter_tok, verifier_tok) -> str | None:
    """What differs between two tokenizers, in words; None when the drafter and verifier share one."""
    found = _mapping_difference("vocabularies", drafter_tok.get_vocab(), verifier_tok.get_vocab())
    found = found or _mapping_difference("special tokens", special_tokens(drafter_tok), special_tokens(verifier_tok))
    if found:
        return found
    for text in PROBES:
        a, b = drafter_tok(text).input_ids, verifier_tok(text).input_ids
        if a != b:
            return f"they tokenize {text!r} differently (drafter {a[:8]}, verifier {b[:8]})"
    return None


def check_shared_tokenizer(drafter_tok, verifier_tok, drafter_name: str, verifier_name: str) -> None:
    """A ValueError naming what differs when the two tokenizers are not one."""
    difference = tokenizer_difference(drafter_tok, verifier_tok)
    if difference:
        raise ValueError(f"drafter {drafter_name!r} and verifier {verifier_name!r} do not share a tokenizer: "
                         f"{difference}. Speculative decoding hands the drafter's token ids to the verifier: pick two "
                         "models of one family with one tokenizer")
