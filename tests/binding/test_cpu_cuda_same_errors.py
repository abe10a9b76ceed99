"""A CUDA tensor and a CPU tensor with the same bad argument get the same
exception and message (issue #16): both extensions take tensors through
one importer and the store's arguments through one argument layer. No
device is needed: the fake DLPack producer (dlpack_fake.py) claims device
type 2 (CUDA) or 1 (CPU) over the same host buffer, and every case here is
refused before the CUDA runtime is reached."""

from __future__ import annotations

import pytest

import vtinfer as vt
from tests.binding.dlpack_fake import FakeTensor


def _cuda_arm_is_current():
    try:
        from vtinfer import _cuda
    except ImportError:
        return False
    import inspect

    return "num_threads" in inspect.signature(_cuda.reshape_and_cache_flash).parameters


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
