"""Memory part: state carried across segments.

- :class:`InfiniMemory`: Infini-attention (Munkhdalai et al. 2024, arXiv 2404.07143). The input is
  cut into segments of ``segment_len``; inside a segment, ordinary (masked, positional) attention
  A_dot; across segments a compressive linear memory
      A_mem = sigma(Q) M_{s-1} / (sigma(Q) z_{s-1}),  sigma = ELU + 1,
      M_s = M_{s-1} + sigma(K)^T V,   z_s = z_{s-1} + sum_t sigma(K_t)        (the "linear" update)
  mixed by a learned per-head gate: A = sigmoid(beta) A_mem + (1 - sigmoid(beta)) A_dot.
  With an empty memory (M_0 = 0, z_0 = 0) A_mem is defined as 0, so on a single segment the
  output is (1 - sigmoid(beta)) A_dot.
- Transformer-XL's segment recurrence (Dai et al. 2019) lives in :mod:`posenc.models.tinylm`: the previous
  segment's hidden states become extra, gradient-stopped keys (``PositionalAttention(context=)``).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from posenc._util import check_positive_int


class InfiniMemory(nn.Module):
    """Infini-attention's compressive memory, Munkhdalai et al. 2024 (arXiv 2404.07143, sec. 2.1).

    Per segment ``s`` of ``segment_len`` tokens: ``A_mem = sigma(Q) M_{s-1} / (sigma(Q) z_{s-1})`` with
    ``sigma = ELU + 1``, then ``M_s = M_{s-1} + sigma(K)^T V`` and ``z_s = z_{s-1} + sum_t sigma(K_t)``
    (``delta_rule``: ``M_s = M_{s-1} + sigma(K)^T (V - A_mem(K))``, the paper's "linear + delta").
    Output ``sigmoid(beta) A_mem + (1 - sigmoid(beta)) A_dot`` with a learned gate ``beta [H]``;
    ``A_mem = 0`` on the first segment. ``forward``: q, k, v ``[B,H,N,D]`` -> ``[B,H,N,Dv]``.
    """

    def __init__(self, n_heads: int, head_dim: int, segment_len: int = 128, delta_rule: bool = False):
        super().__init__()
        self.segment_len = check_positive_int("infini.segment_len", segment_len)
        self.delta_rule = bool(delta_rule)
        self.beta = nn.Parameter(torch.zeros(n_heads))  # gate logit per head

    @staticmethod
    def _sigma(x):
        return F.elu(x) + 1.0

    def forward(self, q, k, v, positions, local_attention):
        """q, k, v ``[B,H,N,D]`` (k, v already expanded to H heads by the caller if GQA);
        ``local_attention(q, k, v, q_pos, k_pos)`` runs the scheme's attention inside a segment."""
        B, H, N, D = q.shape
        if k.shape[1] != H:
            k = k.repeat_interleave(H // k.shape[1], dim=1)
            v = v.repeat_interleave(H // v.shape[1], dim=1)
        mem = q.new_zeros(B, H, D, v.shape[-1])
        z = q.new_zeros(B, H, D)
        gate = torch.sigmoid(self.beta).to(q.dtype)[None, :, None, None]  # [1,H,1,1]
        outs = []
        for s in range(0, N, self.segment_len):
            e = min(N, s + self.segment_len)
            qs, ks, vs, ps = q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], positions[:, s:e]
            a_dot = local_attention(qs, ks, vs, ps, ps)
            sq, sk = self._sigma(qs), self._sigma(ks)
            if s == 0:
                a_mem = torch.zeros_like(a_dot)  # empty memory retrieves nothing
            else:
                denom = (sq @ z[..., None]).clamp_min(1e-6)  # [B,H,t,1]
                a_mem = (sq @ mem) / denom
            outs.append(gate * a_mem + (1 - gate) * a_dot)
            if self.delta_rule and s > 0:
                retrieved = (sk @ mem) / (sk @ z[..., None]).clamp_min(1e-6)
                mem = mem + sk.transpose(-1, -2) @ (vs - retrieved)
            else:
                mem = mem + sk.transpose(-1, -2) @ vs  # [B,H,D,Dv]
            z = z + sk.sum(dim=2)
        return torch.cat(outs, dim=2)


# kind -> attention-level memory module; None: a model-level memory (TinyLM runs XL's recurrence)
MEMORIES = {"infini": InfiniMemory, "xl_recurrence": None}
