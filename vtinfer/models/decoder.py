"""A Llama-family decoder in NumPy whose KV cache and attention are vtinfer's.

The matmuls, norms, RoPE and MLP are NumPy float32. Every layer's K and V go
into a :class:`vtinfer.PagedKVCache` through its store kernel (vLLM's
``reshape_and_cache_flash`` semantics, fp8 with per-tensor, per-layer or
per-head scales), and attention is :func:`vtinfer.flash_attn_varlen_func`
over the cache's pages with a block table from :class:`vtinfer.BlockAllocator`.
So the only difference between two runs with different ``kv_cache_dtype`` is
what the KV cache stores.

>>> model = Decoder.from_pretrained(path)                       # doctest: +SKIP
>>> sess = model.session(kv_cache_dtype="fp8_e4m3", k_scale=ks, v_scale=vs)
>>> logits = sess.prefill(token_ids)                            # [n, vocab]
>>> model.generate(token_ids, 32, kv_cache_dtype="bfloat16")    # greedy
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

import vtinfer as vt
from vtinfer.models.blas import blas_threads
from vtinfer.models import tq_prefill
from vtinfer.models.config import DecoderConfig

__all__ = ["Decoder", "Session", "rope_inv_freq", "load_weights"]

Observer = Callable[[int, np.ndarray, np.ndarray], None]


def rope_inv_freq(cfg: DecoderConfig) -> np.ndarray:
    """Inverse frequencies ``[head_dim/2]`` (float32, as HF computes them),
    with ``linear`` or ``llama3`` scaling applied."""
    d = cfg.head_dim
    inv = (1.0 / (cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / d))).astype(np.float32)
    rs = cfg.rope_scaling
    if rs:
        kind = rs.get("rope_type", rs.get("type"))
        if kind == "linear":
            inv = (inv / np.float32(rs["factor"])).astype(np.float32)
        elif kind == "llama3":
            factor, lo, hi = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
            old = float(rs["original_max_position_embeddings"])
            lo_wl, hi_wl = old / lo, old / hi
            wl = 2 * np.pi / inv
            scaled = np.where(wl > lo_wl, inv / factor, inv)
            smooth = (old / wl - lo) / (hi - lo)
            mid = (1 - smooth) * scaled / factor + smooth * scaled
            is_mid = ~(wl < hi_wl) & ~(wl > lo_wl)
            inv = np.where(is_mid, mid, scaled).astype(np.float32)
    return inv


def load_weights(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint's safetensors shards, as float32."""
    from vtinfer.models.store import load_safetensors

    ck = vt.Checkpoint(path)
    raw = load_safetensors(list(ck.shards))
    out = {}
    for k, v in raw.items():
        out[k] = v if v.dtype == np.float32 else v.astype(np.float32)
    return out


@dataclass
class _Layer:
    in_norm: np.ndarray
    post_norm: np.ndarray
    wq: np.ndarray
    wk: np.ndarray
    wv: np.ndarray
    wo: np.ndarray
    wg: np.ndarray
    wu: np.ndarray
    wd: np.ndarray
    bq: np.ndarray | None = None
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None


def _rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    var = np.mean(np.square(x), axis=-1, keepdims=True, dtype=np.float32)
    return (x * (1.0 / np.sqrt(var + np.float32(eps)))).astype(np.float32) * w


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (np.float32(1.0) + np.exp(-x))


class Decoder:
    """A Llama / Mistral / Qwen2 / Qwen3 / SmolLM decoder with float32 weights.

    Parameters
    ----------
    config : DecoderConfig
    weights : dict of str -> ndarray
        HF tensor names (``model.layers.N.self_attn.q_proj.weight``, ...),
        float32.
    tokenizer : object, optional
        With ``encode(str) -> list[int]`` and ``decode(list[int]) -> str``.

    Attributes
    ----------
    blas_threads : int or None
        Threads NumPy's BLAS may use for the matmuls (default 1, see
        :mod:`vtinfer.models.blas`; None leaves the BLAS pool alone).
        vtinfer's own kernels use their own pool.
    num_threads : int or None
        Threads for vtinfer's store and attention kernels in new sessions
        (None: ``VTINFER_NUM_THREADS`` or the CPU affinity count).
    """

    def __init__(self, config: DecoderConfig, weights: dict[str, np.ndarray], tokenizer: Any = None,
                 name: str = "model") -> None:
        self.config = c = config
        self.name = name
        self.tokenizer = tokenizer
        self.blas_threads: int | None = 1
        self.num_threads: int | None = None

        def w(key: str) -> np.ndarray:
            if key not in weights:
                raise ValueError(f"Decoder: weights must hold {key}; got none of that name")
            return np.ascontiguousarray(weights[key], dtype=np.float32)

        def opt(key: str) -> np.ndarray | None:
            return w(key) if key in weights else None

        self.embed = w("model.embed_tokens.weight")
        self.norm = w("model.norm.weight")
        self.lm_head = self.embed if c.tie_word_embeddings or "lm_head.weight" not in weights else w("lm_head.weight")
        self.layers = []
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            self.layers.append(_Layer(
                in_norm=w(p + "input_layernorm.weight"), post_norm=w(p + "post_attention_layernorm.weight"),
                wq=w(p + "self_attn.q_proj.weight"), wk=w(p + "self_attn.k_proj.weight"),
                wv=w(p + "self_attn.v_proj.weight"), wo=w(p + "self_attn.o_proj.weight"),
                wg=w(p + "mlp.gate_proj.weight"), wu=w(p + "mlp.up_proj.weight"), wd=w(p + "mlp.down_proj.weight"),
                bq=opt(p + "self_attn.q_proj.bias"), bk=opt(p + "self_attn.k_proj.bias"),
                bv=opt(p + "self_attn.v_proj.bias"),
                q_norm=opt(p + "self_attn.q_norm.weight") if c.qk_norm else None,
                k_norm=opt(p + "self_attn.k_norm.weight") if c.qk_norm else None,
            ))
        self.inv_freq = rope_inv_freq(c)

    def num_parameters(self) -> int:
        """float32 parameters held (a tied ``lm_head`` counted once)."""
        arrays = [self.embed, self.norm] + ([] if self.lm_head is self.embed else [self.lm_head])
        for layer in self.layers:
            arrays += [a for a in vars(layer).values() if isinstance(a, np.ndarray)]
        return sum(int(a.size) for a in arrays)

    def __repr__(self) -> str:
        c, n = self.config, self.num_parameters()
        tok = type(self.tokenizer).__name__ if self.tokenizer is not None else "none"
        return (f"Decoder({self.name!r}: {c.model_type}, {c.num_layers} layers, {c.num_heads} query heads / "
                f"{c.num_kv_heads} KV heads of {c.head_dim}, vocab {c.vocab_size}, {n:,} float32 parameters "
                f"({4 * n / 2**20:.1f} MiB), tokenizer {tok})")

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> "Decoder":
        """Load ``config.json``, the safetensors shards and ``tokenizer.json``
        (a byte tokenizer when there is none)."""
        from vtinfer.models.tokenizer import load_tokenizer

        cfg = DecoderConfig.from_dir(path)
        return cls(cfg, load_weights(path), load_tokenizer(path, cfg.vocab_size), name=Path(path).name)

    # ---- pieces ----
    def rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Rotate-half RoPE on ``x [n, heads, head_dim]`` at ``positions [n]``."""
        freqs = positions.astype(np.float32)[:, None] * self.inv_freq[None, :]
        emb = np.concatenate([freqs, freqs], axis=-1)
        cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]
        h = x.shape[-1] // 2
        rot = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
        return (x * cos + rot * sin).astype(np.float32)

    def session(self, kv_cache_dtype: str = "float32", *, max_tokens: int = 2048, block_size: int = 16,
                k_scale: Any = 1.0, v_scale: Any = 1.0, num_threads: int | None = None,
                turboquant_boundary: bool = True, turboquant_prefill: str = "cache") -> "Session":
        """A single-sequence session with a fresh paged KV cache.

        Parameters
        ----------
        kv_cache_dtype : str
            Storage dtype of the cache (``float32``, ``bfloat16``,
            ``float16``, ``fp8_e4m3``, ``fp8_e5m2``, the per-token-head and
            ``turboquant_*`` formats).
        max_tokens : int
            Tokens the cache must hold (rounded up to whole blocks).
        k_scale, v_scale : float or array_like
            Scalar, ``[num_layers]`` or ``[num_layers, num_kv_heads]``.
        turboquant_boundary : bool
            Slot formats (``turboquant_*``, ``ultraquant_4bit``) only: keep vLLM's boundary layers (the first and
            last ``min(2, L // 2)``) unquantized, as vLLM does (they stay in
            this decoder's float32; vLLM keeps them in the model dtype).
        turboquant_prefill : {"cache", "vllm"}
            ``turboquant_*`` only: ``"cache"`` reads every query's keys from the
            slot cache (what decode sees); ``"vllm"`` follows vLLM 0.33's
            TurboQuant prefill (a first chunk attends to its own raw K/V; see
            :mod:`vtinfer.models.tq_prefill`).
        """
        return Session(self, kv_cache_dtype, max_tokens, block_size, k_scale, v_scale,
                       self.num_threads if num_threads is None else num_threads, turboquant_boundary,
                       turboquant_prefill)

    def logits(self, x: np.ndarray) -> np.ndarray:
        """Final norm and LM head on hidden states ``[n, hidden]`` -> ``[n, vocab]`` float32."""
        return _rmsnorm(x, self.norm, self.config.rms_norm_eps) @ self.lm_head.T

    # ---- whole-sequence helpers ----
    def score(self, tokens: Any, kv_cache_dtype: str = "float32", *, chunk: int = 256, k_scale: Any = 1.0,
              v_scale: Any = 1.0, observer: Observer | None = None, block_size: int = 16,
              turboquant_boundary: bool = True, turboquant_prefill: str = "cache") -> np.ndarray:
        """Teacher-forced logits ``[n, vocab]`` for every position of ``tokens``.

        The sequence is prefilled ``chunk`` tokens at a time into one paged
        cache, so every chunk after the first attends to keys that came back
        from the cache (and through its dtype).
        """
        toks = np.asarray(tokens, dtype=np.int64).reshape(-1)
        sess = self.session(kv_cache_dtype, max_tokens=max(len(toks), 1), block_size=block_size,
                            k_scale=k_scale, v_scale=v_scale, turboquant_boundary=turboquant_boundary,
                            turboquant_prefill=turboquant_prefill)
        sess.observer = observer
        parts = [sess.prefill(toks[i:i + chunk]) for i in range(0, len(toks), chunk)]
        return np.concatenate(parts) if parts else np.zeros((0, self.config.vocab_size), np.float32)

    def score_batch(self, sequences: list[Any], kv_cache_dtype: str = "float32", *, chunk: int = 256,
                    k_scale: Any = 1.0, v_scale: Any = 1.0, block_size: int = 16) -> list[np.ndarray]:
        """Teacher-forced logits for several sequences sharing one paged cache.

        Each step prefills up to ``chunk`` more tokens of every unfinished
        sequence in one batch (one varlen attention call per layer, block
        tables from the allocator). Returns one ``[len(seq), vocab]`` array
        per sequence.
        """
        seqs = [np.asarray(t, dtype=np.int64).reshape(-1) for t in sequences]
        blocks = sum(max(-(-len(t) // block_size), 1) for t in seqs)
        sess = self.session(kv_cache_dtype, max_tokens=blocks * block_size, block_size=block_size,
                            k_scale=k_scale, v_scale=v_scale)
        out: list[list[np.ndarray]] = [[] for _ in seqs]
        with blas_threads(self.blas_threads):
            for start in range(0, max((len(t) for t in seqs), default=0), chunk):
                batch = [(f"s{j}", t[start:start + chunk]) for j, t in enumerate(seqs) if len(t) > start]
                logits = self.logits(sess.forward_batch(batch))
                at = 0
                for sid, part in batch:
                    j = int(sid[1:])
                    out[j].append(logits[at:at + len(part)])
                    at += len(part)
        return [np.concatenate(o) if o else np.zeros((0, self.config.vocab_size), np.float32) for o in out]

    def generate_batch(self, prompts: list[Any], max_new_tokens: int, kv_cache_dtype: str = "float32", *,
                       k_scale: Any = 1.0, v_scale: Any = 1.0, stop_at_eos: bool = True) -> list["Generation"]:
        """Greedy generation for several prompts decoding together in one cache.

        All prompts are prefilled in one batch; each decode step then feeds
        one token of every unfinished sequence in one batch (varlen attention
        over each sequence's own block table). The returned timings are the
        batch's (prefill and decode wall time, decode steps).
        """
        return _generate_batch(self, list(prompts), int(max_new_tokens), kv_cache_dtype, k_scale, v_scale,
                               stop_at_eos)

    def generate(self, prompt: Any, max_new_tokens: int, kv_cache_dtype: str = "float32", *, k_scale: Any = 1.0,
                 v_scale: Any = 1.0, stop_at_eos: bool = True) -> "Generation":
        """Greedy generation; times prefill and decode separately."""
        toks = [int(t) for t in np.asarray(prompt, dtype=np.int64).reshape(-1)]
        sess = self.session(kv_cache_dtype, max_tokens=len(toks) + max_new_tokens + 1, k_scale=k_scale,
                            v_scale=v_scale)
        t0 = time.perf_counter()
        last = sess.prefill(np.asarray(toks), last_only=True)[-1]
        t1 = time.perf_counter()
        out: list[int] = []
        nxt = int(np.argmax(last))
        for _ in range(max_new_tokens):
            out.append(nxt)
            if stop_at_eos and nxt in self.config.eos_token_ids:
                break
            if len(out) == max_new_tokens:
                break
            nxt = int(np.argmax(sess.decode(nxt)))
        t2 = time.perf_counter()
        steps = max(len(out) - 1, 0)
        text = self.tokenizer.decode(out) if self.tokenizer is not None else None
        return Generation(out, text, len(toks), t1 - t0, steps, t2 - t1)


@dataclass
class _Pending:
    sid: str
    prompt: list[int]
    out: list[int]
    done: bool = False


def _generate_batch(model: "Decoder", prompts: list[Any], max_new_tokens: int, kv_cache_dtype: str, k_scale: Any,
                    v_scale: Any, stop_at_eos: bool, block_size: int = 16) -> list["Generation"]:
    ps = [_Pending(f"g{j}", [int(t) for t in np.asarray(p, dtype=np.int64).reshape(-1)], []) for j, p in
          enumerate(prompts)]
    if any(not p.prompt for p in ps):
        raise ValueError("Decoder.generate_batch: prompts must each hold at least one token")
    blocks = sum(-(-(len(p.prompt) + max_new_tokens + 1) // block_size) for p in ps)
    sess = model.session(kv_cache_dtype, max_tokens=blocks * block_size, block_size=block_size, k_scale=k_scale,
                         v_scale=v_scale)
    eos = set(model.config.eos_token_ids) if stop_at_eos else set()
    t0 = time.perf_counter()
    with blas_threads(model.blas_threads):
        x = sess.forward_batch([(p.sid, p.prompt) for p in ps])
        ends = np.cumsum([len(p.prompt) for p in ps]) - 1
        last = model.logits(x[ends])
        t1 = time.perf_counter()
        steps = 0
        while True:
            live = []
            for p, row in zip([p for p in ps if not p.done], last):
                nxt = int(np.argmax(row))
                p.out.append(nxt)
                if nxt in eos or len(p.out) >= max_new_tokens:
                    p.done = True
                else:
                    live.append(p)
            if not live or max_new_tokens == 0:
                break
            last = model.logits(sess.forward_batch([(p.sid, [p.out[-1]]) for p in live]))
            steps += 1
    t2 = time.perf_counter()
    tk = model.tokenizer
    # one decode step advances every live sequence: timings are shared by the batch
    return [Generation(p.out, tk.decode(p.out) if tk is not None else None, len(p.prompt), t1 - t0, steps, t2 - t1)
            for p in ps]


@dataclass
class Generation:
    """Greedy output and timings (``decode_steps`` forward passes of one token)."""

    tokens: list[int]
    text: str | None
    prompt_tokens: int
    prefill_s: float
    decode_steps: int
    decode_s: float

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else float("nan")

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_steps / self.decode_s if self.decode_s > 0 and self.decode_steps else float("nan")


class Session:
    """One :class:`vtinfer.PagedKVCache` and one :class:`vtinfer.BlockAllocator`;
    sequence 0 by default, more with :meth:`forward_batch`.

    ``prefill(tokens)`` appends any number of tokens (a chunk of a longer
    prompt is fine) and ``decode(token)`` one; both return logits for the new
    positions. ``observer(layer, k, v)``, when set, sees every layer's K
    (after RoPE) and V ``[n, H_kv, D]`` before they are stored (calibration).
    """

    def __init__(self, model: Decoder, kv_cache_dtype: str, max_tokens: int, block_size: int, k_scale: Any,
                 v_scale: Any, num_threads: int | None, turboquant_boundary: bool = True,
                 turboquant_prefill: str = "cache") -> None:
        if turboquant_prefill not in ("cache", "vllm"):
            raise ValueError(f"Session: turboquant_prefill must be 'cache' or 'vllm'; got {turboquant_prefill!r}")
        self.turboquant_prefill = turboquant_prefill
        c = model.config
        self.model = model
        self.kv_cache_dtype = kv_cache_dtype
        num_blocks = max(-(-int(max_tokens) // block_size), 1)
        # the slot formats (turboquant_*, ultraquant_4bit, octave_*): one uint8 slot cache per quantized layer
        # (vt.turboquant_store / turboquant_attention); vLLM's boundary layers (the row's boundary_layers), and the
        # paged cache below, stay float32; every head dim is rotary here (the decoder's RoPE)
        # (NVFP4, a slot format of PagedKVCache, runs below on vLLM's own pages instead)
        self.turboquant = (kv_cache_dtype if kv_cache_dtype in vt.SLOT_DTYPES and kv_cache_dtype not in
                           vt.NVFP4_DTYPES else None)
        if turboquant_prefill == "vllm" and self.turboquant and self.turboquant not in vt.TURBOQUANT_DTYPES:
            raise NotImplementedError(f"Session: turboquant_prefill='vllm' models TurboQuant's prefill rules; "
                                      f"{self.turboquant}'s own (vLLM's UltraQuantAttentionImpl) are not modelled: "
                                      "use turboquant_prefill='cache'")
        self._tq: dict[int, np.ndarray] = {}
        if self.turboquant:
            from vtinfer._turboquant import boundary_skip_layers

            n_edge = vt.dtype_info(self.turboquant).boundary_layers
            skip = {int(x) for x in boundary_skip_layers(c.num_layers, n_edge)} if turboquant_boundary else set()
            slot = vt.turboquant_slot_bytes(self.turboquant, c.head_dim)
            self._tq = {i: np.zeros((num_blocks, block_size, c.num_kv_heads, slot), np.uint8)
                        for i in range(c.num_layers) if i not in skip}
            kv_cache_dtype = "float32"
        # NVFP4 (nvfp4, nvfp4_4over6): vLLM's [K data | K scales | V data | V scales] pages per layer, through
        # vt.reshape_and_cache_flash / flash_attn_varlen_func on their side views; the global scales are the
        # session's k_scale / v_scale (vLLM's default 1.0), one per tensor
        self.nvfp4 = kv_cache_dtype if kv_cache_dtype in vt.NVFP4_DTYPES else None
        self._nv: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        if self.nvfp4:
            self._nv_scales = tuple(1.0 if s is None else float(np.asarray(s, np.float32).reshape(-1)[0])
                                    for s in (k_scale, v_scale))
            for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
                if s is not None and np.asarray(s).size != 1:
                    raise ValueError(f"Session: {name} must be one number for kv_cache_dtype '{self.nvfp4}' (NVFP4's "
                                     f"global scale is per tensor); got {np.asarray(s).size} values")
            full, Hk = c.head_dim // 2 + c.head_dim // 16, c.num_kv_heads
            for i in range(c.num_layers):
                sides = np.zeros((num_blocks, 2 * Hk, block_size, full), np.uint8).transpose(0, 2, 1, 3)
                self._nv[i] = (sides[:, :, :Hk], sides[:, :, Hk:])
            kv_cache_dtype, k_scale, v_scale = "float32", 1.0, 1.0
        self.cache = vt.PagedKVCache(num_layers=c.num_layers, num_blocks=num_blocks, block_size=block_size,
                                     num_kv_heads=c.num_kv_heads, head_size=c.head_dim, dtype=kv_cache_dtype,
                                     k_scale=k_scale, v_scale=v_scale)
        self.is_fp8 = vt.dtype_info(self.cache.dtype).is_fp8
        self.per_token_head = vt.dtype_info(self.cache.dtype).scale_kind == "token_head"
        self.attn_dtype = self.cache.dtype if self.is_fp8 or self.per_token_head else "auto"
        self.alloc = vt.BlockAllocator(num_blocks, block_size)
        self.alloc.allocate(0, 0)
        self.num_threads = num_threads
        self.observer: Observer | None = None
        self.attention_s = 0.0
        ks, vs = np.asarray(self.cache.k_scale, np.float32), np.asarray(self.cache.v_scale, np.float32)
        self._descale = []
        for i in range(c.num_layers):
            if not self.is_fp8:
                self._descale.append((None, None))
            else:
                self._descale.append((ks if ks.ndim == 0 else ks[i], vs if vs.ndim == 0 else vs[i]))
        self._kc = [self.cache.key_cache(i) for i in range(c.num_layers)]
        self._vc = [self.cache.value_cache(i) for i in range(c.num_layers)]
        # per-token-head formats: each layer's scale planes go to attention as vLLM's scale caches
        self._scale_caches = [
            {"k_scale_cache": self.cache.k_scale_cache(i), "v_scale_cache": self.cache.v_scale_cache(i)}
            if self.per_token_head else {} for i in range(c.num_layers)]
        w = c.sliding_window
        self._window = (w - 1, 0) if w else (-1, -1)

    @property
    def length(self) -> int:
        """Tokens of sequence 0 in the cache."""
        return self.alloc.length(0)

    def __repr__(self) -> str:
        return (f"Session({self.model.name!r}, kv_cache_dtype={self.kv_cache_dtype!r}, sequence 0: {self.length} of "
                f"{self.cache.num_blocks * self.cache.block_size} tokens, num_threads={self.num_threads})")

    def prefill(self, tokens: Any, *, last_only: bool = False) -> np.ndarray:
        """Append ``tokens`` and return their logits ``[n, vocab]`` (``[1, vocab]`` with ``last_only``)."""
        toks = np.asarray(tokens, dtype=np.int64).reshape(-1)
        with blas_threads(self.model.blas_threads):
            x = self.forward_hidden(toks)
            return self.model.logits(x[-1:] if last_only else x)

    def decode(self, token: int) -> np.ndarray:
        """Append one token; its logits ``[vocab]``."""
        return self.prefill(np.array([token]), last_only=True)[0]

    def forward_hidden(self, toks: np.ndarray) -> np.ndarray:
        """Append ``toks`` to sequence 0 and return the last layer's hidden states ``[n, hidden]`` (no final norm)."""
        return self.forward_batch([(0, toks)])

    def forward_batch(self, batch: list[tuple[Any, Any]]) -> np.ndarray:
        """Append tokens to several sequences in one pass (one varlen attention call per layer).

        Parameters
        ----------
        batch : list of (seq_id, tokens)
            A new ``seq_id`` starts a sequence in this session's allocator;
            a known one continues it. Each sequence at most once per call.

        Returns
        -------
        ndarray, shape (total_tokens, hidden)
            Hidden states in batch order (no final norm).
        """
        m, c = self.model, self.model.config
        seqs = [sid for sid, _ in batch]
        if len(set(seqs)) != len(seqs):
            raise ValueError(f"Session.forward_batch: batch must name each sequence once; got {seqs!r}")
        arrs = [np.asarray(t, dtype=np.int64).reshape(-1) for _, t in batch]
        toks = np.concatenate(arrs) if arrs else np.zeros(0, np.int64)
        n = len(toks)
        if n == 0:
            return np.zeros((0, c.hidden_size), np.float32)
        if toks.min() < 0 or toks.max() >= c.vocab_size:
            bad = int(toks[(toks < 0) | (toks >= c.vocab_size)][0])
            raise IndexError(f"Session.prefill: tokens must be in [0, {c.vocab_size}); got {bad}")
        need = sum(-(-(len(a) + (self.alloc.length(sid) if sid in self.alloc else 0)) // self.alloc.block_size)
                   - (len(self.alloc.blocks(sid)) if sid in self.alloc else 0) for sid, a in zip(seqs, arrs))
        if need > self.alloc.num_free:
            raise MemoryError(f"Session.prefill: the cache must have {need} free blocks; got {self.alloc.num_free}")
        slots, pos, used, cu = [], [], [], [0]
        for sid, a in zip(seqs, arrs):
            if sid not in self.alloc:
                self.alloc.allocate(sid, 0)
            start = self.alloc.length(sid)
            slots.extend(self.alloc.append(sid, len(a)))
            pos.append(np.arange(start, start + len(a)))
            used.append(start + len(a))
            cu.append(cu[-1] + len(a))
        slots = np.asarray(slots, dtype=np.int64)
        pos = np.concatenate(pos)
        table = self.alloc.block_table(seqs)
        cu = np.asarray(cu, np.int32)
        used = np.asarray(used, np.int32)
        H, Hk, D, eps = c.num_heads, c.num_kv_heads, c.head_dim, c.rms_norm_eps
        x = m.embed[toks]
        for i, L in enumerate(m.layers):
            h = _rmsnorm(x, L.in_norm, eps)
            q = h @ L.wq.T
            k = h @ L.wk.T
            v = h @ L.wv.T
            if L.bq is not None:
                q += L.bq
                k += L.bk
                v += L.bv
            q, k, v = q.reshape(n, H, D), k.reshape(n, Hk, D), v.reshape(n, Hk, D)
            if L.q_norm is not None:
                q = _rmsnorm(q, L.q_norm, eps)
                k = _rmsnorm(k, L.k_norm, eps)
            q, k = m.rope(q, pos), m.rope(k, pos)
            if self.observer is not None:
                self.observer(i, k, v)
            t0 = time.perf_counter()
            if i in self._tq:
                vt.turboquant_store(k, v, self._tq[i], slots, self.turboquant)
                if self.turboquant_prefill == "vllm":
                    o = tq_prefill.attend(q, k, v, self._tq[i], self.turboquant, cu=cu, used=used, table=table,
                                          softmax_scale=D ** -0.5, window_size=self._window,
                                          num_threads=self.num_threads)
                else:
                    o = vt.turboquant_attention(q, self._tq[i], cu_seqlens_q=cu, seqused_k=used, block_table=table,
                                                kv_cache_dtype=self.turboquant, softmax_scale=D ** -0.5,
                                                causal=True, window_size=self._window, num_threads=self.num_threads)
            elif i in self._nv:
                (kc, vc), (ks, vs) = self._nv[i], self._nv_scales
                vt.reshape_and_cache_flash(k, v, kc, vc, slots, self.nvfp4, ks, vs)
                o = vt.flash_attn_varlen_func(q, kc, vc, cu_seqlens_q=cu, seqused_k=used, block_table=table,
                                              softmax_scale=D ** -0.5, causal=True, window_size=self._window,
                                              k_descale=ks, v_descale=vs, kv_cache_dtype=self.nvfp4,
                                              num_threads=self.num_threads)
            else:
                self.cache.store(i, k, v, slots, num_threads=self.num_threads)
                kd, vd = self._descale[i]
                o = vt.flash_attn_varlen_func(q, self._kc[i], self._vc[i], cu_seqlens_q=cu, seqused_k=used,
                                              block_table=table, softmax_scale=D ** -0.5, causal=True,
                                              window_size=self._window, k_descale=kd, v_descale=vd,
                                              kv_cache_dtype=self.attn_dtype, num_threads=self.num_threads,
                                              **self._scale_caches[i])
            self.attention_s += time.perf_counter() - t0
            x = x + o.reshape(n, H * D) @ L.wo.T
            h = _rmsnorm(x, L.post_norm, eps)
            x = x + (_silu(h @ L.wg.T) * (h @ L.wu.T)) @ L.wd.T
        return x
