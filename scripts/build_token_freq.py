"""Build the drafter head's token list (assets/token_freq/qwen2.json): Qwen2 token ids ranked by frequency.

    .venv/bin/python scripts/build_token_freq.py                       # writes the asset (about 20 s)
    flock /tmp/via-sd-heavy.lock .venv/bin/python scripts/build_token_freq.py --greedy /tmp/viasd-greedy.json
    .venv/bin/python scripts/build_token_freq.py --coverage /tmp/viasd-greedy.json

Two rankings, both reproducible offline, are built and compared:
- `merges` (the shipped one): the tokenizer's own BPE merge order. Byte-level BPE learns its merges
  greedily by pair frequency on the model's training corpus, so the order a token was made in ranks it
  by frequency in text far larger, and closer to chat replies, than anything on this machine (for
  Qwen2 the merge order is the id order; the script reads it from tokenizer.json's merges).
- `counts`: token counts over text every install has offline (never the prompts the coverage is
  measured on): the Python standard library's sources, the docs and metadata in site-packages (*.md,
  *.rst, METADATA), and the translated messages of the system's gettext catalogues
  (/usr/share/locale/{fr,de,es,it,pt,zh_CN,ja,ru}/*.mo); each group up to --bytes characters, its
  counts normalised to frequencies and averaged with equal weight, ties by id.
Measured with --coverage on the verifier's greedy replies to 10 shipped prompts (2 per task, 64 tokens,
574 tokens): in the top 32,768 `merges` holds 0.909 of them, `counts` 0.843 (everyday English words
such as " sky", " air", " food" are missing from local text); so `merges` ships. At the shipped N =
49,152 it holds 0.951, and 0.960 with the prompt's own tokens, which the drafter's head also scores
(heads.FrequentHead.see: a reply echoes words of its prompt). The chat template's
tokens and every special token (<|im_end|>, <|endoftext|>, ...) are listed apart (`special_ids`) and
always kept. The asset holds the top --keep ids, the command and the sources.

--greedy runs the embedded verifier greedily (AR, chat template) on the shipped prompt sets and saves
its tokens; --coverage prints, for several N, the share of those tokens inside the top N: the
acceptance proxy for the frequency-ranked head (a verifier token outside the N can never be drafted,
so per-token acceptance can fall by at most that share).
"""

from __future__ import annotations

import argparse
import gettext
import json
import os
import sys
import sysconfig
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
OUT = ROOT / "assets" / "token_freq" / "qwen2.json"
LANGS = ("fr", "de", "es", "it", "pt", "zh_CN", "ja", "ru")
PROMPT_SETS = ("code", "math", "qa", "summarization", "translation")


def _read(paths, budget: int) -> list[str]:
    texts, used = [], 0
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        texts.append(text[: budget - used])
        used += len(texts[-1])
        if used >= budget:
            break
    return texts


def code_texts(budget: int) -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts and "test" not in p.parts
                   and "tests" not in p.parts)
    return _read(files, budget)


def prose_texts(budget: int) -> list[str]:
    site = Path(sysconfig.get_paths()["purelib"])
    files = sorted(p for pattern in ("*.md", "*.rst", "METADATA") for p in site.rglob(pattern))
    return _read(files, budget)


def language_texts(budget: int) -> list[str]:
    texts = []
    for lang in LANGS:  # an equal share of the budget per language
        messages = []
        for mo in sorted(Path("/usr/share/locale", lang, "LC_MESSAGES").glob("*.mo")):
            try:
                with open(mo, "rb") as f:
                    catalog = gettext.GNUTranslations(f)._catalog
            except (OSError, ValueError, UnicodeDecodeError, KeyError):
                continue
            messages += [v for k, v in sorted(catalog.items(), key=lambda kv: str(kv[0])) if k and isinstance(v, str)]
        text = "\n".join(messages)[: budget // len(LANGS)]
        texts += [text[i:i + 100_000] for i in range(0, len(text), 100_000)]
    return texts


def frequencies(tokenizer, texts: list[str]) -> Counter:
    counts = Counter()
    for start in range(0, len(texts), 64):
        for ids in tokenizer(texts[start:start + 64], add_special_tokens=False).input_ids:
            counts.update(ids)
    return counts


def counted_ranking(tokenizer, budget: int) -> tuple[list[int], dict]:
    groups = {"code": code_texts(budget), "prose": prose_texts(budget), "languages": language_texts(budget)}
    score, sources = Counter(), {}
    for name, texts in groups.items():
        counts = frequencies(tokenizer, texts)
        total = sum(counts.values())
        sources[name] = {"files": len(texts), "chars": sum(map(len, texts)), "tokens": total}
        for token, n in counts.items():
            score[token] += n / total / len(groups)
    return sorted(score, key=lambda t: (-score[t], t)), sources


def merge_ranking(tokenizer_file: Path) -> list[int]:
    """Tokens in the order BPE made them: the base alphabet (by id), then each merge's product."""
    model = json.loads(tokenizer_file.read_text(encoding="utf-8"))["model"]
    vocab = model["vocab"]
    made = [vocab["".join(m) if isinstance(m, list) else m.replace(" ", "")] for m in model["merges"]]
    base = sorted(set(vocab.values()) - set(made))
    return base + made


def _tokenizer():
    from transformers import AutoTokenizer

    from via_sd.weights.embedded import embedded_model_dirs

    _, verifier_dir = embedded_model_dirs()
    return AutoTokenizer.from_pretrained(str(verifier_dir)), verifier_dir


def build(args) -> int:
    tokenizer, folder = _tokenizer()
    if args.rank == "merges":
        ranked, sources = merge_ranking(folder / "tokenizer.json"), {"tokenizer.json": "merges"}
    else:
        ranked, sources = counted_ranking(tokenizer, args.bytes)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True)
    specials = sorted(set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
                      | set(tokenizer(chat, add_special_tokens=False).input_ids))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    table = {"model_type": "qwen2", "vocab_size": 151936, "tokenizer_size": len(tokenizer), "rank": args.rank,
             "command": "python scripts/build_token_freq.py " + " ".join(sys.argv[1:]), "sources": sources,
             "special_ids": specials, "ids": ranked[: args.keep]}
    OUT.write_text(json.dumps(table, separators=(",", ":")) + "\n")
    print(f"{OUT}: {len(table['ids'])} ids ({OUT.stat().st_size:,} bytes); sources {json.dumps(sources)}")
    return 0


def greedy(args) -> int:
    from via_sd import DecodeConfig, generate, load_pair
    from via_sd.bench.inputs import load_prompts

    pair = load_pair("embedded", route="none")
    out = {}
    for name in args.sets.split(","):
        for i, item in enumerate(load_prompts(ROOT / "assets" / "prompts" / f"{name}.jsonl", limit=args.limit)):
            trace = generate(pair, item["prompt"], "ar", DecodeConfig(gamma=1, max_new_tokens=args.tokens))
            out[f"{name}/{i}"] = trace.token_ids
            print(name, i, len(trace.token_ids), flush=True)
    Path(args.greedy).write_text(json.dumps(out))
    return 0


def coverage(args) -> int:
    table = json.loads(OUT.read_text())
    runs = json.loads(Path(args.coverage).read_text())
    tokens = [t for ids in runs.values() for t in ids]
    tokenizer, _ = _tokenizer()
    rankings = {f"shipped ({table['rank']})": table["ids"], "counts": counted_ranking(tokenizer, args.bytes)[0]}
    print(f"{len(tokens)} verifier tokens from {len(runs)} prompts")
    for n in (8192, 16384, 24576, 32768, 49152, 65536):
        for name, ranked in rankings.items():
            top = set(ranked[:n]) | set(table["special_ids"])
            per_set = {}
            for key, ids in runs.items():
                per_set.setdefault(key.split("/")[0], []).extend(t in top for t in ids)
            shares = {k: round(sum(v) / len(v), 3) for k, v in per_set.items()}
            print(f"N={n:6d} {name:16s}: {sum(t in top for t in tokens) / len(tokens):.4f} in the top N  {shares}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=6_000_000, help="characters of text per source group")
    parser.add_argument("--keep", type=int, default=65536, help="ids kept in the asset")
    parser.add_argument("--rank", choices=("merges", "counts"), default="merges", help="which ranking ships")
    parser.add_argument("--greedy", help="run the verifier greedily on the prompt sets, save its tokens here")
    parser.add_argument("--sets", default=",".join(PROMPT_SETS))
    parser.add_argument("--limit", type=int, default=3, help="prompts per set for --greedy")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per prompt for --greedy")
    parser.add_argument("--coverage", help="a --greedy file: print the share of its tokens in the top N")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.greedy:
        return greedy(args)
    if args.coverage:
        return coverage(args)
    return build(args)


if __name__ == "__main__":
    sys.exit(main())
