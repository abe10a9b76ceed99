"""Hugging Face transformers as an independent reference (torch CPU, float32)."""

from __future__ import annotations

import numpy as np


def hf_logits(model_dir, tokens) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation="eager")
    m.eval()
    with torch.no_grad():
        out = m(torch.tensor([list(tokens)], dtype=torch.long)).logits[0]
    return out.float().numpy()
