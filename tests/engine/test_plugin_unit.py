"""vtinfer's vLLM plugin at unit level: activation, the page vLLM allocates, and the backend's store and
attention on vLLM-shaped tensors against a float64 reference.

Needs vLLM's CPU build (``pip install 'vtinfer[vllm]'``); without it every test that imports vLLM skips
with the reason "vllm not installed", unless ``VTINFER_REQUIRE_VLLM=1`` (CI), where that is an error.
The activation tests run ``register()`` in a child process: it changes vLLM's process-wide backend
registry, and vLLM loads plugins once per process.
"""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
import types
import warnings

import pytest

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
REQUIRE = os.environ.get("VTINFER_REQUIRE_VLLM") == "1"
BACKEND_PATH = "vtinfer.vllm.backend.VtinferAttentionBackend"
CPU_ATTN_PATH = "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend"


@pytest.fixture(scope="module")
def vllm_installed():
    if not HAVE_VLLM:
        if REQUIRE:
            pytest.fail("VTINFER_REQUIRE_VLLM=1 but vllm is not installed")
        pytest.skip("vllm not installed")
    # vLLM's import chain warns (torch.jit deprecations, Triton without a CPU backend); the
    # project's filterwarnings=error is for vtinfer's code, so vLLM is imported once with them off.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import vllm.v1.attention.backends.triton_attn  # noqa: F401
        import vllm.v1.attention.backends.turboquant_attn  # noqa: F401
        import vtinfer.vllm.backend  # noqa: F401
        import vtinfer.vllm.impl  # noqa: F401


def _child(code: str, env_vtinfer: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "VTINFER_VLLM"}
    if env_vtinfer is not None:
        env["VTINFER_VLLM"] = env_vtinfer
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_import_vtinfer_never_imports_vllm():
    r = _child("import sys, vtinfer, vtinfer.vllm; print('vllm' in sys.modules, 'torch' in sys.modules)", "1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False"]


# One child walks the variable through its values (register() reads it on every call), with a
# handler on vLLM's "vllm" logger, whose handlers and format vLLM configures in its processes.
_REGISTER = """
import logging, os
lines = []
class H(logging.Handler):
    def emit(self, r):
        lines.append(r.levelname + " " + r.getMessage())
logging.getLogger("vllm").addHandler(H())
logging.getLogger("vllm").setLevel(logging.INFO)
from vllm.v1.attention.backends.registry import AttentionBackendEnum as E
import vtinfer.vllm
def state(tag):
    print("STATE", tag, E.CPU_ATTN.get_path(), E.CPU_ATTN.is_overridden(), len(lines))
state("before")
for value in (None, "", "0"):
    os.environ.pop("VTINFER_VLLM", None)
    if value is not None:
        os.environ["VTINFER_VLLM"] = value
    vtinfer.vllm.register()
    state(repr(value))
os.environ["VTINFER_VLLM"] = "yes"
try:
    vtinfer.vllm.register()
except ValueError as e:
    print("REFUSED", e)
state("'yes'")
os.environ["VTINFER_VLLM"] = "1"
vtinfer.vllm.register()
vtinfer.vllm.register()  # vLLM may load plugins more than once per process
state("1")
print("LOG", lines)
"""


def test_register_only_with_env_and_logs_once(vllm_installed):
    import vtinfer

    r = _child(_REGISTER, None)
    assert r.returncode == 0, r.stderr
    states = {x.split()[1]: x.split()[2:] for x in r.stdout.splitlines() if x.startswith("STATE")}
    for tag in ("before", "None", "''", "'0'", "'yes'"):
        assert states[tag] == [CPU_ATTN_PATH, "False", "0"], (tag, r.stdout)
    assert "REFUSED vtinfer: VTINFER_VLLM must be 1" in r.stdout and "'yes'" in r.stdout
    assert states["1"] == [BACKEND_PATH, "True", "1"], r.stdout
    info = vtinfer.build_info()
    log = [x for x in r.stdout.splitlines() if x.startswith("LOG")][0]
    assert f"INFO vtinfer {info['version']} attention active" in log and f"ISA {info['isa']}" in log


# ---------------------------------------------------------------------------------------------------
# The page: equal to the one vLLM's own backends ask for (Triton for plain / fp8 / per-token-head,
# TurboQuant for turboquant_*), read from the installed vLLM.

def _formats():
    if not HAVE_VLLM:
        return ["auto"]
    from vtinfer.vllm import layout

    return layout.supported_kv_cache_dtypes()


def _spec(kv: str, head_size: int, model_dtype=None):
    import torch
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
    from vllm.v1.kv_cache_interface import FullAttentionSpec, get_kv_quant_mode

    dtype = (model_dtype or torch.bfloat16) if kv == "auto" else STR_DTYPE_TO_TORCH_DTYPE[kv]
    return FullAttentionSpec(block_size=32, num_kv_heads=3, head_size=head_size, dtype=dtype,
                             kv_quant_mode=get_kv_quant_mode(kv))


@pytest.mark.parametrize("head_size", [64, 128])
@pytest.mark.parametrize("kv", _formats())
def test_page_equals_vllms_own_backend(vllm_installed, kv, head_size):
    import dataclasses

    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend
    from vllm.v1.attention.backends.turboquant_attn import TurboQuantAttentionBackend
    from vllm.v1.kv_cache_interface import compute_layer_kv_cache_shape_bytes

    from vtinfer.vllm.backend import VtinferAttentionBackend

    spec = _spec(kv, head_size)
    ours = VtinferAttentionBackend.customize_spec(spec)
    if kv.startswith("nvfp4"):
        # vLLM's NVFP4 page (FlashInfer's [num_blocks, 2 * H_kv, block_size, full_dim] uint8): 2 * full_dim bytes
        # per (KV head, token), full_dim from vLLM's own nvfp4_kv_cache_full_dim
        from vllm.utils.torch_utils import nvfp4_kv_cache_full_dim

        theirs = dataclasses.replace(spec, state_content_bytes=2 * nvfp4_kv_cache_full_dim(head_size))
    elif kv == "ultraquant_4bit":
        # UltraQuantAttentionBackend.customize_spec (its module needs a GPU Triton to import):
        # replace(spec, state_content_bytes=slot_size(head_size)) with ultraquant.format's slot_size
        from vllm.v1.attention.ops.ultraquant.format import slot_size

        theirs = dataclasses.replace(spec, state_content_bytes=slot_size(head_size))
    else:
        theirs_cls = TurboQuantAttentionBackend if kv.startswith("turboquant_") else TritonAttentionBackend
        theirs = theirs_cls.customize_spec(spec)
    assert ours.page_size_bytes == theirs.page_size_bytes
    assert compute_layer_kv_cache_shape_bytes(ours, 7) == compute_layer_kv_cache_shape_bytes(theirs, 7)
    assert kv in VtinferAttentionBackend.supported_kv_cache_dtypes


def test_refused_dtypes_name_vtinfer(vllm_installed):
    import vtinfer as vt
    from vtinfer.vllm import layout
    from vtinfer.vllm.impl import VtinferAttentionImpl

    for kv in ("fp8_ds_mla", "fp8_inc"):
        with pytest.raises(NotImplementedError, match="vtinfer attention backend: kv_cache_dtype must be one of") as e:
            VtinferAttentionImpl(4, 64, 0.125, 2, None, None, kv)
        assert vt.KV_CACHE_DTYPES_NOT_STORED[kv] in str(e.value)  # what the format is, vLLM's CPU error
        assert kv not in layout.supported_kv_cache_dtypes()
    with pytest.raises(NotImplementedError, match="vtinfer attention backend: attention type must be decoder"):
        VtinferAttentionImpl(4, 64, 0.125, 2, None, None, "auto", attn_type="encoder_only")


# ---------------------------------------------------------------------------------------------------
# Store and attention through the backend on a cache laid out as vLLM lays it out (logical
# [num_blocks, H_kv, block_size, C], physically token-major LBNHC), read back through vLLM's own
# Triton views, and attention against a float64 reference.

NUM_BLOCKS, BLOCK, H, H_KV, D = 24, 16, 4, 2, 64


def _vllm_cache(kv: str, model_dtype):
    """A layer cache as vLLM's create_kv_cache_views makes it for LBNHC (filled with junk bytes)."""
    import torch

    from vtinfer.vllm.backend import VtinferAttentionBackend

    spec = VtinferAttentionBackend.customize_spec(_spec(kv, D, model_dtype))
    c_bytes = spec.state_content_size_bytes
    raw = torch.randint(0, 256, (NUM_BLOCKS * BLOCK * H_KV * c_bytes,), dtype=torch.uint8,
                        generator=torch.Generator().manual_seed(7))
    phys = raw.view(NUM_BLOCKS, BLOCK, H_KV, c_bytes).view(torch.int8)
    return phys.permute(0, 2, 1, 3).view(spec.dtype)  # logical [B, H_kv, N, C]


def _triton_views(kv: str, cache):
    """K, V (as float codes) and scale caches through vLLM's TritonAttentionImpl's own view code."""
    import torch
    from vllm.v1.attention.backends.triton_attn import TritonAttentionImpl
    from vllm.v1.kv_cache_interface import get_kv_quant_mode

    ns = types.SimpleNamespace(_kv_quant_mode=get_kv_quant_mode(kv), fp8_dtype=torch.float8_e4m3fn,
                               _k_scale_cache=None, _v_scale_cache=None)
    if ns._kv_quant_mode.is_per_token_head:
        ns._ensure_scale_caches = types.MethodType(TritonAttentionImpl._ensure_scale_caches, ns)
        before = cache.clone()
        k, v = TritonAttentionImpl._pth_key_value_caches(ns, cache)  # fills the scale pads with 1.0 ...
        cache.copy_(before)  # ... so the stored bytes are put back under vLLM's views
        return k, v, ns._k_scale_cache, ns._v_scale_cache
    k, v = cache.transpose(1, 2).split(D, dim=-1)
    if kv.startswith("fp8"):
        f8 = torch.float8_e5m2 if kv == "fp8_e5m2" else torch.float8_e4m3fn
        k, v = k.view(f8), v.view(f8)
    return k, v, None, None


def _quantize_reference(kv: str, x, scale: float):
    """What vLLM's store keeps of float32 rows x [T, H_kv, D], dequantized (float64): the rules of
    vLLM's CUDA / Triton stores, written independently in torch."""
    import torch

    x = x.float()
    if kv.startswith("nvfp4"):  # the NumPy twin of vLLM's SM100 store kernel (tests/numerics/nvfp4_twin.py)
        from tests.numerics import nvfp4_twin

        codes, sf = nvfp4_twin.quantize(x.numpy(), scale, kv.endswith("4over6"))
        return torch.from_numpy(nvfp4_twin.dequantize(codes, sf, scale)).double()
    if kv in ("auto", "bfloat16", "float16"):
        return x.to(getattr(torch, kv) if kv != "auto" else x.dtype).double()
    if kv in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        dt, mx = (torch.float8_e5m2, 57344.0) if kv == "fp8_e5m2" else (torch.float8_e4m3fn, 448.0)
        return (x / scale).clamp(-mx, mx).to(dt).double() * scale
    qmax = 127.0 if kv == "int8_per_token_head" else 448.0
    s = torch.clamp(x.abs().amax(-1, keepdim=True) / qmax, min=1e-6)
    q = x * (1.0 / s)
    if kv == "int8_per_token_head":
        q = torch.where(q >= 0, q + 0.5, q - 0.5).clamp(-128, 127).trunc()
    else:
        q = q.clamp(-448, 448).to(torch.float8_e4m3fn).float()
    return q.double() * s.double()


def _ref_attention(q, ks, vs, q_lens, k_lens, scale, window, softcap, sinks, alibi):
    """float64 attention of each sequence over its own dequantized K/V rows, bottom-right causal."""
    import torch

    outs, q0 = [], 0
    for b, (ql, kl) in enumerate(zip(q_lens, k_lens)):
        qb = q[q0:q0 + ql].double()  # [ql, H, D]
        kb, vb = ks[b][:kl], vs[b][:kl]  # [kl, H_kv, D]
        g = H // H_KV
        kb, vb = kb.repeat_interleave(g, 1), vb.repeat_interleave(g, 1)
        s = torch.einsum("qhd,khd->hqk", qb, kb) * scale
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        pos = torch.arange(kl - ql, kl)[:, None]
        key = torch.arange(kl)[None, :]
        if alibi is not None:
            s = s + alibi.double()[:, None, None] * (key - pos)[None]
        mask = key > pos
        if window:
            mask = mask | (key < pos - window + 1)
        s = s.masked_fill(mask[None], float("-inf"))
        if sinks is not None:
            s = torch.cat([s, sinks.double()[:, None, None].expand(-1, ql, 1)], -1)
        p = torch.softmax(s, -1)[..., :kl]
        outs.append(torch.einsum("hqk,khd->qhd", p, vb))
        q0 += ql
    return torch.cat(outs)


CASES = {
    # id: (kv cache dtype, model dtype name, window, softcap, sinks, alibi, k scale; v scale = 2 k scale)
    "auto-bf16": ("auto", "bfloat16", None, 0.0, False, False, 1.0),
    "auto-f32": ("auto", "float32", None, 0.0, False, False, 1.0),
    "auto-window": ("auto", "bfloat16", 12, 0.0, False, False, 1.0),
    "auto-softcap": ("auto", "bfloat16", None, 20.0, False, False, 1.0),
    "auto-sinks": ("auto", "bfloat16", None, 0.0, True, False, 1.0),
    "auto-alibi": ("auto", "bfloat16", None, 0.0, False, True, 1.0),
    "f16kv-bf16": ("float16", "bfloat16", None, 0.0, False, False, 1.0),
    "bf16kv-f32": ("bfloat16", "float32", None, 0.0, False, False, 1.0),
    "fp8e4m3-scaled": ("fp8_e4m3", "bfloat16", None, 0.0, False, False, 0.05),
    "fp8e5m2-scaled": ("fp8_e5m2", "bfloat16", None, 0.0, False, False, 0.5),
    "int8pth-bf16": ("int8_per_token_head", "bfloat16", None, 0.0, False, False, 1.0),
    "fp8pth-window": ("fp8_per_token_head", "bfloat16", 12, 0.0, False, False, 1.0),
    "int8pth-f32": ("int8_per_token_head", "float32", None, 0.0, False, False, 1.0),
    "tqk8v4-bf16": ("turboquant_k8v4", "bfloat16", None, 0.0, False, False, 1.0),
    "tq4bitnc-window": ("turboquant_4bit_nc", "bfloat16", 12, 0.0, False, False, 1.0),
    "nvfp4-scaled": ("nvfp4", "bfloat16", None, 0.0, False, False, 0.02),
    "nvfp4-4over6-f32": ("nvfp4_4over6", "float32", 12, 0.0, False, False, 1.0),
}
# TurboQuant's store keeps no rule this file models independently (rotation, Lloyd-Max codebook): its
# cases check the plumbing (one slot cache for K and V, vLLM's slot page) against attention over the
# unquantized rows: mean error / mean magnitude under about twice what the presets give (wrong
# plumbing gives ~1), not bit rules.
TQ_OUTPUT_REL = {"turboquant_k8v4": 0.2, "turboquant_4bit_nc": 0.2}  # measured 0.094 / 0.116


@pytest.mark.parametrize("kv,mdt,window,softcap,sinks,alibi,kvscale", list(CASES.values()), ids=list(CASES))
def test_store_and_attention_match_reference(vllm_installed, kv, mdt, window, softcap, sinks, alibi, kvscale):
    import torch

    from vtinfer.vllm.backend import VtinferAttentionMetadata
    from vtinfer.vllm.impl import VtinferAttentionImpl

    model_dtype = getattr(torch, mdt)
    g = torch.Generator().manual_seed(3)
    # A mixed batch as vLLM's scheduler sends it: a decode with a long context, a chunked prefill's
    # second chunk, and a fresh prefill; blocks scattered.
    ctx, q_lens = [40, 21, 0], [1, 9, 13]
    k_lens = [c + q for c, q in zip(ctx, q_lens)]
    perm = torch.randperm(NUM_BLOCKS, generator=g).to(torch.int32)
    blocks_per = [math.ceil(k / BLOCK) for k in k_lens]
    bt = torch.zeros(3, max(blocks_per) + 1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(blocks_per):
        bt[b, :n] = perm[used:used + n]
        used += n
    cache = _vllm_cache(kv, model_dtype)
    scale = 1.0 / math.sqrt(D)
    sink_t = torch.randn(H, generator=g) if sinks else None
    slopes = [2.0 ** -(i + 1) for i in range(H)] if alibi else None
    impl = VtinferAttentionImpl(H, D, scale, H_KV, slopes, window, kv, logits_soft_cap=softcap or None,
                                sinks=sink_t)
    layer = types.SimpleNamespace(_k_scale=torch.tensor(kvscale), _v_scale=torch.tensor(kvscale * 2),
                                  _k_scale_float=kvscale, _v_scale_float=kvscale * 2)
    keys = [torch.randn(k, H_KV, D, generator=g).to(model_dtype) for k in k_lens]
    vals = [torch.randn(k, H_KV, D, generator=g).to(model_dtype) for k in k_lens]

    def slots(b, lo, hi):
        pos = torch.arange(lo, hi)
        return (bt[b, pos // BLOCK].long() * BLOCK + pos % BLOCK)

    # Step 1: the contexts were stored by earlier steps (one store call, as vLLM's earlier steps).
    if sum(ctx):
        impl.do_kv_cache_update(layer, torch.cat([keys[b][:ctx[b]] for b in range(3)]),
                                torch.cat([vals[b][:ctx[b]] for b in range(3)]), cache,
                                torch.cat([slots(b, 0, ctx[b]) for b in range(3)]))
    # Step 2: this step's tokens, stored then attended; the key/value inputs are strided views of a
    # fused QKV tensor, as vLLM's model gives them, and the slot list ends with a padding slot (-1).
    new_k = torch.cat([keys[b][ctx[b]:] for b in range(3)])
    new_v = torch.cat([vals[b][ctx[b]:] for b in range(3)])
    total = new_k.shape[0]
    qkv = torch.randn(total + 1, (H + 2 * H_KV) * D, generator=g).to(model_dtype)
    qkv[:total, H * D:(H + H_KV) * D] = new_k.reshape(total, -1)
    qkv[:total, (H + H_KV) * D:] = new_v.reshape(total, -1)
    q = qkv[:, :H * D].view(-1, H, D)
    k_in = qkv[:, H * D:(H + H_KV) * D].view(-1, H_KV, D)
    v_in = qkv[:, (H + H_KV) * D:].view(-1, H_KV, D)
    sm = torch.cat([torch.cat([slots(b, ctx[b], k_lens[b]) for b in range(3)]), torch.tensor([-1])])
    impl.do_kv_cache_update(layer, k_in, v_in, cache, sm)
    md = VtinferAttentionMetadata(
        num_actual_tokens=total, max_query_len=max(q_lens), max_seq_len=max(k_lens),
        query_start_loc=torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32),
        seq_lens=torch.tensor(k_lens, dtype=torch.int32), block_table=bt, slot_mapping=sm)
    out = torch.full((total + 1, H, D), 7.0, dtype=model_dtype)
    impl.forward(layer, q, k_in, v_in, cache, md, out)

    if kv.startswith("turboquant_"):
        ref = _ref_attention(q[:total], [k.double() for k in keys], [x.double() for x in vals], q_lens, k_lens,
                             scale, window, softcap, sink_t, torch.tensor(slopes) if slopes else None)
        rel = ((out[:total].double() - ref).abs().mean() / ref.abs().mean()).item()
        assert rel <= TQ_OUTPUT_REL[kv]
        assert torch.all(out[total] == 7.0)
        return
    # The cache read through vLLM's own views holds what vLLM's store rules keep (NVFP4's slots have no
    # Triton view: its case is judged by the attention below, over the twin's values).
    kview, vview, ksc, vsc = _triton_views(kv, cache) if not kv.startswith("nvfp4") else (None, None, None, None)
    for b in range(3 if kview is not None else 0):
        s = slots(b, 0, k_lens[b])
        blk, off = s // BLOCK, s % BLOCK
        got_k, got_v = kview[blk, off, :, :D].double(), vview[blk, off, :, :D].double()
        if ksc is not None:
            got_k, got_v = got_k * ksc[blk, off][..., None].double(), got_v * vsc[blk, off][..., None].double()
        elif kv.startswith("fp8"):
            got_k, got_v = got_k * kvscale, got_v * kvscale * 2
        want_k = _quantize_reference(kv, keys[b], kvscale)
        want_v = _quantize_reference(kv, vals[b], kvscale * 2)
        tol = 1e-6 if ksc is None else 1e-5
        torch.testing.assert_close(got_k, want_k, atol=tol, rtol=tol)
        torch.testing.assert_close(got_v, want_v, atol=tol, rtol=tol)

    ks_ref = [_quantize_reference(kv, keys[b], kvscale) for b in range(3)]
    vs_ref = [_quantize_reference(kv, vals[b], kvscale * 2) for b in range(3)]
    ref = _ref_attention(q[:total], ks_ref, vs_ref, q_lens, k_lens, scale, window, softcap, sink_t,
                         torch.tensor(slopes) if slopes else None)
    # float32 accumulation, output rounded to the model dtype: within twice the rounding of the
    # reference itself (FlashAttention's rule) plus float32 noise.
    err = (out[:total].double() - ref).abs().max().item()
    rounding = (ref.to(model_dtype).double() - ref).abs().max().item()
    assert err <= 2 * rounding + 2e-5, (err, rounding)
    assert torch.all(out[total] == 7.0)  # the padding row is not written
