"""``vtinfer inspect MODEL_DIR``: every step of the KV-cache decision for a checkpoint."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any


def inspect_checkpoint(model: str, kv_cache_dtype: str = "auto", kv_cache_memory: str | None = None,
                       num_blocks: int | None = None, block_size: int = 16, *, tensor_parallel_size: int = 1,
                       kv_cache_dtype_skip_layers: list[str] | None = None) -> dict[str, Any]:
    """The decision, the scales, what vLLM does with each scale tensor, and the
    plan (per tensor-parallel rank) as one JSON-able dict (stable keys)."""
    import vtinfer as vt
    from vtinfer.scales import load_kv_scales
    from vtinfer.sizing import scale_load_options, skipped_layers
    from vtinfer.tensor_parallel import check_tensor_parallel, rank_heads

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
    tp = tensor_parallel_size
    check_tensor_parallel(geo.num_heads, geo.num_kv_heads, tp, who="inspect")
    skip = skipped_layers(geo, kv_cache_dtype_skip_layers, "inspect")
    msgs: list[str] = []
    explain: list[dict[str, Any]] = []
    quantized = res.dtype is not None and vt.dtype_info(res.dtype).is_fp8
    opts = scale_load_options(res, geo, "inspect")
    per_rank = []
    for r in range(tp):
        sc = load_kv_scales(ck.shards, geo.num_layers, geo.num_kv_heads, quantized=quantized,
                            kv_cache_dtype=res.dtype or "auto", messages=msgs if r == 0 else None,
                            explain=explain if r == 0 else None, tensor_parallel_size=tp, rank=r,
                            unquantized_layers=skip, **opts)
        per_rank.append(sc)
    per_token_head = res.dtype is not None and vt.dtype_info(res.dtype).scale_kind == "token_head"
    in_slot = res.dtype is not None and vt.dtype_info(res.dtype).scale_kind == "slot"  # TurboQuant
    out["scales"] = {"quantized": quantized, "per_token_head": per_token_head, "in_slot": in_slot, "messages": msgs,
                     "per_head": res.per_head_scales,
                     "compressed_tensors": opts["compressed_tensors"], "layers": [
        {"layer": s.layer, "k_scale": s.k_scale, "v_scale": s.v_scale, "q_scale": s.q_scale, "origin": s.origin,
         "k_tensor": s.k_tensor, "v_tensor": s.v_tensor, "q_tensor": s.q_tensor,
         "zero_points": list(s.zero_points), "is_one": bool(s.is_one)} for s in per_rank[0]] if tp == 1 else
        [{"layer": s.layer, "origin": s.origin, "k_tensor": s.k_tensor, "v_tensor": s.v_tensor,
          "q_tensor": s.q_tensor, "zero_points": list(s.zero_points), "is_one": bool(s.is_one)} for s in per_rank[0]]}
    out["scale_tensors"] = explain
    p = None
    if res.dtype is not None:
        p = vt.plan_kv_cache(ck, kv_cache_dtype, block_size, num_blocks, kv_cache_memory, tensor_parallel_size=tp,
                             kv_cache_dtype_skip_layers=kv_cache_dtype_skip_layers)
        skipped = set(p.skipped_layers)
        out["plan"] = {"dtype": p.dtype, "block_size": p.block_size, "bytes_per_block": p.bytes_per_block,
                       "num_blocks": p.num_blocks, "tokens": p.tokens, "total_bytes": p.total_bytes,
                       "blocks_from": p.blocks_from, "warnings": list(p.warnings),
                       "tensor_parallel_size": p.tensor_parallel_size, "num_kv_heads_per_rank": p.num_kv_heads,
                       "layers": [{"layer": i, "dtype": d, "page_bytes": b, "skipped": i in skipped}
                                  for i, (d, b) in enumerate(zip(p.layer_dtypes, p.layer_page_bytes))],
                       "skipped_layers": list(p.skipped_layers), "vllm_block_size": p.vllm_block_size,
                       "skip_page_size_padded": p.skip_page_size_padded}
    else:
        out["plan"] = None
    out["ranks"] = []
    for r in range(tp):
        h = rank_heads(geo.num_heads, geo.num_kv_heads, tp, r)
        out["ranks"].append({
            "rank": r, "heads": list(h.heads), "kv_heads": list(h.kv_heads), "kv_replicas": h.kv_replicas,
            "k_scale": [s.k_scale for s in per_rank[r]], "v_scale": [s.v_scale for s in per_rank[r]],
            "q_scale": [s.q_scale for s in per_rank[r]],
            "bytes_per_block": p.bytes_per_block if p else None, "num_blocks": p.num_blocks if p else None})
    return out


def _fmt(v: Any) -> str:
    return ",".join(f"{x:.6g}" for x in v) if isinstance(v, (list, tuple)) else f"{v:.6g}"


def _runs(rows: list[dict]) -> list[tuple[int, int, dict]]:
    """(first layer, last layer, row) for each run of consecutive layers whose
    scales, origin and flags are equal."""
    out: list[tuple[int, int, dict]] = []
    key = lambda r: tuple((k, json.dumps(v, sort_keys=True)) for k, v in sorted(r.items()) if k != "layer")  # noqa: E731
    for r in rows:
        if out and key(out[-1][2]) == key(r) and out[-1][1] + 1 == r["layer"]:
            out[-1] = (out[-1][0], r["layer"], out[-1][2])
        else:
            out.append((r["layer"], r["layer"], r))
    return out


_LAYER = re.compile(r"(?<=layers\.)(0|[1-9][0-9]*)(?=\.)")


def _natural(text: str) -> tuple:
    """Sort key: digit runs compare as numbers (layers.2 before layers.10)."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text))


def _spans(nums: list[int]) -> str:
    """0,1,2,3,5,7,8 -> "0-3, 5, 7-8"."""
    out: list[str] = []
    for n in sorted(set(nums)):
        if out and n == last + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
        last = n
    return ", ".join(out)


def _fold_by_layer(entries: list[dict]) -> list[tuple[tuple, list[int]]]:
    """The scale-tensor lines with the layer number of each name as N, one line per pattern (the layers it
    covers listed as spans), in numeric order of the first layer."""
    groups: dict[tuple, list[int]] = {}
    for e in entries:
        m = _LAYER.search(e["tensor"])
        layer = int(m.group(1)) if m else None
        pat = (lambda t: _LAYER.sub("N", t, count=1)) if m else (lambda t: t)
        tgt = e["target"] or ""
        if m and tgt and _LAYER.search(tgt) and int(_LAYER.search(tgt).group(1)) != layer:
            pat = lambda t: t  # noqa: E731  (a target in another layer: keep the line as it is)
            layer = None
        why = re.sub(rf"\blayer {layer}\b", "layer N", e["why"]) if layer is not None else e["why"]
        key = (e["action"], pat(e["tensor"]), pat(tgt) if tgt else tgt, e["dtype"], str(e["shape"]), why)
        groups.setdefault(key, [])
        if layer is not None:
            groups[key].append(layer)
    return sorted(groups.items(), key=lambda kv: (min(kv[1]) if kv[1] else -1, _natural(kv[0][1])))


def cmd_inspect(args: argparse.Namespace) -> int:
    d = inspect_checkpoint(args.model, args.kv_cache_dtype, args.kv_cache_memory, args.num_blocks, args.block_size,
                           tensor_parallel_size=args.tensor_parallel_size,
                           kv_cache_dtype_skip_layers=args.kv_cache_dtype_skip_layers)
    if args.json:
        from vtinfer.cli import dumps

        print(dumps(d, indent=2, sort_keys=True))
        return 0
    q, dec = d["quant_config"], d["decision"]
    print(f"model            {d['model']}")
    print(f"quant config     {q['read'] or 'none'}  ({q['why']})")
    if q["normalized"] is not None:
        from vtinfer.cli import dumps

        print(f"  normalized     {dumps(q['normalized'], sort_keys=True)}")
    print(f"kv_cache_dtype   {dec['kv_cache_dtype']} -> vLLM {dec['vllm_cache_dtype']} -> cache {dec['cache_dtype']}"
          f" -> stored as {dec['dtype']}")
    print(f"source           {dec['source']} (declared by checkpoint: {dec['declared_by_checkpoint']})")
    print(f"rule             {dec['rule']}")
    for m in dec["messages"]:
        print(f"  log            {m}")
    s = d["scales"]
    if s.get("per_token_head"):  # vLLM's per-token-head formats: scales made at store, none loaded
        print(f"scales           per (token, KV head), computed at store into float32 planes beside the "
              f"{dec['dtype']} codes; checkpoint k_scale / v_scale unused")
    elif s.get("in_slot"):  # TurboQuant: fp16 value scale / zero and key norm inside each slot
        print(f"scales           inside each (token, KV head) slot of {dec['dtype']} (fp16 value scale and zero, "
              "fp16 key norm), computed at store; checkpoint k_scale / v_scale unused")
    else:
        print(f"scales           {'used' if s['quantized'] else 'ignored (unquantized cache)'}"
              f"{' (per KV head, compressed-tensors attn_head)' if s['per_head'] else ''}")
    if "k_scale" in (s["layers"][0] if s["layers"] else {}):
        print(f"  {'layer':>5}  {'k_scale':>12}  {'v_scale':>12}  {'q_scale':>12}  origin")
        # consecutive layers with the same scales fold into one row
        # ("0-29 ... ignored (1.0)" on an unquantized model, not 30 rows)
        for first, last, row in _runs(s["layers"]):
            flag = "  (1.0)" if row["is_one"] else ""
            span = str(first) if first == last else f"{first}-{last}"
            print(f"  {span:>5}  {_fmt(row['k_scale']):>12}  {_fmt(row['v_scale']):>12}  "
                  f"{_fmt(row['q_scale']):>12}  {row['origin']}{flag}")
    for m in s["messages"]:
        print(f"  log            {m}")
    if d["scale_tensors"]:
        print("scale tensors    what vLLM does with each *_scale / *zero_point tensor")
        for (action, tensor, target, dtype, shape, why), layers in _fold_by_layer(d["scale_tensors"]):
            to = f" -> {target}" if action == "remapped" else ""
            where = f"layers {_spans(layers)}; " if layers else ""
            print(f"  {action:<9}{tensor} {dtype}{shape}{to}  ({where}{why})")
    p = d["plan"]
    if p:
        tp = p["tensor_parallel_size"]
        fallback = p["blocks_from"] == "fallback"
        src = "fallback: give --num-blocks or --kv-cache-memory" if fallback else p["blocks_from"]
        print(f"plan             {p['num_blocks']} blocks x {p['block_size']} tokens = {p['tokens']} tokens; "
              f"{p['bytes_per_block']} B/block, {p['total_bytes']} B ({src})"
              f"{f' per GPU, each of {tp} ranks' if tp > 1 else ''}")
        if p["skipped_layers"]:
            pages = ", ".join(f"{x['layer']}:{x['dtype']}:{x['page_bytes']}B" for x in p["layers"])
            print(f"  skip layers    {p['skipped_layers']} keep the model dtype; pages {pages}")
            print(f"  vLLM aligns    block_size {p['vllm_block_size']}, skip_page_size_padded "
                  f"{p['skip_page_size_padded']}")
        for w in p["warnings"]:
            if fallback and w.startswith("neither num_blocks nor kv_cache_memory"):
                continue  # said on the plan line
            print(f"  warning        {w}")
    if len(d["ranks"]) > 1:
        print(f"tensor parallel  {len(d['ranks'])} ranks (vLLM: query heads split; KV heads split, or replicated "
              f"when fewer than ranks)")
        print(f"  {'rank':>4}  {'heads':<12} {'kv heads':<9} {'B/block':>8} {'blocks':>7}  k_scale / v_scale / "
              f"q_scale (layer 0)")
        for r in d["ranks"]:
            hs = f"{r['heads'][0]}-{r['heads'][-1]}"
            rep = f" x{r['kv_replicas']}" if r["kv_replicas"] > 1 else ""
            kv = ",".join(map(str, r["kv_heads"])) + rep
            sc = f"{_fmt(r['k_scale'][0])} / {_fmt(r['v_scale'][0])} / {_fmt(r['q_scale'][0])}" if r["k_scale"] else ""
            print(f"  {r['rank']:>4}  {hs:<12} {kv:<9} {r['bytes_per_block'] or '-':>8} {r['num_blocks'] or '-':>7}  {sc}")
    return 0


def add_parser(sub: Any) -> None:
    from vtinfer.cli import int_option, remember_options

    ins = sub.add_parser("inspect", help="show how vLLM would choose the KV-cache dtype for a checkpoint, its "
                                         "scales and the cache plan")
    ins.add_argument("model", metavar="MODEL_DIR")
    ins.add_argument("--kv-cache-dtype", default="auto")
    ins.add_argument("--kv-cache-memory", default=None, help="e.g. 8GiB")
    ins.add_argument("--num-blocks", type=int_option(1), default=None)
    ins.add_argument("--block-size", type=int_option(1), default=16)
    ins.add_argument("--tensor-parallel-size", type=int_option(1), default=1,
                     help="show each rank's heads, scale slices and plan as vLLM shards them")
    ins.add_argument("--kv-cache-dtype-skip-layers", nargs="+", default=None, metavar="LAYER",
                     help="layers kept at the model dtype: indices such as 0, or sliding_window (vLLM 0.33)")
    ins.add_argument("--json", action="store_true", help="print one stable JSON object")
    ins.set_defaults(func=cmd_inspect)
    remember_options(ins)
