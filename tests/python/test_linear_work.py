"""Loops over counts a file controls are linear: the work done per entry of
an index's weight_map, per tensor of a safetensors header and per layer of
a config does not grow with the number of entries. Each test counts the
work (calls, membership scans) on a large generated input; the 300,000-entry
index also runs ``vtinfer inspect`` in a child with a generous timeout (it
did not finish in 90 s when every entry was resolved on disk). Tests never
assert timings tightly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import vtinfer as vt
from vtinfer.scales import load_kv_scales, write_safetensors

CFG = {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
       "hidden_size": 64, "torch_dtype": "float16"}
SHARD = "model-00001-of-00001.safetensors"


def _big_index(d: Path, n: int) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(CFG))
    write_safetensors(d / SHARD, {"model.embed_tokens.weight": np.ones((2, 2), np.float32)})
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {f"model.layers.{i % 2}.w{i}.weight": SHARD for i in range(n)}}))
    return d


class CountingList(list):
    """A list that counts the scans ``in`` makes of it."""

    scans = 0

    def __contains__(self, x: object) -> bool:
        type(self).scans += 1
        return super().__contains__(x)


def test_a_weight_map_resolves_each_distinct_shard_once(tmp_path, monkeypatch):
    import vtinfer.checkpoint as ck

    calls = []
    real = ck.index_member
    monkeypatch.setattr(ck, "index_member", lambda *a: calls.append(a[1]) or real(*a))
    c = vt.Checkpoint(_big_index(tmp_path / "m", 50_000))
    assert [p.name for p in c.shards] == [SHARD]
    assert calls == [SHARD], f"{len(calls)} resolutions for 50,000 entries naming one shard"


def test_inspect_finishes_an_index_of_300000_entries(tmp_path):
    d = _big_index(tmp_path / "m", 300_000)
    p = subprocess.run([sys.executable, "-m", "vtinfer", "inspect", str(d), "--json"], capture_output=True, text=True,
                       timeout=90, env={**os.environ, "VTINFER_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout)["files"]["shards"] == [str(d / SHARD)]


def test_the_scale_log_is_not_scanned_per_tensor(tmp_path):
    """20,000 deprecated .kv_scale tensors that name no parameter: vLLM's once-only deprecation line is looked
    up in O(1), not by scanning the growing log for every tensor."""
    n = 20_000
    write_safetensors(tmp_path / "s.safetensors",
                      {f"model.layers.{i}.self_attn.w{i}.kv_scale": np.ones((), np.float32) for i in range(n)})
    log = CountingList()
    CountingList.scans = 0
    load_kv_scales([tmp_path / "s.safetensors"], 2, 2, quantized=True, messages=log)
    assert log.count(vt.scales.KV_SCALE_DEPRECATED) == 1 and len(log) == n + 1
    assert CountingList.scans <= 2, f"the log was scanned {CountingList.scans} times for {n} tensors"


def test_skip_layers_naming_every_layer_are_looked_up_in_a_set():
    """kv_cache_dtype_skip_layers listing all 65,536 layers (the geometry bound): one conversion to a set,
    no scan of the list per layer."""
    L = 65536
    geo = vt.ModelGeometry.from_dict({**CFG, "num_hidden_layers": L, "sliding_window": None}, "config.json")
    skip = CountingList(str(i) for i in range(L))
    CountingList.scans = 0
    plan = vt.plan_kv_cache(geo, "fp8", 16, num_blocks=4, kv_cache_dtype_skip_layers=skip)
    assert len(plan.skipped_layers) == L and set(plan.layer_dtypes) == {"float16"}
    assert CountingList.scans <= 2, f"the skip list was scanned {CountingList.scans} times for {L} layers"
