"""Reference models on vtinfer's KV cache and attention.

- :class:`Decoder`: a Llama / Mistral / Qwen2 / Qwen3 / SmolLM decoder in
  NumPy whose KV cache is a :class:`vtinfer.PagedKVCache` and whose attention
  is :func:`vtinfer.flash_attn_varlen_func`; prefill, decode, greedy
  generation and teacher-forced scoring.
- :func:`convert_gguf`: GGUF -> checkpoint directory (``gguf`` and
  ``tokenizers`` packages; ``pip install 'vtinfer[demo]'``).
- :func:`calibrate`: per-layer / per-head K/V scales (``amax / 448``) written
  as an fp8 KV-cache checkpoint vLLM's resolver reads.
- :func:`run_demo`: the ``vtinfer demo`` evaluation.
"""

from vtinfer.models.calibrate import Calibration, calibrate, calibrate_amax, write_calibrated
from vtinfer.models.config import DecoderConfig
from vtinfer.models.decoder import Decoder, Generation, Session
from vtinfer.models.demo import format_report, run_demo
from vtinfer.models.evaltext import calibration_text, eval_text
from vtinfer.models.gguf_convert import convert_gguf, default_model_dir, find_default_gguf
from vtinfer.models.metrics import compare, perplexity
from vtinfer.models.store import cache_dir
from vtinfer.models.tiny import make_tiny_checkpoint

__all__ = [
    "Calibration", "Decoder", "DecoderConfig", "Generation", "Session", "cache_dir", "calibrate", "calibrate_amax",
    "calibration_text", "compare", "convert_gguf", "default_model_dir", "eval_text", "find_default_gguf",
    "format_report", "make_tiny_checkpoint", "perplexity", "run_demo", "write_calibrated",
]
