"""Training-time position ids: ways to train on short windows while covering a longer position range.

- :func:`pose_positions`: PoSE, positional skip-wise training (Zhu et al., arXiv:2309.10400). A window of
  ``L`` tokens is cut into ``N`` chunks (the paper's default ``N = 2``); chunk ``i`` keeps consecutive ids
  shifted by a skip bias ``u_i``, drawn uniformly from ``{u_{i-1}, ..., L_t - L}`` with ``u_0 = 0``, so the
  ids are ``{st_i + u_i, ..., st_i + l_i - 1 + u_i}`` (``st_i`` the chunk's start in the window) and every
  relative distance up to ``L_t - 1`` is seen while the window stays ``L`` tokens long.
- :func:`randomized_positions`: randomized positional encodings (Ruoss et al., ACL 2023, arXiv:2305.16843):
  the ``L`` ids of a row are a uniformly random ``L``-subset of ``{0, ..., L_t - 1}``, sorted ascending, so
  the order is kept and the model sees ids up to ``L_t - 1``.
- :func:`train_positions`: the ids of training batch ``step`` for a :class:`posenc.training.train.TrainConfig`'s
  ``positions`` option; they depend only on ``(seed, step)``, like the batch (:mod:`posenc.data.batches`), so a
  resumed run draws the same ids.

Evaluation always uses ids ``0..N-1``: both papers train this way to test on longer inputs with plain ids
(PoSE's Sec. 3; Ruoss et al. also sample at test time, which the lab does not, so its numbers are for plain ids).
"""

from __future__ import annotations

import numpy as np
import torch

from posenc._util import check_positive_int

POSITION_KINDS = ("contiguous", "pose", "randomized")


def _check(train_len: int, position_range: int) -> tuple[int, int]:
    train_len = check_positive_int("train_len", train_len)
    position_range = check_positive_int("position_range", position_range)
    if position_range < train_len:
        raise ValueError(f"position_range must be >= train_len ({train_len}), got {position_range}")
    return train_len, position_range


def pose_positions(rng: np.random.Generator, train_len: int, position_range: int, chunks: int = 2) -> np.ndarray:
    """PoSE position ids (arXiv:2309.10400, Sec. 3.2) of one ``train_len``-token window covering
    ``position_range`` = ``L_t``: chunk boundaries are ``chunks - 1`` distinct cut points drawn uniformly from
    ``{1, ..., L-1}`` (lengths ``l_i >= 1``); skip biases ``u_0 = 0``, ``u_i ~ U{u_{i-1}, ..., L_t - L}``; chunk
    ``i`` gets ids ``st_i + u_i + [0, l_i)``. Returns int64 ``[train_len]``, strictly increasing, last id
    ``<= L_t - 1``."""
    train_len, position_range = _check(train_len, position_range)
    chunks = check_positive_int("chunks", chunks)
    if chunks > train_len:
        raise ValueError(f"chunks must be in [1, train_len={train_len}], got {chunks}")
    cuts = np.sort(rng.choice(train_len - 1, size=chunks - 1, replace=False) + 1) if chunks > 1 else []
    starts = np.concatenate([[0], np.asarray(cuts, dtype=np.int64)])
    lengths = np.diff(np.concatenate([starts, [train_len]]))
    room = position_range - train_len  # the largest skip bias
    ids = np.empty(train_len, dtype=np.int64)
    u = 0
    for i, (st, n) in enumerate(zip(starts.tolist(), lengths.tolist())):
        if i:
            u = int(rng.integers(u, room + 1))  # U{u_{i-1}, ..., L_t - L}
        ids[st:st + n] = st + u + np.arange(n)
    return ids


def randomized_positions(rng: np.random.Generator, train_len: int, position_range: int) -> np.ndarray:
    """Randomized positional encodings (Ruoss et al. 2023, arXiv:2305.16843): ``train_len`` distinct ids drawn
    uniformly without replacement from ``{0, ..., position_range - 1}``, sorted ascending. Int64 ``[train_len]``."""
    train_len, position_range = _check(train_len, position_range)
    return np.sort(rng.choice(position_range, size=train_len, replace=False)).astype(np.int64)


def train_positions(kind: str, batch: int, train_len: int, position_range: int, seed: int, step: int, *,
                    chunks: int = 2, rank: int = 0) -> torch.Tensor | None:
    """Position ids ``[batch, train_len]`` of training batch ``step`` (rank ``rank``'s rows), drawn from
    ``np.random.default_rng([seed, step, 7919, rank])`` so they depend only on ``(seed, step, rank)``;
    ``None`` for ``kind="contiguous"`` (the model's own ``0..L-1``). ``kind`` is one of
    :data:`POSITION_KINDS`."""
    if kind not in POSITION_KINDS:
        raise ValueError(f"positions must be one of {list(POSITION_KINDS)}, got {kind!r}")
    if kind == "contiguous":
        return None
    rng = np.random.default_rng([int(seed), int(step), 7919, int(rank)])
    if kind == "pose":
        rows = [pose_positions(rng, train_len, position_range, chunks) for _ in range(batch)]
    else:
        rows = [randomized_positions(rng, train_len, position_range) for _ in range(batch)]
    return torch.from_numpy(np.stack(rows))  # [batch, train_len]
