"""Red-first evidence for tests/model: plant each defect, run the named tests, restore.

    python tests/model/run_mutants.py            # all (~45 s)
    ONLY="rope" python tests/model/run_mutants.py

Each defect must turn its tests red; the file is restored in a finally block.
"""
import subprocess, sys, pathlib
R = pathlib.Path(__file__).resolve().parents[2]
M_ALL = [
 ("rope sign", "vtinfer/models/decoder.py", "rot = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)", "rot = np.concatenate([x[..., h:], -x[..., :h]], axis=-1)", "tests/model/test_decoder.py"),
 ("K/V descale swapped", "vtinfer/models/decoder.py", "self._descale.append((ks if ks.ndim == 0 else ks[i], vs if vs.ndim == 0 else vs[i]))", "self._descale.append((vs if vs.ndim == 0 else vs[i], ks if ks.ndim == 0 else ks[i]))", "tests/model/test_decoder.py"),
 ("sliding window dropped", "vtinfer/models/decoder.py", "self._window = (w - 1, 0) if w else (-1, -1)", "self._window = (-1, -1)", "tests/model/test_decoder.py"),
 ("qk-norm skipped", "vtinfer/models/decoder.py", "if L.q_norm is not None:", "if False:", "tests/model/test_decoder.py"),
 ("GGUF K rows not unpermuted", "vtinfer/models/gguf_convert.py", 'elif arch in _PERMUTED and t.name.endswith(("attn_k.weight", "attn_k.bias")):', 'elif False:', "tests/model/test_gguf.py"),
 ("digits not split", "vtinfer/models/gguf_convert.py", 'if pre in ("smollm", "starcoder", "refact", "codeshell"):', 'if False:', "tests/model/test_gguf.py"),
 ("per-layer scale from mean amax", "vtinfer/models/calibrate.py", "(self.k_amax.max(1), self.v_amax.max(1))", "(self.k_amax.mean(1), self.v_amax.max(1))", "tests/model/test_calibrate.py"),
 ("K/V scale tensors swapped on write", "vtinfer/models/calibrate.py", 'tensors[f"model.layers.{i}.self_attn.k_proj.k_scale"] = np.asarray(ks[i]', 'tensors[f"model.layers.{i}.self_attn.k_proj.k_scale"] = np.asarray(vs[i]', "tests/model/test_calibrate.py"),
 ("amax taken before RoPE", "vtinfer/models/decoder.py", "            q, k = m.rope(q, pos), m.rope(k, pos)\n            if self.observer is not None:\n                self.observer(i, k, v)", "            if self.observer is not None:\n                self.observer(i, k, v)\n            q, k = m.rope(q, pos), m.rope(k, pos)", "tests/model/test_calibrate.py"),
 ("batch positions restart at 0 each chunk", "vtinfer/models/decoder.py", "pos.append(np.arange(start, start + len(a)))", "pos.append(np.arange(0, len(a)))", "tests/model/test_decoder.py"),
 ("batch block table of the first sequence for all", "vtinfer/models/decoder.py", "table = self.alloc.block_table(seqs)", "table = self.alloc.block_table(seqs[:1] * len(seqs))", "tests/model/test_decoder.py"),
 ("batched decode feeds the first generated token again", "vtinfer/models/decoder.py", "forward_batch([(p.sid, [p.out[-1]]) for p in live])", "forward_batch([(p.sid, [p.out[0]]) for p in live])", "tests/model/test_decoder.py"),
 ("KV bytes per token off", "vtinfer/models/demo.py", "dtype=dtype).page_bytes // 16", "dtype=dtype).page_bytes // 8", "tests/model/test_demo.py"),
]
import os
M = [m for m in M_ALL if os.environ.get("ONLY", "") in m[0]]
for name, f, old, new, tests in M:
    p = R / f
    src = p.read_text()
    assert src.count(old) == 1, (name, src.count(old))
    p.write_text(src.replace(old, new))
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", tests, "-q", "-m", "not slow", "-p", "no:cacheprovider"], cwd=R, capture_output=True, text=True)
        failed = [l.split(" ")[1] for l in r.stdout.splitlines() if l.startswith("FAILED")]
        summary = r.stdout.strip().splitlines()[-1]
        print(f"{name}: {'RED' if r.returncode else 'GREEN (!)'} -- {summary}; e.g. {failed[:3]}", flush=True)
    finally:
        p.write_text(src)
