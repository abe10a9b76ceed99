#!/usr/bin/env python3
"""TurboQuant KV accuracy on the demo's model and text: top-1 agreement, mean KL and the
perplexity ratio of each turboquant_* preset (vLLM's boundary layers kept, and all layers quantized)
against the float32-KV run, teacher-forced in 256-token chunks as `vtinfer demo` scores.

    python scripts/tq_accuracy.py [--tokens 512] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import vtinfer as vt
from vtinfer.models.decoder import Decoder
from vtinfer.models.evaltext import eval_text
from vtinfer.models.gguf_convert import default_model_dir
from vtinfer.models.metrics import compare, perplexity_noise, token_nll


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--out")
    a = ap.parse_args()
    mdir = default_model_dir(convert=False)
    if mdir is None:
        raise SystemExit("the demo's model is not converted: run `vtinfer demo` once")
    model = Decoder.from_pretrained(mdir)
    model.blas_threads = 1
    toks = np.asarray(model.tokenizer.encode(eval_text())[: a.tokens], dtype=np.int64)
    ref = model.score(toks, "float32")
    ref_nll = token_nll(ref, toks)
    rows = []
    for fmt in vt.TURBOQUANT_DTYPES:
        for boundary in (True, False):
            t0 = time.perf_counter()
            logits = model.score(toks, fmt, turboquant_boundary=boundary)
            dt = time.perf_counter() - t0
            plan = vt.plan_kv_cache(mdir, fmt, 16, num_blocks=1) if boundary else None
            row = {"kv_cache_dtype": fmt, "boundary_layers_kept": boundary, **compare(ref, logits),
                   **perplexity_noise(token_nll(logits, toks), ref_nll), "score_s": dt,
                   "kv_bytes_per_token": plan.bytes_per_block // 16 if plan else
                   model.config.num_layers * model.config.num_kv_heads
                   * vt.turboquant_slot_bytes(fmt, model.config.head_dim)}
            rows.append(row)
            print(f"{fmt:20s} boundary={boundary!s:5s} top1 {row['top1_agreement']:.3f} mean KL "
                  f"{row['mean_kl']:.2e} ppl x{row['ppl_ratio']:.4f} +- {row['ppl_ratio_se']:.4f} "
                  f"bytes/token {row['kv_bytes_per_token']} ({dt:.0f} s)", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"model": str(mdir), "tokens": len(toks), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
