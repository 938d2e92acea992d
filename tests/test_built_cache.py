"""The built int4 models kept in the cache (via_sd/weights/built.py): a second start opens what the first built, with
the same outputs and the drafter head's watcher back in place; another key (a changed kernel source) builds anew."""

import json

import pytest
import torch

from via_sd.weights import built
from via_sd.weights.built import built_model, built_path


def codes_folder(tmp_path, sha="ab" * 32):
    """A cache folder as the embedded set-up leaves one: model.gguf (random F32 tensors), config.json, READY.json."""
    from test_weights import model_gguf, qwen2_config

    config = qwen2_config(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                          num_key_value_heads=2)
    folder = tmp_path / "tiny-model"
    folder.mkdir()
    model_gguf(folder / "model.gguf", config, {})
    config.save_pretrained(str(folder))
    (folder / "READY.json").write_text(json.dumps({"sha256": sha}))
    return folder


def builder(folder, calls):
    """build_model of the folder in int4, its head narrowed to 64 tokens and watching its inputs (a FrequentHead,
    as the embedded drafter's)."""
    from transformers import AutoConfig

    from via_sd.weights.gguf_pack import Entries, build_model
    from via_sd.weights.heads import FrequentHead

    def build():
        calls.append(1)
        config = AutoConfig.from_pretrained(str(folder))
        model = build_model(config, Entries.from_folder(folder, config), "int4", exact_top1=False)
        head = FrequentHead(model.get_output_embeddings(), torch.arange(0, 128, 2))
        model.set_output_embeddings(head)
        head.watch(model)
        return model
    return build


def test_a_second_start_opens_the_built_model_with_the_same_outputs_and_its_watcher(tmp_path, monkeypatch):
    from via_sd.weights.heads import FrequentHead

    monkeypatch.setattr(built, "cache_root", lambda: tmp_path / "cache")  # the kernel's build stays where it is
    folder, calls = codes_folder(tmp_path), []
    first = built_model(folder, "int4", {"exact_top1": False}, builder(folder, calls))
    second = built_model(folder, "int4", {"exact_top1": False}, builder(folder, calls))
    assert len(calls) == 1, "the second start built the model again"
    assert second is not first and len(list((tmp_path / "cache" / "built" / folder.name).glob("*.pt"))) == 1
    ids = torch.tensor([[5, 7, 9, 11, 13]])  # odd ids: outside the narrowed head's list, so the watcher must add them
    with torch.no_grad():
        a, b = first(ids).logits, second(ids).logits
    assert torch.equal(a, b)
    head = second.get_output_embeddings()
    assert isinstance(head, FrequentHead) and head.active().seen == frozenset({5, 7, 9, 11, 13})
    assert len(second._forward_pre_hooks) == len(first._forward_pre_hooks) == 1


def test_another_kernel_source_or_gguf_is_another_key_and_the_oldest_file_goes(tmp_path, monkeypatch):
    monkeypatch.setattr(built, "cache_root", lambda: tmp_path / "cache")  # the kernel's build stays where it is
    folder, calls = codes_folder(tmp_path), []
    built_model(folder, "int4", {"exact_top1": False}, builder(folder, calls))
    old = next((tmp_path / "cache" / "built" / folder.name).glob("*.pt"))
    monkeypatch.setattr(built, "sources_digest", lambda: "a changed lowbit_kernel.cpp")
    built_model(folder, "int4", {"exact_top1": False}, builder(folder, calls))
    assert len(calls) == 2, "a changed kernel source reused the old build"
    assert len(list(old.parent.glob("*.pt"))) == 2  # the newest other key's stays (another checkout's)
    (folder / "READY.json").write_text(json.dumps({"sha256": "cd" * 32}))
    built_model(folder, "int4", {"exact_top1": False}, builder(folder, calls))
    assert len(calls) == 3, "another GGUF reused the old build"
    files = list(old.parent.glob("*.pt"))
    assert len(files) == 2 and old not in files  # the oldest went


def test_a_first_start_builds_apart_in_child_processes_and_the_load_opens_what_they_kept(tmp_path, monkeypatch,
                                                                                          caplog):
    """built.build_apart: each model built and kept by a child process of its own, the same model this process
    builds; a folder a child cannot build keeps nothing, says why in the log and is left to `built_model`."""
    import shutil

    from via_sd.weights.paths import cache_root

    cache = tmp_path / "cache"
    cache.mkdir()
    if (cache_root() / "kernels").is_dir():  # the session's compiled kernel: the children compile nothing
        (cache / "kernels").symlink_to(cache_root() / "kernels", target_is_directory=True)
    monkeypatch.setenv("VIA_SD_CACHE", str(cache))  # what the children read
    folder, options = codes_folder(tmp_path), {"exact_top1": False}
    broken = tmp_path / "broken-model"
    shutil.copytree(folder, broken)
    (broken / "model.gguf").write_bytes((folder / "model.gguf").read_bytes()[:1000])  # a truncated GGUF
    jobs = built.to_build([(folder, "int4", options), (folder, "fp32", {}), (broken, "int4", options)])
    assert jobs == [(folder, "int4", options), (broken, "int4", options)]  # only int4 is kept
    built.build_apart(jobs)
    assert built.to_build(jobs) == [(broken, "int4", options)]
    assert "broken-model in a child process failed" in caplog.text and "ends inside its header" in caplog.text
    calls = []
    kept = built_model(folder, "int4", options, lambda: calls.append(1))
    assert calls == [], "the load built again what a child kept"
    here = built.build_folder(folder, "int4", options)
    ids = torch.tensor([[1, 2, 3, 40]])
    with torch.no_grad():
        assert torch.equal(kept(ids).logits, here(ids).logits)


def test_a_damaged_file_is_built_again_and_fp32_is_never_kept(tmp_path, monkeypatch, caplog):
    from via_sd.weights.built import built_key

    monkeypatch.setattr(built, "cache_root", lambda: tmp_path / "cache")  # the kernel's build stays where it is
    folder, calls = codes_folder(tmp_path), []
    built_model(folder, "int4", {"exact_top1": False}, builder(folder, calls))
    path = built_path(folder, built_key(folder, "int4", {"exact_top1": False}))
    path.write_bytes(path.read_bytes()[:1000])
    model = built_model(folder, "int4", {"exact_top1": False}, builder(folder, calls))
    assert len(calls) == 2 and "did not open" in caplog.text and isinstance(model, torch.nn.Module)
    sentinel = torch.nn.Linear(2, 2)
    assert built_model(folder, "fp32", {}, lambda: sentinel) is sentinel
    assert len(list(path.parent.glob("*.pt"))) == 1


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
