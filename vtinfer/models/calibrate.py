"""Offline KV-cache calibration: ``scale = amax / 448`` per layer (or per layer
and KV head), written into a copy of the checkpoint that vLLM's resolver reads
as an fp8 KV-cache checkpoint.

Per layer (default): ModelOpt-style tensors
``model.layers.N.self_attn.k_proj.k_scale`` / ``v_proj.v_scale`` (shape
``[]``) and an inline ``quantization_config`` with the ModelOpt producer
marker and ``kv_cache_quant_algo: "FP8"``; ``quant_method: "modelopt"`` is
written too, because vLLM's resolver consults the KV key only for a
``modelopt*`` method and a KV-only ModelOpt config has ``quant_algo: null``.

vLLM 0.33.0 *resolves* fp8 from that config, but its ModelOpt loader
(``ModelOptQuantConfigBase.from_config``) raises "Missing 'quant_algo' in
quantization config" for a KV-only ModelOpt config, so such a checkpoint does
not *load* in vLLM. ``fmt="compressed-tensors"`` writes the form vLLM loads
for unquantized weights with an fp8 KV cache (llm-compressor's): a
``kv_cache_scheme`` with ``strategy: "tensor"`` and tensors
``model.layers.N.self_attn.k_scale`` / ``v_scale`` of shape ``[1]``.

Per KV head (``per_head=True``): vLLM reads per-head scales only from
compressed-tensors checkpoints whose ``kv_cache_scheme`` has ``strategy:
"attn_head"``, so that is what is written, as llm-compressor 0.14 writes it:
tensors ``model.layers.N.self_attn.k_scale`` / ``v_scale`` of shape
``[num_kv_heads, 1, 1]`` and llm-compressor's ``quantization_config`` keys
(``config_groups: {}``, which makes vLLM add the head counts its
tensor-parallel loader divides by).
"""

from __future__ import annotations

import copy
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vtinfer.models.store import MARKER, atomic_dir, save_safetensors, write_json

__all__ = ["FP8_E4M3_MAX", "Calibration", "calibrate_amax", "calibrate", "write_calibrated"]

FP8_E4M3_MAX = 448.0
SCALES_FILE = "kv_scales.safetensors"


@dataclass(frozen=True)
class Calibration:
    """Absolute maxima of K (after RoPE) and V, ``[num_layers, num_kv_heads]``."""

    k_amax: np.ndarray
    v_amax: np.ndarray
    tokens: int

    def scales(self, per_head: bool = False, fmt_max: float = FP8_E4M3_MAX) -> tuple[np.ndarray, np.ndarray]:
        """``amax / fmt_max`` as float32: ``[num_layers]`` or ``[num_layers, num_kv_heads]``.
        An all-zero amax gives the smallest positive scale instead of 0."""
        k, v = (self.k_amax, self.v_amax) if per_head else (self.k_amax.max(1), self.v_amax.max(1))
        tiny = np.float32(np.finfo(np.float32).tiny)
        f = lambda a: np.maximum((a / np.float64(fmt_max)).astype(np.float32), tiny)  # noqa: E731
        return f(k), f(v)


def calibrate_amax(model: Any, tokens: Any, *, chunk: int = 256, progress: bool | None = None) -> Calibration:
    """Run ``tokens`` through ``model`` (a :class:`~vtinfer.models.Decoder`)
    with a float32 KV cache and record per-layer, per-KV-head |K| and |V| maxima."""
    from vtinfer.models.progress import bar

    c = model.config
    toks = np.asarray(tokens, dtype=np.int64).reshape(-1)
    if len(toks) == 0:
        raise ValueError("calibrate: tokens must not be empty; got 0 tokens")
    k_amax = np.zeros((c.num_layers, c.num_kv_heads), np.float32)
    v_amax = np.zeros((c.num_layers, c.num_kv_heads), np.float32)

    def observe(layer: int, k: np.ndarray, v: np.ndarray) -> None:
        np.maximum(k_amax[layer], np.abs(k).max(axis=(0, 2)), out=k_amax[layer])
        np.maximum(v_amax[layer], np.abs(v).max(axis=(0, 2)), out=v_amax[layer])

    sess = model.session("float32", max_tokens=len(toks))
    sess.observer = observe
    starts = range(0, len(toks), chunk)
    from vtinfer.models.blas import blas_threads

    with blas_threads(model.blas_threads):
        for i in bar(starts, desc="calibrate", total=len(starts), enabled=progress):
            sess.forward_hidden(toks[i:i + chunk])
    return Calibration(k_amax, v_amax, len(toks))


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


FORMATS = ("modelopt", "compressed-tensors")


def write_calibrated(model_dir: str | os.PathLike, out_dir: str | os.PathLike, cal: Calibration, *,
                     per_head: bool = False, fmt: str = "modelopt", overwrite: bool = False) -> Path:
    """Copy ``model_dir`` to ``out_dir`` (weights hard-linked when possible) with
    the calibrated scales and the quantization config (see the module docs).

    ``out_dir`` must be new, an empty directory, or (``overwrite=True``) a
    previous vtinfer output whose every entry its marker lists; it may not be,
    contain or lie inside ``model_dir``. Otherwise ValueError / FileExistsError
    and nothing is written or removed (see :class:`vtinfer.models.store.atomic_dir`)."""
    import vtinfer as vt

    if fmt not in FORMATS:
        raise ValueError(f"calibrate: fmt must be one of {FORMATS}; got {fmt!r}")
    ct = per_head or fmt == "compressed-tensors"
    src = Path(model_dir)
    ck = vt.Checkpoint(src)
    cfg = copy.deepcopy(ck.config)  # as the checkpoint read it (regular, inside, bounded); not read twice
    ks, vs = cal.scales(per_head)
    tensors: dict[str, np.ndarray] = {}
    for i in range(len(ks)):
        if ct:
            # llm-compressor's shapes: [H_kv, 1, 1] per head (attn_head), [1] per tensor
            shape = (-1, 1, 1) if per_head else (1,)
            tensors[f"model.layers.{i}.self_attn.k_scale"] = np.asarray(ks[i], np.float32).reshape(shape)
            tensors[f"model.layers.{i}.self_attn.v_scale"] = np.asarray(vs[i], np.float32).reshape(shape)
        else:
            tensors[f"model.layers.{i}.self_attn.k_proj.k_scale"] = np.asarray(ks[i], np.float32).reshape(())
            tensors[f"model.layers.{i}.self_attn.v_proj.v_scale"] = np.asarray(vs[i], np.float32).reshape(())
    if ct:
        # The keys llm-compressor 0.14 writes for a kv_cache_scheme-only recipe
        # (compressed-tensors 0.19.0's QuantizationConfig / QuantizationArgs dump).
        cfg["quantization_config"] = {
            "config_groups": {}, "format": "dense", "global_compression_ratio": None, "ignore": [],
            "kv_cache_scheme": {"actorder": None, "block_structure": None, "dynamic": False, "group_size": None,
                                "num_bits": 8, "observer": None, "observer_kwargs": {}, "scale_dtype": None,
                                "strategy": "attn_head" if per_head else "tensor", "symmetric": True,
                                "type": "float", "zp_dtype": None},
            "quant_method": "compressed-tensors", "quantization_status": "compressed", "sparsity_config": {},
            "transform_config": {}, "version": "0.19.0",
            "vtinfer_calibration": {"tokens": cal.tokens, "scale": "amax / 448"},
        }
        if per_head:
            # vLLM 0.33.0's attn_head loader partitions scales over tensor-parallel
            # ranks with these two numbers (llm-compressor writes them too).
            geo = ck.geometry
            cfg["quantization_config"]["total_num_heads"] = int(geo.num_heads)
            cfg["quantization_config"]["total_num_kv_heads"] = int(geo.num_kv_heads)
    else:
        cfg["quantization_config"] = {
            "quant_method": "modelopt", "producer": {"name": "modelopt", "version": "vtinfer-calibrate"},
            "quantization": {"quant_algo": None, "kv_cache_quant_algo": "FP8"},
            "vtinfer_calibration": {"tokens": cal.tokens, "scale": "amax / 448"},
        }
    out = Path(out_dir)
    check_out(out, src)
    with atomic_dir(out, overwrite=overwrite, what="calibrate: out") as tmp:
        weight_map: dict[str, str] = {}
        from vtinfer.scales import read_safetensors_header

        # shards keep their path relative to the model directory, so index entries
        # a/w.safetensors and b/w.safetensors stay two files
        rels = [shard.relative_to(ck.path).as_posix() for shard in ck.shards]
        scales_file = SCALES_FILE
        while scales_file in rels:
            scales_file = "vtinfer-" + scales_file
        for shard, rel in zip(ck.shards, rels):
            dst = tmp / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if os.path.lexists(dst):
                raise FileExistsError(f"calibrate: shard {rel} must be written once; got it twice")
            _link_or_copy(shard, dst)
            for name in read_safetensors_header(shard):
                weight_map[name] = rel
        save_safetensors(tmp / scales_file, tensors)
        weight_map.update({n: scales_file for n in tensors})
        write_json(tmp / "model.safetensors.index.json", {"metadata": {}, "weight_map": weight_map})
        import stat

        for f in src.iterdir():  # tokenizer and other small files: regular files only, never through a link out
            st = os.lstat(f)
            if (stat.S_ISREG(st.st_mode) and f.suffix != ".safetensors" and f.name not in (
                    "config.json", "model.safetensors.index.json", "hf_quant_config.json", MARKER)
                    and not os.path.lexists(tmp / f.name)):
                shutil.copy2(f, tmp / f.name)
        write_json(tmp / "config.json", cfg)
    return out


def check_out(out: Path, src: Path) -> None:
    """Refuse an output directory that is, contains or lies inside the model
    directory (an output there could replace or remove the model's own files)."""
    o, s = out.resolve(), src.resolve()
    if o == s or s in o.parents or o in s.parents:
        raise ValueError(f"calibrate: out must lie outside the model directory and not contain it; got '{out}' "
                         f"for the model directory '{src}'")


def calibrate(model_dir: str | os.PathLike, out_dir: str | os.PathLike, *, per_head: bool = False,
              max_tokens: int = 2048, text: str | None = None, progress: bool | None = None,
              model: Any = None, fmt: str = "modelopt", overwrite: bool = False) -> tuple[Path, Calibration]:
    """Calibrate on ``text`` (default: :func:`vtinfer.models.evaltext.calibration_text`)
    and write the calibrated copy. Returns ``(out_dir, calibration)``."""
    from vtinfer.models.decoder import Decoder
    from vtinfer.models.evaltext import calibration_text

    if fmt not in FORMATS:
        raise ValueError(f"calibrate: fmt must be one of {FORMATS}; got {fmt!r}")
    # refuse a bad out before the (long) calibration run
    check_out(Path(out_dir), Path(model_dir))
    atomic_dir(out_dir, overwrite=overwrite, what="calibrate: out").check()
    m = model if model is not None else Decoder.from_pretrained(model_dir)
    if m.tokenizer is None:
        raise ValueError(f"calibrate: {model_dir} must have a tokenizer to encode the calibration text")
    toks = m.tokenizer.encode(text if text is not None else calibration_text())[:max_tokens]
    cal = calibrate_amax(m, toks, progress=progress)
    return write_calibrated(model_dir, out_dir, cal, per_head=per_head, fmt=fmt, overwrite=overwrite), cal
