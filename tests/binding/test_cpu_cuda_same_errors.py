"""A CUDA tensor and a CPU tensor with the same bad argument get the same
exception and message: both extensions take tensors through
one importer and the store's and attention's arguments through one
argument layer each (common/store_args.c, common/attn_args.c). No device
is needed: the fake DLPack producer (dlpack_fake.py) claims device type 2
(CUDA) or 1 (CPU) over the same host buffer, and every case here is
refused before the CUDA runtime is reached (on this machine the runtime
answers every call with an error: a case that reached it would raise
CudaError, which the tests refuse). What this cannot check: anything
after the host copies (the index arrays' values, the kernels): that needs
a device (tests/cuda)."""

from __future__ import annotations

import pytest

import vtinfer as vt
from tests.binding.dlpack_fake import FakeTensor


def _cuda_arm_is_current():
    try:
        from vtinfer import _C, _cuda
    except ImportError:
        return False
    import inspect
    import os

    return (os.path.dirname(_cuda.__file__) == os.path.dirname(_C.__file__)
            and "num_threads" in inspect.signature(_cuda.reshape_and_cache_flash).parameters
            and "validate" in inspect.signature(_cuda.flash_attn_varlen_func).parameters)


pytestmark = pytest.mark.skipif(not _cuda_arm_is_current(), reason="vtinfer._cuda not built from this tree")

I64 = dict(code=0, bits=64)


def _args(dev, **over):
    """reshape_and_cache_flash arguments of fakes on device `dev`; `over`
    replaces one (a shape list, or a dict of FakeTensor keywords)."""
    spec = dict(key=([2, 1, 8], {}), value=([2, 1, 8], {}), key_cache=([4, 2, 1, 8], {}),
                value_cache=([4, 2, 1, 8], {}), slot_mapping=([2], I64))
    made = {}
    for name, (shape, kw) in spec.items():
        if name in over:
            o = over[name]
            shape, kw = (o, kw) if isinstance(o, list) else (o.pop("shape", shape), {**kw, **o})
        kw = dict(kw)
        made[name] = FakeTensor(shape, device_type=kw.pop("device_type", dev), **kw)
    return made


CASES = {
    "key_rank_2": dict(key=[2, 8]),
    "value_dtype": dict(value=dict(bits=16)),
    "slot_mapping_int32": dict(slot_mapping=dict(code=0, bits=32)),
    "slot_mapping_too_long": dict(slot_mapping=dict(shape=[3])),
    "value_cache_shape": dict(value_cache=[4, 2, 2, 8]),
    "key_cache_dtype": dict(key_cache=dict(bits=16)),
    "key_cache_strided_last_dim": dict(key_cache=dict(strides=[16, 8, 8, 2])),
    "key_lanes": dict(key=dict(lanes=2)),
    "key_null_data": dict(key=dict(null_data=True)),
}


def _call(dev, case, **extra):
    a = _args(dev, **{k: (dict(v) if isinstance(v, dict) else v) for k, v in CASES.get(case, {}).items()})
    kw = dict(kv_cache_dtype="auto", k_scale=1.0, v_scale=1.0)
    kw.update(extra)
    if case == "caches_share_memory":
        a["value_cache"] = a["key_cache"]
    with pytest.raises(Exception) as e:
        vt.reshape_and_cache_flash(a["key"], a["value"], a["key_cache"], a["value_cache"], a["slot_mapping"], **kw)
    return type(e.value), str(e.value)


@pytest.mark.parametrize("case", [*CASES, "caches_share_memory"])
def test_same_exception_and_message(case):
    cpu, cuda = _call(1, case), _call(2, case)
    assert cpu == cuda
    assert "CUDA" not in cuda[1], "refused before the CUDA runtime"


@pytest.mark.parametrize("extra", [dict(kv_cache_dtype="bogus"), dict(layout="XYZ"), dict(kv_cache_dtype=3)])
def test_same_scalar_refusals(extra):
    assert _call(1, "none", **extra) == _call(2, "none", **extra)


def test_device_check_is_the_only_difference():
    a = _args(2, key_cache=dict(device_type=1))
    with pytest.raises(ValueError, match="reshape_and_cache_flash: key_cache must be on a CUDA device; got DLPack "
                                         "device type 1"):
        vt.reshape_and_cache_flash(a["key"], a["value"], a["key_cache"], a["value_cache"], a["slot_mapping"],
                                   "auto", 1.0, 1.0)


# ---- flash_attn_varlen_func: the shared attention argument layer ----

I32 = dict(code=0, bits=32)
ATTN = dict(q=([2, 2, 8], {}), k=([2, 2, 1, 8], {}), v=([2, 2, 1, 8], {}), cu_seqlens_q=([2], I32),
            seqused_k=([1], I32), block_table=([1, 2], I32))

ATTN_CASES = {
    "q_rank_2": dict(q=[2, 16]),
    "q_int32": dict(q=dict(code=0, bits=32)),
    "k_int64": dict(k=dict(code=0, bits=64)),
    "v_shape": dict(v=[2, 2, 2, 8]),
    "k_head_size": dict(k=[2, 2, 1, 4], v=[2, 2, 1, 4]),
    "heads_not_divisible": dict(q=[2, 3, 8], k=[2, 2, 2, 8], v=[2, 2, 2, 8]),
    "v_dtype": dict(v=dict(bits=16)),
    "cu_seqlens_q_int64": dict(cu_seqlens_q=dict(code=0, bits=64)),
    "cu_seqlens_q_empty": dict(cu_seqlens_q=dict(shape=[0])),
    "seqused_k_length": dict(seqused_k=dict(shape=[2])),
    "block_table_rank": dict(block_table=dict(shape=[2])),
    "block_table_rows": dict(block_table=dict(shape=[2, 2])),
    "block_table_strided": dict(block_table=dict(shape=[1, 2], strides=[4, 2])),
    "k_strided_head_dim": dict(k=dict(strides=[32, 16, 16, 2])),
    "q_strided": dict(q=dict(strides=[32, 8, 1])),
    "q_lanes": dict(q=dict(lanes=2)),
    "k_null_data": dict(k=dict(null_data=True)),
    "out_shape": dict(out=([2, 2, 4], {})),
    "out_dtype": dict(out=([2, 2, 8], dict(bits=16))),
    "out_read_only": dict(out=([2, 2, 8], dict(versioned=True, read_only=True))),
    "k_scale_cache_without_per_token_head": dict(k_scale_cache=([2, 2, 1], {})),
}


def _attn_args(dev, case):
    over = {k: (dict(v) if isinstance(v, dict) else v) for k, v in ATTN_CASES.get(case, {}).items()}
    made = {}
    for name, (shape, kw) in {**ATTN, **{n: o for n, o in over.items() if isinstance(o, tuple)}}.items():
        o = over.get(name)
        if isinstance(o, list):
            shape = o
        elif isinstance(o, dict):
            shape, kw = o.pop("shape", shape), {**kw, **o}
        kw = dict(kw)
        made[name] = FakeTensor(shape, device_type=kw.pop("device_type", dev), **kw)
    return made


def _attn_call(dev, case, **extra):
    a = _attn_args(dev, case)
    if case == "out_is_q":
        a["out"] = a["q"]
    q, k, v = a.pop("q"), a.pop("k"), a.pop("v")
    with pytest.raises(Exception) as e:
        vt.flash_attn_varlen_func(q, k, v, **a, **extra)
    return type(e.value), str(e.value)


def _refused_before_the_runtime(result):
    from vtinfer import _cuda

    assert not issubclass(result[0], _cuda.CudaError) and "CUDA" not in result[1], result


@pytest.mark.parametrize("case", [*ATTN_CASES, "out_is_q"])
def test_attention_same_exception_and_message(case):
    cpu, cuda = _attn_call(1, case), _attn_call(2, case)
    assert cpu == cuda
    assert cuda[1].startswith("flash_attn_varlen_func: "), cuda
    _refused_before_the_runtime(cuda)


@pytest.mark.parametrize("extra", [dict(kv_cache_dtype="bogus"), dict(kv_cache_dtype=3), dict(kv_cache_dtype="fp8"),
                                   dict(window_size=(1,)), dict(window_size=(-2, 0)), dict(softcap="x"),
                                   dict(softmax_scale=True), dict(max_seqlen_q=-1), dict(max_seqlen_k=1.5)])
def test_attention_same_scalar_refusals(extra):
    cpu, cuda = _attn_call(1, "none", **extra), _attn_call(2, "none", **extra)
    assert cpu == cuda
    _refused_before_the_runtime(cuda)


def test_attention_device_checks_are_the_only_difference():
    a = _attn_args(2, "none")
    a["k"] = FakeTensor([2, 2, 1, 8], device_type=1)
    with pytest.raises(ValueError, match="flash_attn_varlen_func: k must be on a CUDA device; got DLPack device type 1"):
        vt.flash_attn_varlen_func(a.pop("q"), a.pop("k"), a.pop("v"), **a)
    a = _attn_args(2, "none")
    a["block_table"] = FakeTensor([1, 2], device_type=2, device_id=1, **I32)
    with pytest.raises(ValueError, match="flash_attn_varlen_func: block_table must be on cuda:0 like the first "
                                         "tensor; got cuda:1"):
        vt.flash_attn_varlen_func(a.pop("q"), a.pop("k"), a.pop("v"), **a)


def test_attention_per_token_head_not_on_cuda_yet():
    a = _attn_args(2, "none")
    del a["k"], a["v"]
    k, v = (FakeTensor([2, 2, 1, 8], device_type=2, code=0, bits=8) for _ in range(2))
    scales = {n: FakeTensor([2, 2, 1], device_type=2) for n in ("k_scale_cache", "v_scale_cache")}
    with pytest.raises(NotImplementedError, match="kv_cache_dtype 'int8_per_token_head' is not built for CUDA tensors"):
        vt.flash_attn_varlen_func(a.pop("q"), k, v, **a, **scales, kv_cache_dtype="int8_per_token_head")
