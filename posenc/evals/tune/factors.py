"""LongRoPE's per-dimension rescale factors and their evolutionary search (Ding et al. 2024, arXiv:2402.13753,
Sec. 3.2 and Algorithm 1; LongRoPE2, arXiv:2502.20082, drives the search by needle retrieval).

RoPE rotates dimension pair ``i`` (``0 <= i < d/2``) at ``theta_i = base^(-2i/d)``. LongRoPE rescales each pair
by its own factor ``lambda_i >= 1``: ``theta_i' = theta_i / lambda_i``, which is what transformers' ``longrope``
rope type computes from ``long_factor = [lambda_0, ..., lambda_{d/2-1}]`` beyond the trained length. Every known
rule is such a vector, so the search starts from them (:func:`initial_factors`):

- PI (arXiv:2306.15595): ``lambda_i = s``;
- NTK-aware (base ``b * s^(d/(d-2))``): ``lambda_i = s^(2i/(d-2))``, 1 on the fastest pair and ``s`` on the slowest;
- YaRN (arXiv:2309.00071, Eq. 17-18): ``lambda_i = 1 / ((1 - gamma_i) / s + gamma_i)`` with the ramp ``gamma_i``
  from 0 on the pairs that turn fewer than ``beta_slow = 1`` times over ``L`` to 1 on those that turn more than
  ``beta_fast = 32`` times (transformers' pair-index ramp).

Each vector is read off posenc's own frequencies (:func:`posenc.parts.frequencies.rope_frequencies`, the same
as transformers'), so a rule's vector run as ``longrope`` rotates exactly like the rule.

The search space keeps LongRoPE's constraint: the factors never decrease with ``i`` (lower frequencies are
interpolated at least as much as higher ones, the paper's ``lambda_i <= lambda_{i+1}``), and stay in
``[1, max_factor]``. :func:`evolve` is Algorithm 1: an initial population of the rule vectors and their
mutations; each generation keeps the best ``parents``, breeds children by crossover (each pair from either
parent) and mutation (a random subset of pairs multiplied by ``exp(N(0, sigma))``), puts the child back on the
constraint with a running maximum over ``i`` (a child that breaks the order is not drawn again: for 32 pairs
almost none would pass), discards a child that repeats an evaluated vector (drawing again, up to a limit), and
stops when the budget of evaluations is spent. Factors are rounded to 4 decimals so an evaluated vector is
recognised again (and cached).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from posenc._util import check_positive_int

__all__ = ["INIT_RULES", "evolve", "initial_factors", "is_monotone"]

INIT_RULES = ("pi", "ntk", "yarn")


def initial_factors(rule: str, factor: float, head_dim: int, base: float, train_len: int) -> np.ndarray:
    """The ``lambda`` vector ``[head_dim/2]`` of rule ``pi``, ``ntk`` or ``yarn`` for the scale ``factor`` (module
    docstring). Non-decreasing, within ``[1, factor]``."""
    if rule not in INIT_RULES:
        raise ValueError(f"rule must be one of {list(INIT_RULES)}, got {rule!r}")
    if not isinstance(factor, (int, float)) or not factor >= 1:
        raise ValueError(f"factor must be a number >= 1, got {factor!r}")
    head_dim = check_positive_int("head_dim", head_dim, minimum=4)
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    from posenc.methods import METHODS
    from posenc.parts.frequencies import default_inv_freq, rope_frequencies

    rope_type = METHODS[rule].scaling_type  # the schedule the method writes (PI: "linear")
    scaling = {"rope_type": rope_type, "factor": float(factor), "original_max_position_embeddings": int(train_len)}
    inv = rope_frequencies(head_dim, float(base), scaling).inv_freq.double().numpy()
    lam = default_inv_freq(head_dim, float(base)).double().numpy() / inv  # theta_i / theta_i'
    return np.round(np.clip(lam, 1.0, float(factor)), 4)


def is_monotone(lam, max_factor: float | None = None) -> bool:
    """LongRoPE's constraint: ``1 <= lambda_0 <= lambda_1 <= ... (<= max_factor)``."""
    lam = np.asarray(lam, dtype=np.float64)
    ok = bool(np.all(np.diff(lam) >= 0) and lam.min() >= 1.0)
    return ok and (max_factor is None or bool(lam.max() <= max_factor))


def _mutate(rng: np.random.Generator, lam: np.ndarray, rate: float, sigma: float, hi: float) -> np.ndarray:
    pick = rng.random(lam.shape) < rate
    if not pick.any():
        pick[rng.integers(len(lam))] = True
    out = lam * np.exp(np.where(pick, rng.normal(0.0, sigma, lam.shape), 0.0))
    return np.round(np.clip(out, 1.0, hi), 4)


def _crossover(rng: np.random.Generator, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(rng.random(a.shape) < 0.5, a, b)


def _child(rng, parents: list[np.ndarray], seen: set, rate: float, sigma: float, hi: float,
           tries: int = 200) -> np.ndarray | None:
    """A new monotone vector from the parents (crossover of two, then mutation, then the running maximum, which
    puts it back on the constraint), or None after ``tries`` draws that all repeat a vector already seen.

    The running maximum is this implementation's way to keep the constraint: drawing again until a child happens
    to be monotone (rejection) almost never succeeds for 32 factor pairs, since an element-wise crossover of PI's
    flat vector with NTK's ramp, or a mutation of one pair, breaks the order somewhere; with rejection, the
    SmolLM2 16k tune bred no child in 200 draws and evaluated only the three rule vectors."""
    for _ in range(tries):
        a = parents[rng.integers(len(parents))]
        b = parents[rng.integers(len(parents))]
        lam = np.round(np.clip(np.maximum.accumulate(_mutate(rng, _crossover(rng, a, b), rate, sigma, hi)), 1.0, hi),
                       4)
        key = tuple(lam.tolist())
        if key not in seen and is_monotone(lam, hi):
            return lam
    return None


def evolve(score: Callable[[np.ndarray], float], init: dict[str, np.ndarray], budget: int, *, max_factor: float,
           seed: int = 0, population: int = 8, parents: int = 3, rate: float = 0.3, sigma: float = 0.15,
           on_eval: Callable[[str, np.ndarray, float], None] | None = None) -> list[dict]:
    """LongRoPE's evolutionary search (module docstring) minimising ``score(lambda)`` with at most ``budget``
    evaluations. ``init``: named starting vectors (rule vectors); the first population is them plus mutations,
    ``population`` in all. Returns every evaluated candidate, best first: ``{"name", "factors", "score"}``
    (``name``: the rule, or ``gen<k>`` for a bred one). ``on_eval(name, factors, score)`` after each evaluation."""
    budget = check_positive_int("budget", budget)
    population = check_positive_int("population", population, minimum=2)
    parents = check_positive_int("parents", parents)
    rng = np.random.default_rng(seed)
    done: list[dict] = []
    seen: set = set()

    def run(name: str, lam: np.ndarray) -> None:
        lam = np.round(np.asarray(lam, dtype=np.float64), 4)
        if not is_monotone(lam, max_factor + 1e-9):
            raise ValueError(f"initial factors {name!r} break the constraint 1 <= lambda_i <= lambda_(i+1) <= "
                             f"{max_factor}")
        seen.add(tuple(lam.tolist()))
        s = float(score(lam))
        done.append({"name": name, "factors": lam.tolist(), "score": s})
        if on_eval is not None:
            on_eval(name, lam, s)

    for name, lam in init.items():
        if len(done) < budget:
            run(name, lam)
    starts = [np.asarray(v, dtype=np.float64) for v in init.values()]
    while len(done) < min(budget, population):  # the first population: the rules and their mutations
        lam = _child(rng, starts, seen, rate, sigma, max_factor)
        if lam is None:
            break
        run("init", lam)
    gen = 0
    while len(done) < budget:
        gen += 1
        best = sorted(done, key=lambda r: r["score"])[:parents]
        lam = _child(rng, [np.asarray(r["factors"]) for r in best], seen, rate, sigma, max_factor)
        if lam is None:
            break
        run(f"gen{gen}", lam)
    return sorted(done, key=lambda r: r["score"])
