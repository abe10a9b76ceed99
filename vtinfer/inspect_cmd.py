"""``vtinfer inspect MODEL_DIR``: every step of the KV-cache decision for a checkpoint."""

from __future__ import annotations

import argparse
import json
from typing import Any


def inspect_checkpoint(model: str, kv_cache_dtype: str = "auto", kv_cache_memory: str | None = None,
                       num_blocks: int | None = None, block_size: int = 16) -> dict[str, Any]:
    """The decision, the scales and the plan as one JSON-able dict (stable keys)."""
    import vtinfer as vt
    from vtinfer.scales import load_kv_scales

    ck = vt.Checkpoint(model)
    read, why = ck.quant_config_route()
    res = vt.resolve_kv_cache_dtype(kv_cache_dtype, ck)
    geo = ck.geometry
    out: dict[str, Any] = {
        "model": str(ck.path),
        "files": {"config.json": str(ck.config_path),
                  "hf_quant_config.json": str(ck.hf_quant_config_path) if ck.hf_quant_config_path else None,
                  "shards": [str(s) for s in ck.shards]},
        "quant_config": {"read": read, "why": why, "normalized": res.quant_config},
        "decision": {"kv_cache_dtype": kv_cache_dtype, "vllm_cache_dtype": res.vllm_cache_dtype,
                     "cache_dtype": res.cache_dtype, "dtype": res.dtype, "source": res.source,
                     "declared_by_checkpoint": res.declared_by_checkpoint, "rule": res.rule,
                     "per_head_scales": res.per_head_scales, "messages": list(res.messages)},
        "geometry": {"num_layers": geo.num_layers, "num_heads": geo.num_heads, "num_kv_heads": geo.num_kv_heads,
                     "head_dim": geo.head_dim, "dtype": geo.dtype, "sliding_window": geo.sliding_window},
    }
    msgs: list[str] = []
    quantized = res.dtype is not None and vt.dtype_info(res.dtype).is_fp8
    scales = load_kv_scales(ck.shards, geo.num_layers, geo.num_kv_heads, quantized=quantized,
                            per_head=res.per_head_scales, kv_cache_dtype=res.dtype or "auto", messages=msgs)
    out["scales"] = {"quantized": quantized, "messages": msgs, "layers": [
        {"layer": s.layer, "k_scale": s.k_scale, "v_scale": s.v_scale, "origin": s.origin,
         "k_tensor": s.k_tensor, "v_tensor": s.v_tensor, "is_one": bool(s.is_one)} for s in scales]}
    if res.dtype is not None:
        p = vt.plan_kv_cache(ck, kv_cache_dtype, block_size, num_blocks, kv_cache_memory)
        out["plan"] = {"dtype": p.dtype, "block_size": p.block_size, "bytes_per_block": p.bytes_per_block,
                       "num_blocks": p.num_blocks, "tokens": p.tokens, "total_bytes": p.total_bytes,
                       "blocks_from": p.blocks_from, "warnings": list(p.warnings)}
    else:
        out["plan"] = None
    return out


def cmd_inspect(args: argparse.Namespace) -> int:
    d = inspect_checkpoint(args.model, args.kv_cache_dtype, args.kv_cache_memory, args.num_blocks, args.block_size)
    if args.json:
        print(json.dumps(d, indent=2, sort_keys=True))
        return 0
    q, dec = d["quant_config"], d["decision"]
    print(f"model            {d['model']}")
    print(f"quant config     {q['read'] or 'none'}  ({q['why']})")
    if q["normalized"] is not None:
        print(f"  normalized     {json.dumps(q['normalized'], sort_keys=True)}")
    print(f"kv_cache_dtype   {dec['kv_cache_dtype']} -> vLLM {dec['vllm_cache_dtype']} -> cache {dec['cache_dtype']}"
          f" -> stored as {dec['dtype']}")
    print(f"source           {dec['source']} (declared by checkpoint: {dec['declared_by_checkpoint']})")
    print(f"rule             {dec['rule']}")
    for m in dec["messages"]:
        print(f"  log            {m}")
    s = d["scales"]
    print(f"scales           {'used' if s['quantized'] else 'ignored (unquantized cache)'}")
    print(f"  {'layer':>5}  {'k_scale':>12}  {'v_scale':>12}  origin")
    for row in s["layers"]:
        flag = "  (1.0)" if row["is_one"] else ""
        fmt = lambda v: ",".join(f"{x:.6g}" for x in v) if isinstance(v, (list, tuple)) else f"{v:.6g}"
        print(f"  {row['layer']:>5}  {fmt(row['k_scale']):>12}  {fmt(row['v_scale']):>12}  {row['origin']}{flag}")
    for m in s["messages"]:
        print(f"  log            {m}")
    p = d["plan"]
    if p:
        print(f"plan             {p['num_blocks']} blocks x {p['block_size']} tokens = {p['tokens']} tokens; "
              f"{p['bytes_per_block']} B/block, {p['total_bytes']} B ({p['blocks_from']})")
        for w in p["warnings"]:
            print(f"  warning        {w}")
    return 0


def add_parser(sub: Any) -> None:
    ins = sub.add_parser("inspect", help="show how vLLM would choose the KV-cache dtype for a checkpoint, its "
                                         "scales and the cache plan")
    ins.add_argument("model", metavar="MODEL_DIR")
    ins.add_argument("--kv-cache-dtype", default="auto")
    ins.add_argument("--kv-cache-memory", default=None, help="e.g. 8GiB")
    ins.add_argument("--num-blocks", type=int, default=None)
    ins.add_argument("--block-size", type=int, default=16)
    ins.add_argument("--json", action="store_true", help="print one stable JSON object")
    ins.set_defaults(func=cmd_inspect)
