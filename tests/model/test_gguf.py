"""GGUF -> checkpoint conversion on a small GGUF written here with the gguf
package's writer: names, geometry, llama.cpp's rotary row permutation undone,
Q8_0 dequantization, tied embeddings and the tokenizer."""

from __future__ import annotations

import json

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from tests.model import refmodel  # noqa: E402
from vtinfer.models import Decoder, convert_gguf  # noqa: E402
from vtinfer.models.gguf_convert import unpermute_rotary  # noqa: E402
from vtinfer.models.tiny import make_tiny_checkpoint  # noqa: E402


def llamacpp_permute(w, n_head):
    # convert_hf_to_gguf.py's LlamaModel.permute, written out from its published formula
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("n_head,d,cols", [(1, 4, 3), (4, 16, 8), (3, 64, 5)])
def test_unpermute_inverts_llamacpp_permute(n_head, d, cols):
    w = np.random.default_rng(n_head).standard_normal((n_head * d, cols)).astype(np.float32)
    p = llamacpp_permute(w, n_head)
    assert not np.array_equal(p, w)
    assert np.array_equal(unpermute_rotary(p, n_head), w)
    # pair (i, i + d/2) of each head becomes adjacent rows (2i, 2i+1) in GGUF order
    assert np.array_equal(p[1], w[d // 2]) and np.array_equal(p[2], w[1])


def _byte_vocab():
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + alphabet + ["Ġt", "he", "Ġthe", "42"]
    merges = ["Ġ t", "h e", "Ġt he", "4 2"]  # "42" exists, so only the digit pre-split keeps 4 and 2 apart
    types = [3, 3, 3] + [1] * (len(tokens) - 3)
    return tokens, merges, types


def write_gguf(path, src_dir, q8_names=()):
    cfg, w = refmodel.load(src_dir)
    H, Hk = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    wr = gguf.GGUFWriter(str(path), "llama")
    wr.add_block_count(cfg["num_hidden_layers"])
    wr.add_context_length(cfg["max_position_embeddings"])
    wr.add_embedding_length(cfg["hidden_size"])
    wr.add_feed_forward_length(cfg["intermediate_size"])
    wr.add_head_count(H)
    wr.add_head_count_kv(Hk)
    wr.add_rope_freq_base(cfg["rope_theta"])
    wr.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    tokens, merges, types = _byte_vocab()
    wr.add_vocab_size(cfg["vocab_size"])
    wr.add_tokenizer_model("gpt2")
    wr.add_tokenizer_pre("smollm")
    wr.add_token_list(tokens)
    wr.add_token_types(types)
    wr.add_token_merges(merges)
    wr.add_bos_token_id(1)
    wr.add_eos_token_id(2)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    per = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
           "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
           "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
           "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
           "mlp.down_proj.weight": "ffn_down.weight"}
    for i in range(cfg["num_hidden_layers"]):
        for a, b in per.items():
            names[f"model.layers.{i}.{a}"] = f"blk.{i}.{b}"
    expected = {}
    for hf, gg in names.items():
        t = w[hf].astype(np.float32)
        if gg.endswith("attn_q.weight"):
            t = llamacpp_permute(t, H)
        elif gg.endswith("attn_k.weight"):
            t = llamacpp_permute(t, Hk)
        if gg in q8_names:
            q = gguf.quants.quantize(t, gguf.GGMLQuantizationType.Q8_0)
            wr.add_tensor(gg, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            deq = gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0).reshape(t.shape)
            if gg.endswith("attn_q.weight"):
                deq = unpermute_rotary(deq, H)
            elif gg.endswith("attn_k.weight"):
                deq = unpermute_rotary(deq, Hk)
            expected[hf] = deq
        else:
            wr.add_tensor(gg, t)
            expected[hf] = w[hf]
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return cfg, expected


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    src = make_tiny_checkpoint(root / "src", seed=5, model_type="llama", vocab_size=263)
    cfg, expected = write_gguf(root / "m.gguf", src, q8_names=("blk.1.attn_k.weight", "blk.0.ffn_up.weight"))
    out = convert_gguf(root / "m.gguf", root / "out", progress=False)
    return src, cfg, expected, out


def test_config_geometry(converted):
    _, cfg, _, out = converted
    got = json.loads((out / "config.json").read_text())
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "rope_theta", "vocab_size", "max_position_embeddings"):
        assert got[k] == cfg[k], k
    assert got["rms_norm_eps"] == pytest.approx(cfg["rms_norm_eps"], rel=1e-6)
    assert got["tie_word_embeddings"] is True and got["model_type"] == "llama"


def test_weights_unpermuted_and_dequantized(converted):
    _, _, expected, out = converted
    _, got = refmodel.load(out)
    assert set(got) == set(expected)
    for name, want in expected.items():
        assert np.array_equal(got[name], np.asarray(want, np.float32)), name


def test_converted_model_matches_source_model(converted):
    src, _, _, out = converted
    toks = np.random.default_rng(0).integers(0, 263, 24)
    a = Decoder.from_pretrained(out).score(toks)
    cfg, w = refmodel.load(out)
    assert np.allclose(a, refmodel.forward(cfg, w, toks), atol=1e-4 * np.abs(a).max())
    # the Q8_0 tensors move the logits only a little from the float32 source
    b = Decoder.from_pretrained(src).score(toks)
    assert np.abs(a - b).max() < 0.05 * np.abs(b).max()


def test_tokenizer(converted):
    from vtinfer.models.tokenizer import HFTokenizer

    _, _, _, out = converted
    tk = HFTokenizer(out / "tokenizer.json")
    tokens, _, _ = _byte_vocab()
    ids = tk.encode("the 42 <|im_start|>x")
    assert tokens.index("Ġthe") not in ids  # no leading space before 'the'
    assert tk.encode(" the") == [tokens.index("Ġthe")]
    assert tk.encode("42") == [tokens.index("4"), tokens.index("2")]  # digits split one by one
    assert 1 in ids  # control token kept whole
    assert tk.decode(tk.encode("hello there, 123")) == "hello there, 123"


def test_missing_file_and_bad_arch(tmp_path):
    with pytest.raises(FileNotFoundError, match="path must be a GGUF file"):
        convert_gguf(tmp_path / "nope.gguf", tmp_path / "out")
    wr = gguf.GGUFWriter(str(tmp_path / "b.gguf"), "gpt2")
    wr.add_tensor("x", np.zeros(4, np.float32))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    with pytest.raises(NotImplementedError, match="general.architecture"):
        convert_gguf(tmp_path / "b.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()
