"""Checkpoints as the real tools write them, for tests.

* :func:`make_llmcompressor_checkpoints` lets llm-compressor itself (its
  ``oneshot`` and its own save path) quantize a tiny random Llama (2 layers,
  8 query heads, 2 KV heads, head_dim 16, built with transformers and saved
  with a ``tokenizers`` WordLevel tokenizer, because ``oneshot`` wants a
  processor and a model loaded from a directory) with a ``kv_cache_scheme``
  of each strategy vLLM supports. It runs in a child process (llm-compressor
  logs and warns on import) and takes about 10 s on a CPU. Recipes:
  ``tensor`` and ``attn_head`` (a ``kv_cache_scheme`` only) and
  ``attn_head_attention`` (also a ``config_groups`` entry quantizing the
  ``LlamaAttention`` inputs, which adds ``q_scale`` and zero points).
* :func:`make_modelopt_checkpoint` builds a ModelOpt FP8 checkpoint from
  ModelOpt's documented layout (ModelOpt is not installable here): per layer
  ``self_attn.k_proj.k_scale`` / ``v_proj.v_scale`` (shape ``[]``) beside
  weight and input scales, with the config inline in ``config.json`` or in
  the legacy ``hf_quant_config.json``.

Run as ``python -m vtinfer.testing.checkpoints OUT_DIR`` to build the
llm-compressor set by hand.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

#: The tiny model the fixtures quantize.
TINY_LLAMA = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=8, num_key_value_heads=2, head_dim=16, max_position_embeddings=128)
RECIPES = ("tensor", "attn_head", "attn_head_attention")
LLMCOMPRESSOR_PIN = "0.14"


class ToolUnavailable(RuntimeError):
    """llm-compressor is not installed or failed (the reason is the message)."""


def require_llmcompressor() -> bool:
    """True when missing llm-compressor must fail (``VTINFER_REQUIRE_LLMCOMPRESSOR=1``, set by CI)."""
    return os.environ.get("VTINFER_REQUIRE_LLMCOMPRESSOR", "") not in ("", "0")


def make_llmcompressor_checkpoints(out_dir: str | os.PathLike, timeout: float = 300) -> dict[str, Path]:
    """One checkpoint per recipe under ``out_dir`` (``out_dir/<recipe>``).

    Raises
    ------
    ToolUnavailable
        llm-compressor is not importable, or the child process failed (its
        last lines of output quoted).
    """
    if importlib.util.find_spec("llmcompressor") is None:
        raise ToolUnavailable("llmcompressor is not installed (pip install 'llmcompressor==0.14.*')")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONWARNINGS="ignore", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "vtinfer.testing.checkpoints", str(out)], capture_output=True,
                          text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        raise ToolUnavailable(f"llm-compressor fixture generation failed (exit {proc.returncode}):\n{tail}")
    return {r: out / r for r in RECIPES}


#: The compressed-tensors release the pinned vLLM 0.33.0 requires (llm-compressor 0.14 installs 0.19.0).
VLLM_COMPRESSED_TENSORS_PIN = "0.17.0"

_PARSE = """
import json, sys
from compressed_tensors.quantization import QuantizationConfig
import compressed_tensors
out = []
for doc in json.loads(sys.stdin.read()):
    try:
        k = QuantizationConfig.model_validate(doc).kv_cache_scheme
    except Exception as e:
        out.append({"error": f"{type(e).__name__}: {str(e).splitlines()[0]}"})
        continue
    out.append({"version": compressed_tensors.__version__,
                "kv_cache_scheme": None if k is None else {f: str(getattr(k, f)) for f in
                    ("num_bits", "type", "strategy", "symmetric", "dynamic")}})
print(json.dumps(out))
"""


def parse_with_vllm_compressed_tensors(quantization_configs: list[dict],
                                       timeout: float = 300) -> list[dict[str, Any]]:
    """Parse ``quantization_config`` documents with compressed-tensors
    ``VLLM_COMPRESSED_TENSORS_PIN``'s own ``QuantizationConfig`` (the wheel is
    fetched once with ``pip download --no-deps`` into
    ``~/.cache/vtinfer/compressed-tensors`` and imported from its extracted
    copy in one child process, beside whatever version is installed).
    Returns one dict per document: ``{"version", "kv_cache_scheme": {num_bits,
    type, strategy, symmetric, dynamic} as strings}``, or ``{"error": ...}``
    where the parser refused it.

    Raises
    ------
    ToolUnavailable
        The wheel could not be fetched.
    RuntimeError
        The child process failed (its last line quoted).
    """
    import zipfile

    from vtinfer.testing.upstream import cache_dir

    base = cache_dir().parent
    d = base / "compressed-tensors"
    pin = VLLM_COMPRESSED_TENSORS_PIN
    wheels = sorted(d.glob(f"compressed_tensors-{pin}-*.whl")) if d.is_dir() else []
    if not wheels:
        d.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                               f"compressed-tensors=={pin}", "-d", str(d)], capture_output=True, text=True)
        wheels = sorted(d.glob(f"compressed_tensors-{pin}-*.whl"))
        if proc.returncode != 0 or not wheels:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise ToolUnavailable(f"pip download compressed-tensors=={pin} failed: {tail[0]}")
    tree = d / f"compressed_tensors-{pin}"
    if not (tree / "compressed_tensors" / "__init__.py").is_file():
        with zipfile.ZipFile(wheels[0]) as zf:
            zf.extractall(tree)
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", _PARSE], input=json.dumps(quantization_configs),
                          capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"compressed-tensors {pin} parser failed: "
                           f"{(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _generate(out: Path) -> None:  # runs in the child process
    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    src = out / "_random_llama"
    LlamaForCausalLM(LlamaConfig(**TINY_LLAMA)).to(torch.bfloat16).save_pretrained(src)
    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, TINY_LLAMA["vocab_size"])}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[UNK]")
    fast.save_pretrained(src)
    g = torch.Generator().manual_seed(1)
    ids = [torch.randint(1, TINY_LLAMA["vocab_size"], (32,), generator=g).tolist() for _ in range(4)]
    ds = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * 32 for _ in ids]})
    for recipe in RECIPES:
        strategy = "tensor" if recipe == "tensor" else "attn_head"
        kv = {"num_bits": 8, "type": "float", "strategy": strategy, "dynamic": False, "symmetric": True}
        if recipe == "attn_head_attention":
            mod = QuantizationModifier(config_groups={"attention": {"targets": ["LlamaAttention"],
                                                                    "input_activations": dict(kv)}},
                                       kv_cache_scheme=kv)
        else:
            mod = QuantizationModifier(kv_cache_scheme=kv)
        model = LlamaForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
        oneshot(model=model, tokenizer=fast, dataset=ds, recipe=[mod], num_calibration_samples=len(ids),
                max_seq_length=32, output_dir=str(out / recipe), pipeline="basic")


def make_modelopt_checkpoint(out_dir: str | os.PathLike, *, legacy: bool = False, num_layers: int = 2,
                             num_heads: int = 8, num_kv_heads: int = 2, head_dim: int = 16,
                             seed: int = 0) -> tuple[Path, dict[str, np.ndarray]]:
    """A ModelOpt FP8 checkpoint from ModelOpt's documented layout.

    Returns ``(dir, scales)``: the scale tensors written, by name.
    ``legacy``: the config goes to ``hf_quant_config.json`` and config.json
    has none (older ModelOpt exports); else it is inline in config.json.
    """
    from vtinfer.scales import write_safetensors

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    hidden = num_heads * head_dim
    quant: dict[str, Any] = {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}
    producer = {"name": "modelopt", "version": "0.29.0"}
    cfg: dict[str, Any] = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
                           "intermediate_size": 2 * hidden, "num_hidden_layers": num_layers,
                           "num_attention_heads": num_heads, "num_key_value_heads": num_kv_heads,
                           "head_dim": head_dim, "vocab_size": 64, "torch_dtype": "bfloat16"}
    if legacy:
        (out / "hf_quant_config.json").write_text(json.dumps({"producer": producer, "quantization": quant},
                                                             indent=2))
    else:
        cfg["quantization_config"] = {"quant_method": "modelopt", "producer": producer, "quantization": quant}
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    scales: dict[str, np.ndarray] = {}
    for i in range(num_layers):
        a = f"model.layers.{i}.self_attn"
        scales[f"{a}.k_proj.k_scale"] = np.float32(rng.uniform(0.01, 0.1)).reshape(())
        scales[f"{a}.v_proj.v_scale"] = np.float32(rng.uniform(0.01, 0.1)).reshape(())
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            scales[f"{a}.{proj}.weight_scale"] = np.float32(rng.uniform(0.001, 0.01)).reshape(())
            scales[f"{a}.{proj}.input_scale"] = np.float32(rng.uniform(0.01, 0.1)).reshape(())
    write_safetensors(out / "model.safetensors", scales)
    return out, scales


if __name__ == "__main__":
    _generate(Path(sys.argv[1]))
