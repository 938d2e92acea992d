"""llama.cpp as a measured bench peer: AR, speculative and n-gram lookup on the embedded pair's GGUF files.

Optional: `pip install -r requirements-peers.txt` builds llama-cpp-python (and its llama.cpp) from source. Without
it the bench skips these methods with one plain line (NOT_INSTALLED) and never fails; the app and the tests never
import llama_cpp. The methods, each through llama-cpp-python's own `Llama.generate` loop on the verifier's Q4_K_M
file (the cache keeps it: weights/embedded.py), greedy (temperature 0, its greedy sampler), n_threads = torch's thread count:

    llama-ar      plain decoding
    llama-sd      speculative: `Llama(draft_model=...)` with GreedyDraft, a LlamaDraftModel that drafts DRAFTS
                  tokens greedily with a second `Llama` on the 0.5B drafter's file (its KV cache kept across rounds:
                  each call reads only the tokens it has not seen, after trimming what the verifier rejected)
    llama-lookup  `LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=DRAFTS)`: the library's n-gram lookup

The prompt is the same text ours reads: the tokenizer's chat template rendered as `pair.encode` renders it, then
tokenized by llama.cpp (`special=True`, no BOS); each record says whether those ids equal ours. Like ours, a run
reuses the KV cache of the prompt prefix it shares with the previous run (the chat opening), and reads the rest of
the prompt with logits for the last row only: llama-cpp-python computes logits for every row once a draft model is
set (`logits_all`), so the prompt but its last token is read first with that switched off, as llama.cpp's own
speculative example does, and `generate` then resumes from that cache. Time counts as ours does: the whole call,
tokenizing, prompt read and detokenizing included; each engine is loaded once (in the warm-up), outside the clock.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from .methods import LLAMA_METHODS  # noqa: F401 (re-exported)

NOT_INSTALLED = "llama.cpp peer not installed: pip install -r requirements-peers.txt"
DRAFTS = 3  # drafts per round for llama-sd and llama-lookup
REBUILD = ('CMAKE_ARGS="-DGGML_NATIVE=ON -DCMAKE_C_FLAGS=-mno-amx-int8 -DCMAKE_CXX_FLAGS=-mno-amx-int8" pip install '
           '--no-cache-dir --force-reinstall --no-deps -r requirements-peers.txt')
_ENGINES: dict = {}  # (method, threads, n_ctx) -> (verifier Llama, drafter or None): loaded once per process
_PROBED: dict = {}  # the AMX probe's verdict, once per process


def installed() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def peer_missing(pair=None) -> str | None:
    """Why the llama.cpp methods cannot run here (one line), or None when they can."""
    if not installed():
        return NOT_INSTALLED
    if pair is not None:
        from ..weights.embedded import EMBEDDED_DRAFTER, EMBEDDED_VERIFIER

        names = f"{pair.drafter_name} {pair.verifier_name}".lower()
        if EMBEDDED_DRAFTER.lower() not in names or EMBEDDED_VERIFIER.lower() not in names:
            return (f"llama.cpp peer skipped: it runs the embedded pair's GGUF files ({EMBEDDED_DRAFTER} -> "
                    f"{EMBEDDED_VERIFIER}), not {pair.drafter_name} -> {pair.verifier_name}")
        return amx_probe()
    return None


def amx_probe() -> str | None:
    """A llama.cpp built with AMX (-march=native on an AMX Xeon) can die in its first pass where the VM does not
    grant AMX state (a general protection fault here): such a build is tried once in a child process, on the
    drafter's file, before this process loads it. None when it ran, else why not and how to rebuild."""
    if "verdict" not in _PROBED:
        import llama_cpp

        _PROBED["verdict"] = None
        if "AMX_INT8 = 1" in llama_cpp.llama_print_system_info().decode(errors="replace"):
            from ..weights.embedded import embedded_gguf_paths

            code = ("import sys; from via_sd.bench.llama_peer import load_llama\n"
                    "m = load_llama(sys.argv[1], 256, n_threads=1); m.eval(m.tokenize(b'Hello there', False))")
            done = subprocess.run([sys.executable, "-c", code, str(embedded_gguf_paths()[0])], capture_output=True,
                                  timeout=300, cwd=Path(__file__).resolve().parents[2])  # `-c` imports via_sd from cwd
            if done.returncode:
                _PROBED["verdict"] = (f"llama.cpp peer skipped: this build (with AMX) died in its first pass here "
                                      f"(exit {done.returncode}); rebuild it without AMX: {REBUILD}")
    return _PROBED["verdict"]


def threads() -> int:
    import torch

    return torch.get_num_threads()


def load_llama(path, n_ctx: int = 2048, draft_model=None, n_threads: int | None = None):
    """A quiet llama.cpp model on `path`, CPU only, with as many threads as ours."""
    from llama_cpp import Llama

    n = n_threads or threads()
    return Llama(model_path=str(path), n_ctx=n_ctx, n_batch=512, n_threads=n, n_threads_batch=n, n_gpu_layers=0,
                 draft_model=draft_model, verbose=False)


def last_logits(llama) -> np.ndarray:
    """The logits of the last row llama.cpp computed them for (a view, no copy)."""
    import llama_cpp

    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llama.ctx, -1), shape=(llama.n_vocab(),))


def trim_to_prefix(llama, ids: list[int]) -> int:
    """Keeps the cached prefix `llama` shares with `ids`, at most len(ids) - 1 tokens (the last one is read again
    for its logits), and drops the rest of its KV cache; returns how many tokens it kept."""
    cached = llama.input_ids[: llama.n_tokens]
    n = min(len(cached), len(ids) - 1)
    differ = np.flatnonzero(cached[:n] != np.asarray(ids[:n], dtype=cached.dtype))
    keep = int(differ[0]) if differ.size else n
    llama.n_tokens = keep
    llama.eval([])  # eval trims the KV cache to n_tokens before reading anything
    return keep


def read_prompt(llama, ids: list[int]) -> None:
    """Reads all but the last prompt token into the cache, logits off (see the module doc)."""
    keep = trim_to_prefix(llama, ids)
    saved, llama._logits_all = llama._logits_all, False
    try:
        llama.eval(ids[keep:-1])
    finally:
        llama._logits_all = saved


def _greedy_draft_class():
    from llama_cpp.llama_speculative import LlamaDraftModel

    class GreedyDraft(LlamaDraftModel):
        """Drafts `drafts` tokens greedily with a second Llama (the 0.5B drafter), keeping its KV cache."""

        def __init__(self, llama, drafts: int = DRAFTS, eos=()):
            self.llama, self.drafts, self.eos = llama, drafts, set(eos)
            self.calls = self.proposed = self.forwards = 0

        def __call__(self, input_ids, /, **kwargs):
            ids = input_ids.tolist()
            keep = trim_to_prefix(self.llama, ids)
            self.llama.eval(ids[keep:])
            self.forwards += 1
            out = []
            for i in range(self.drafts):
                token = int(np.argmax(last_logits(self.llama)))
                out.append(token)
                if token in self.eos:
                    break
                if i + 1 < self.drafts:
                    self.llama.eval([token])
                    self.forwards += 1
            self.calls += 1
            self.proposed += len(out)
            return np.array(out, dtype=np.intc)

    return GreedyDraft


def _lookup(drafts: int):
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    class CountedLookup(LlamaPromptLookupDecoding):
        calls = proposed = 0

        def __call__(self, input_ids, /, **kwargs):
            out = super().__call__(input_ids)
            self.calls += 1
            self.proposed += len(out)
            return out

    return CountedLookup(max_ngram_size=2, num_pred_tokens=drafts)


def engine(method: str, eos=(), n_ctx: int = 2048):
    """(verifier Llama, draft model or None) for `method`, loaded once per process."""
    key = (method, threads(), n_ctx)
    if key not in _ENGINES:
        from ..weights.embedded import embedded_gguf_paths

        drafter_path, verifier_path = embedded_gguf_paths()
        draft = None
        if method == "llama-sd":
            draft = _greedy_draft_class()(load_llama(drafter_path, n_ctx), DRAFTS, eos)
        elif method == "llama-lookup":
            draft = _lookup(DRAFTS)
        elif method != "llama-ar":
            raise ValueError(f"unknown llama.cpp method {method!r}: use {', '.join(LLAMA_METHODS)}")
        _ENGINES[key] = (load_llama(verifier_path, n_ctx, draft_model=draft), draft)
    return _ENGINES[key]


def chat_text(pair, prompt: str, chat: bool = True) -> str:
    """The prompt text ours reads (pair.encode): through the chat template when the tokenizer has one."""
    if chat and getattr(pair.tokenizer, "chat_template", None):
        return pair.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                  add_generation_prompt=True)
    return prompt


def _counting(llama) -> list[int]:
    """Counts the verifier's forward calls (each `eval`, with the tokens it read) from here on."""
    fed: list[int] = []
    if "eval" in vars(llama):  # counted before: reset the tally
        llama.eval.fed.clear()
        return llama.eval.fed
    original = type(llama).eval.__get__(llama)

    def eval(tokens):
        if len(tokens):
            fed.append(len(tokens))
        return original(tokens)

    eval.fed = fed
    llama.eval = eval
    return fed


def run_llama(pair, prompt: str, method: str, config) -> dict:
    """One timed greedy run of a llama.cpp method: a record shaped as the bench's `hf` record (no trace)."""
    if config.temperature != 0:
        raise ValueError("the llama.cpp peer runs greedy only (temperature 0)")
    eos = sorted(pair.eos_ids)
    ours = pair.encode(prompt, chat=config.chat)
    llama, draft = engine(method, eos, n_ctx=max(2048, 1 << (len(ours) + config.max_new_tokens + 64).bit_length()))
    fed = _counting(llama)
    before = {k: getattr(draft, k, 0) for k in ("proposed", "forwards")}
    start = time.perf_counter()
    ids = llama.tokenize(chat_text(pair, prompt, config.chat).encode("utf-8"), add_bos=False, special=True)
    read_prompt(llama, ids)
    prompt_fed = sum(fed)
    out: list[int] = []
    for token in llama.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
        out.append(int(token))
        if token in pair.eos_ids or len(out) >= config.max_new_tokens:
            break
    llama.detokenize(out)  # as ours pays for its text
    wall_ms = 1000.0 * (time.perf_counter() - start)
    rounds = len(fed) - (1 if prompt_fed else 0)  # verifier passes after the prompt read
    after = {k: getattr(draft, k, 0) - before[k] for k in before}
    return {"tokens_per_s": 1000.0 * len(out) / wall_ms if wall_ms > 0 else 0.0, "wall_ms": wall_ms,
            "new_tokens": len(out), "prompt_tokens": len(ids), "prompt_ids_match_ours": ids == ours,
            "token_ids": out, "full_calls": rounds, "drafter_calls": after["forwards"], "drafted": after["proposed"],
            "llama_threads": threads(), "engine": f"llama-cpp-python {_version()}"}


def _version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        return "?"
