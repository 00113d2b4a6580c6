"""``band``: the LSE merge of the near piece (window) and the far piece (minimum distance) equals the reference."""

import pytest
import torch

from posenc import PositionScheme, attention
from posenc._util import relative_error
from tests.support.attention import _qkv

torch.manual_seed(0)


@pytest.mark.parametrize("method,params", [("rerope", {"window": 48}), ("leaky_rerope", {"window": 24, "factor": 4}),
                                           ("selfextend", {"group": 4, "window": 40}), ("rerope+logn", {"window": 32})])
@pytest.mark.parametrize("N", [30, 300])
def test_band_merge_equals_reference(method, params, N):
    """The LSE merge of the near piece (window) and the far piece (minimum distance), each on the fused
    CPU flash kernel through the Toeplitz view, equals the materialised reference: a full forward, a run
    of queries continuing a cache, and a sequence shorter than the window (no far piece)."""
    from posenc.engine.backends import BY_NAME
    from posenc.engine.dispatch import make_call, run_backend
    from posenc.engine.parts import parts_for

    s = PositionScheme.preset(method, train_len=64, **params)
    q, k, v = _qkv(N=N)
    parts = parts_for(s.to_json(), 4, 16)
    for q0 in (0, N - 130 if N > 130 else N // 2):
        qq = q[:, :, q0:]
        qp, kp = torch.arange(q0, N)[None].expand(2, -1), torch.arange(N)[None].expand(2, -1)
        call = make_call(parts, qq, k, v, qp, kp)
        assert BY_NAME["band"].why_not(call) is None
        ref = attention(qq, k, v, s, q_pos=qp, k_pos=kp, impl="reference")
        out = run_backend(BY_NAME["band"], call)
        assert relative_error(out, ref) <= 1e-5, (q0, relative_error(out, ref))
