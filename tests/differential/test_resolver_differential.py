"""vtinfer's C resolver against vLLM's own extracted functions: a hand
corpus of every document shape in UPSTREAM.md, through every file route,
and Hypothesis-generated documents. 100% agreement on the answer, on the
error class and on the normalized config."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vtinfer import _C

NO_FILE = object()


def ours(flag, config, hf_quant=NO_FILE):
    """(answer | error class, normalized quant config) from vtinfer."""
    text = json.dumps(config).encode()
    hq = None if hf_quant is NO_FILE else json.dumps(hf_quant).encode()
    try:
        r = _C.resolve_kv_cache_dtype(flag, text, hq, layers=False)
    except TypeError as e:
        return ("TypeError", str(e)), None
    except ValueError as e:
        return ("ValueError", str(e)), None
    return r["vllm_cache_dtype"], r["quant_config"]


def theirs(fns, flag, config, hf_quant=NO_FILE):
    """The same through vLLM's functions, on documents read as vLLM reads them."""
    cfg = json.loads(json.dumps(config))
    hq = None if hf_quant is NO_FILE else json.loads(json.dumps(hf_quant))
    try:
        ans = fns.resolve(flag, cfg, hq, has_hf_quant=hf_quant is not NO_FILE)
    except (AttributeError, TypeError) as e:
        return ("TypeError", str(e)), None
    except ValueError as e:
        return ("ValueError", str(e)), None
    qc = cfg.get("quantization_config")
    if qc is None and hf_quant is not NO_FILE:
        qc = hq
    return ans, qc


def agree(fns, flag, config, hf_quant=NO_FILE):
    a, qa = ours(flag, copy.deepcopy(config), hf_quant)
    b, qb = theirs(fns, flag, copy.deepcopy(config), hf_quant)
    if isinstance(a, tuple) or isinstance(b, tuple):
        assert isinstance(a, tuple) and isinstance(b, tuple), (config, hf_quant, a, b)
        assert a[0] == b[0], (config, hf_quant, a, b)
        if a[0] == "ValueError":  # vLLM's own message, word for word
            assert a[1] == b[1], (a, b)
        return a
    assert a == b, (flag, config, hf_quant, a, b)
    qm = qb.get("quant_method") if isinstance(qb, dict) else None
    if qm is None or qm.isascii():  # lower() of non-ASCII is not mirrored (spec)
        assert qa == qb, (config, qa, qb)
    return a


MO = {"name": "modelopt"}
FP8_SCHEME = {"dynamic": False, "num_bits": 8, "type": "float"}

# (name, quant config) — every shape UPSTREAM.md names
CORPUS = [
    ("none", None),
    ("empty", {}),
    ("producer_only_legacy", {"producer": MO, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}),
    ("producer_case", {"producer": {"name": "ModelOpt"}, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}),
    ("legacy_marker", {"quantization": {"modelopt_quant_config": {}, "quant_algo": "fp8", "kv_cache_quant_algo": "fp8"}}),
    ("legacy_marker_nested_only", {"quantization": {"modelopt_quant_config": {"quant_algo": "FP8"}}}),
    ("marker_not_dict", {"quantization": "modelopt_quant_config"}),
    ("quantization_dict_no_marker", {"quant_method": "gptq", "quantization": {"quant_algo": "W4A16"}}),
    ("quantization_dict_no_marker_fp8", {"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}),
    ("mixed_precision", {"producer": MO, "quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": "FP8"}}),
    ("nvfp4", {"producer": MO, "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "NVFP4"}}),
    ("nvfp4_lower", {"quant_method": "modelopt_fp4", "kv_cache_quant_algo": "nvfp4"}),
    ("fp8_pb_wo", {"producer": MO, "quantization": {"quant_algo": "fp8_pb_wo"}}),
    ("per_channel", {"producer": MO, "quantization": {"quant_algo": "FP8_PER_CHANNEL_PER_TOKEN", "kv_cache_quant_algo": "FP8"}}),
    ("unknown_algo", {"producer": MO, "quantization": {"quant_algo": "W4A8_AWQ"}}),
    ("algo_int", {"producer": MO, "quantization": {"quant_algo": 8}}),
    ("algo_null", {"producer": MO, "quantization": {"quant_algo": None, "kv_cache_quant_algo": "FP8"}}),
    ("algo_missing", {"producer": MO, "quantization": {"kv_cache_quant_algo": "FP8"}}),
    ("inline_upper", {"quant_method": "MODELOPT", "kv_cache_quant_algo": "FP8"}),
    ("inline_nested", {"quant_method": "modelopt", "quantization": {"kv_cache_quant_algo": "fp8"}}),
    ("scheme_dict", {"quant_method": "modelopt", "kv_cache_scheme": FP8_SCHEME}),
    ("scheme_float_bits", {"quant_method": "modelopt", "kv_cache_scheme": {"dynamic": False, "num_bits": 8.0, "type": "float"}}),
    ("scheme_dynamic_0", {"quant_method": "modelopt", "kv_cache_scheme": {"dynamic": 0, "num_bits": 8, "type": "float"}}),
    ("scheme_dynamic_missing", {"quant_method": "modelopt", "kv_cache_scheme": {"num_bits": 8, "type": "float"}}),
    ("scheme_nvfp4", {"quant_method": "modelopt", "kv_cache_scheme": {"num_bits": 4, "type": "float"}}),
    ("scheme_int", {"quant_method": "modelopt", "kv_cache_scheme": {"num_bits": 8, "type": "int"}}),
    ("scheme_before_algo", {"quant_method": "modelopt", "kv_cache_scheme": {"num_bits": 4, "type": "float"}, "kv_cache_quant_algo": "FP8"}),
    ("empty_scheme_falls_through", {"quant_method": "modelopt", "kv_cache_scheme": {}, "kv_cache_quant_algo": "FP8"}),
    ("algo_unknown_str", {"quant_method": "modelopt", "kv_cache_quant_algo": "int8"}),
    ("algo_list", {"quant_method": "modelopt", "kv_cache_quant_algo": ["fp8"]}),
    ("algo_number", {"quant_method": "modelopt", "kv_cache_quant_algo": 8}),
    ("mixed_string", {"quant_method": "modelopt", "kv_cache_quant_algo": "mixed_precision"}),
    ("fp8_method", {"quant_method": "fp8", "kv_cache_quant_algo": "fp8"}),
    ("compressed", {"quant_method": "compressed_tensors", "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True}}),
    ("compressed_in_name", {"quant_method": "my_compressed_tensors_x"}),
    ("method_null", {"quant_method": None}),
    ("method_int", {"quant_method": 7}),
    ("producer_null", {"producer": None}),
    ("producer_str", {"producer": "modelopt"}),
    ("quantization_null_modelopt", {"quant_method": "modelopt", "quantization": None}),
    ("quantization_list_producer", {"producer": MO, "quantization": [1]}),
    ("qc_list", [1, 2]),
    ("qc_str", "fp8"),
    ("qc_false", False),
    ("kelvin", {"quant_method": "MODELOPT\u212a", "kv_cache_quant_algo": "FP8"}),
    ("long_s", {"producer": MO, "quantization": {"quant_algo": "\u017fome"}}),
    ("dotless", {"producer": MO, "quantization": {"quant_algo": "m\u0131xed_prec\u0131s\u0131on"}}),
]
FLAGS = ["auto", "fp8", "bfloat16", "fp8_e5m2"]


@pytest.mark.parametrize("flag", FLAGS)
@pytest.mark.parametrize("name,qc", CORPUS, ids=[c[0] for c in CORPUS])
def test_corpus_every_route(vllm_resolver, flag, name, qc):
    # inline
    agree(vllm_resolver, flag, {"quantization_config": qc} if qc is not None else {})
    # legacy file only
    agree(vllm_resolver, flag, {}, qc)
    # inline null + legacy file
    agree(vllm_resolver, flag, {"quantization_config": None}, qc)
    # inline present + a legacy file beside it (never merged, file ignored)
    if qc is not None:
        agree(vllm_resolver, flag, {"quantization_config": qc},
              {"producer": MO, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}})
    # nested in text_config only (never reaches the resolver, but normalized)
    agree(vllm_resolver, flag, {"text_config": {"quantization_config": qc}})


def test_mixed_precision_inline_with_fp8_file(vllm_resolver):
    inline = {"producer": MO, "quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None}}
    legacy = {"producer": MO, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}
    assert agree(vllm_resolver, "auto", {"quantization_config": inline}, legacy) == "auto"


def test_producer_only_legacy_file_resolves_after_normalization(vllm_resolver):
    legacy = {"producer": MO, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}
    assert agree(vllm_resolver, "auto", {}, legacy) == "fp8_e4m3"


def test_flag_list_matches_pinned_cache_dtype(vllm_resolver):
    assert list(_C.vllm_kv_cache_dtypes()) == vllm_resolver.kv_cache_dtypes


# ---- Hypothesis ------------------------------------------------------------------

texts = st.sampled_from(["modelopt", "ModelOpt", "MODELOPT_FP4", "modelopt_mixed", "compressed_tensors",
                         "compressed-tensors", "fp8", "FP8", "nvfp4", "NVFP4", "", "int8", "mixed_precision",
                         "MIXED_PRECISION", "FP8_PB_WO", "fp8_per_channel_per_token", "W4A16", "\u212a",
                         "\u0130", "\u00df"]) | st.text(max_size=6)
scalars = st.none() | st.booleans() | st.sampled_from([0, 4, 8, 4.0, 8.0, 8.5, -0.0]) | st.integers(-10, 10) | texts
scheme = st.dictionaries(st.sampled_from(["dynamic", "num_bits", "type", "strategy", "symmetric"]), scalars, max_size=5)
kv_val = scalars | scheme | st.lists(scalars, max_size=2)
inner = st.dictionaries(
    st.sampled_from(["quant_algo", "kv_cache_quant_algo", "kv_cache_scheme", "modelopt_quant_config"]),
    kv_val | st.just({}), max_size=4)
producer = st.none() | texts | st.dictionaries(st.sampled_from(["name", "version"]), scalars | st.just("modelopt"), max_size=2)
quant_cfg = st.dictionaries(
    st.sampled_from(["producer", "quantization", "quant_method", "kv_cache_quant_algo", "kv_cache_scheme",
                     "scale_fmt"]),
    kv_val | inner | producer, max_size=5) | scalars | st.lists(scalars, max_size=1)
config = st.fixed_dictionaries({}, optional={
    "quantization_config": st.none() | quant_cfg,
    "compression_config": st.none() | quant_cfg,
    "text_config": st.none() | st.fixed_dictionaries({}, optional={"quantization_config": quant_cfg}),
    "torch_dtype": st.just("bfloat16")})
hf_file = st.just(NO_FILE) | st.none() | quant_cfg


@settings(max_examples=3000, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(flag=st.sampled_from(FLAGS + ["auto"] * 4), cfg=config, hq=hf_file)
def test_generated_documents(vllm_resolver, flag, cfg, hq):
    agree(vllm_resolver, flag, cfg, hq)


def _cpu_refusals(vllm_source, name: str) -> list[str]:
    """The messages vllm/platforms/cpu.py's get_attn_backend_cls raises for --kv-cache-dtype `name`
    (its f-strings rendered with the name), the MLA one first."""
    import ast as _ast

    tree = _ast.parse(vllm_source.read("vllm/platforms/cpu.py"))
    fn = next(n for n in _ast.walk(tree) if isinstance(n, _ast.FunctionDef) and n.name == "get_attn_backend_cls")
    out = []
    for node in _ast.walk(fn):
        if isinstance(node, _ast.Raise) and isinstance(node.exc, _ast.Call) and node.exc.args and \
                isinstance(node.exc.args[0], _ast.JoinedStr):
            parts = [v.value if isinstance(v, _ast.Constant) else name for v in node.exc.args[0].values]
            out.append("".join(parts))
    return sorted(out, key=lambda m: "MLA" not in m)


def test_every_vllm_value_is_stored_or_refused_with_the_cpu_reason(vllm_resolver, vllm_source):
    """vt.VLLM_KV_CACHE_DTYPES is vLLM 0.33's CacheDType; each value is stored (a name of
    KV_CACHE_DTYPES) or a key of KV_CACHE_DTYPES_NOT_STORED, never both; each reason quotes what vLLM's
    own CPU build raises for it (read from the wheel), which vLLM's CPU_ATTN indeed does not accept."""
    import vtinfer as vt

    assert list(vt.VLLM_KV_CACHE_DTYPES) == vllm_resolver.kv_cache_dtypes and len(vt.VLLM_KV_CACHE_DTYPES) == 22
    stored = {x for x in vt.VLLM_KV_CACHE_DTYPES if x in vt.KV_CACHE_DTYPES}
    refused = set(vt.KV_CACHE_DTYPES_NOT_STORED)
    assert not stored & refused and stored | refused == set(vt.VLLM_KV_CACHE_DTYPES)
    assert refused == {"fp8_inc", "fp8_ds_mla", "nvfp4_ds_mla"}
    cpu_attn = vllm_source.read("vllm/v1/attention/backends/cpu_attn.py")
    accepted = cpu_attn[cpu_attn.index("supported_kv_cache_dtypes"):cpu_attn.index("def get_supported_kernel")]
    for name, why in vt.KV_CACHE_DTYPES_NOT_STORED.items():
        mla, attn = _cpu_refusals(vllm_source, name)
        assert f'"{name}"' not in accepted
        assert attn in why, (name, why)
        assert (mla in why) == name.endswith("_ds_mla"), (name, why)
        with pytest.raises(ValueError, match="which vtinfer does not store") as e:
            vt.PagedKVCache(num_layers=1, num_blocks=1, block_size=16, num_kv_heads=1, head_size=64, dtype=name)
        assert why.split(". vLLM on a CPU")[0] in str(e.value)


def test_plan_kv_cache_names_why_a_vllm_value_is_not_stored(tmp_path):
    import vtinfer as vt

    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 2,
                                                      "num_key_value_heads": 1, "hidden_size": 64,
                                                      "torch_dtype": "bfloat16"}))
    with pytest.raises(NotImplementedError, match="plan_kv_cache: vtinfer cannot store kv_cache_dtype 'fp8_inc'") as e:
        vt.plan_kv_cache(tmp_path, "fp8_inc", 16, num_blocks=1)
    assert vt.KV_CACHE_DTYPES_NOT_STORED["fp8_inc"] in str(e.value)


def test_plan_kv_cache_sizes_nvfp4_as_vllm_pages(tmp_path):
    """vLLM's NVFP4 page per layer is 2 * H_kv * block_size * (D / 2 + D / 16) bytes, every layer quantized: the
    plan (a slot row of the table: one D + D / 8 byte slot per (token, KV head)) says the same."""
    import vtinfer as vt

    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 3, "num_attention_heads": 4,
                                                      "num_key_value_heads": 2, "hidden_size": 256,
                                                      "torch_dtype": "bfloat16"}))
    for name in vt.NVFP4_DTYPES:
        plan = vt.plan_kv_cache(tmp_path, name, 16, num_blocks=1)
        assert plan.bytes_per_block == 3 * 2 * 2 * 16 * (64 // 2 + 64 // 16), (name, plan)
