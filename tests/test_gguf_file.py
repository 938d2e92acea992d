"""The GGUF header read in one walk (gguf_file.py), and the config and tokenizer built from it, against what gguf's
GGUFReader and transformers' own GGUF loaders read from the same file (written here with GGUFWriter)."""

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter
from transformers import AutoConfig, AutoTokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

from via_sd.weights.gguf_file import GgufFile
from via_sd.weights.gguf_pack import gguf_config, gguf_tokenizer

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s", "r e", "Ġ w"]
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
PROBES = ["Hello, the world!", "def f(x):\n\treturn x * 2", "  héllo wörld 你好 🙂 1234", "<|im_start|>user\nhi<|im_end|>"]


def tiny_gguf(path, arch: str = "qwen2", head: bool = True):
    """A 2-layer model's header (a byte-level BPE vocabulary, a chat template) and a few of its tensors."""
    tokens = list(bytes_to_unicode().values()) + [m.replace(" ", "") for m in MERGES] + SPECIAL
    writer = GGUFWriter(str(path), arch)
    writer.add_name("tiny test model")
    writer.add_context_length(256)
    writer.add_embedding_length(64)
    writer.add_block_count(2)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (len(tokens) - len(SPECIAL)) + [3] * len(SPECIAL))
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(len(tokens) - 3)
    writer.add_eos_token_id(len(tokens) - 1)
    writer.add_pad_token_id(len(tokens) - 3)
    writer.add_add_bos_token(False)
    writer.add_chat_template(TEMPLATE)
    rng = np.random.default_rng(0)
    writer.add_tensor("token_embd.weight", rng.standard_normal((len(tokens), 64)).astype(np.float32))
    writer.add_tensor("output_norm.weight", np.ones(64, np.float32))
    if head:
        writer.add_tensor("output.weight", rng.standard_normal((len(tokens), 64)).astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, len(tokens)


def test_the_header_reads_as_ggufs_reader_reads_it_with_string_arrays_as_their_lengths(tmp_path):
    path, vocab = tiny_gguf(tmp_path / "tiny.gguf")
    ours, reference = GgufFile(path), GGUFReader(str(path))
    for key, field in reference.fields.items():
        if key.startswith("GGUF."):
            continue
        value = field.contents()
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
            assert ours.metadata[key] == len(value)
        else:
            assert ours.metadata[key] == pytest.approx(value), key
    assert GgufFile(path, strings=("tokenizer.ggml.merges",)).metadata["tokenizer.ggml.merges"] == MERGES
    assert [t.name for t in ours.tensors] == [t.name for t in reference.tensors]
    for t, r in zip(ours.tensors, reference.tensors):
        assert t.type == r.tensor_type.name and t.shape == tuple(int(s) for s in reversed(r.shape.tolist()))
        assert t.data.tobytes() == np.asarray(r.data).tobytes()
    assert ours.metadata["tokenizer.ggml.tokens"] == vocab


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("head", [True, False], ids=["own-head", "tied"])
def test_the_config_equals_transformers_own_from_the_same_file(tmp_path, arch, head):
    path, vocab = tiny_gguf(tmp_path / "tiny.gguf", arch, head)
    reference = AutoConfig.from_pretrained(str(tmp_path), gguf_file=path.name).to_dict()
    ours = gguf_config(path).to_dict()
    reference.pop("_name_or_path"), ours.pop("_name_or_path")
    reference["tie_word_embeddings"] = not head  # what the weights say (gguf_config), whatever the loader guessed
    assert ours == reference
    assert ours["vocab_size"] == vocab and ours["num_hidden_layers"] == 2 and ours["tie_word_embeddings"] == (not head)


def test_the_tokenizer_equals_autotokenizers_from_the_same_file(tmp_path):
    path, _ = tiny_gguf(tmp_path / "tiny.gguf")
    ours = gguf_tokenizer(path)
    reference = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    assert type(ours) is type(reference)
    assert ours.backend_tokenizer.to_str() == reference.backend_tokenizer.to_str()
    assert ours.chat_template == reference.chat_template == TEMPLATE
    for text in PROBES:
        assert ours(text).input_ids == reference(text).input_ids


def test_a_truncated_file_or_another_format_is_refused_by_name(tmp_path):
    path, _ = tiny_gguf(tmp_path / "tiny.gguf")
    short = tmp_path / "short.gguf"
    short.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError, match="ends past the end of the file"):
        GgufFile(short)
    other = tmp_path / "model.bin"
    other.write_bytes(b"PK\x03\x04" + bytes(64))
    with pytest.raises(ValueError, match="not a GGUF file"):
        GgufFile(other)
