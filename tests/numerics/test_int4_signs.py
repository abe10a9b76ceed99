"""The int4 twin's Hadamard signs (tests/numerics/rht_signs.txt) are torch's draws.

vLLM 0.33's ``_get_rht_signs(b, 0)`` is ``2 * torch.bernoulli(torch.full((b,),
0.5), generator) - 1`` with a CPU ``torch.Generator`` seeded 0x9E3779B9. The
twin reads them from the checked-in file so that the int4 tests run without
torch; with torch installed (CI's second pass sets VTINFER_REQUIRE_TORCH=1)
they are drawn again here, for every power-of-two block size the format uses.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.numerics import int4_twin


def test_the_checked_in_signs_are_a_plus_minus_one_vector_of_1024():
    s = int4_twin.signs(1024)
    assert s.dtype == np.float32 and s.shape == (1024,)
    assert set(np.unique(s).tolist()) == {-1.0, 1.0}
    assert np.array_equal(int4_twin.signs(16), s[:16])
    for bad in (0, 1025):
        with pytest.raises(ValueError, match=r"signs: b must be in \[1, 1024\]"):
            int4_twin.signs(bad)


@pytest.mark.parametrize("b", [1 << k for k in range(11)])
def test_the_checked_in_signs_equal_torchs_draws(b):
    torch = pytest.importorskip("torch")
    gen = torch.Generator(device="cpu")
    gen.manual_seed(0x9E3779B9)
    drawn = (2.0 * torch.bernoulli(torch.full((b,), 0.5), generator=gen) - 1.0).numpy().astype(np.float32)
    assert np.array_equal(int4_twin.signs(b), drawn), (
        f"torch {torch.__version__} draws other signs for b={b}: update tests/numerics/rht_signs.txt "
        "and csrc/core/kv_store_int4.c's rht_sign_bits, and record the torch version")
