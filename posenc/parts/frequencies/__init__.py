"""RoPE frequency schedules: one pure function per ``rope_type``, in the registry ``ROPE_SCALINGS``.

Every schedule maps ``(head_dim, rotary_dim, base, params, seq_len)`` to a :class:`RopeFrequencies`:
the inverse frequencies ``theta_i`` (RoPE rotates pair ``i`` of a vector at position ``m`` by
``m * theta_i``) and the attention scale that multiplies cos and sin (Hugging Face convention, so
``q . k`` is scaled by its square). Beside it each rope_type registers ``factor(params, seq_len)``, the
effective extension scale :func:`scaling_factor` reports.

``scaling`` is a dict in Hugging Face's ``rope_scaling`` / ``rope_parameters`` convention (plus posenc's
``resonance: true``, :mod:`posenc.parts.resonance`, on any rope_type), so a ``config.json`` block works::

    rope_frequencies(128, 500000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})

Conventions (all schedules):

- ``rotary_dim = int(head_dim * partial_rotary_factor)``; ``inv_freq`` has ``rotary_dim // 2``
  entries (``RopeFrequencies.rotary_dim`` gives it back). ``proportional`` is the one exception:
  it rotates the whole head and returns ``head_dim // 2`` entries, the last ones zero, as HF does.
- ``rope_theta`` / ``partial_rotary_factor`` inside ``scaling`` override the function arguments.
- Computed in float64, returned as float32.
- Where HF only warns about a bad config (factor < 1, missing keys, unknown keys, high <= low
  frequency factor, a NaN) we raise ``ValueError`` naming the key and its allowed range.
- ``seq_len`` is the number of positions the frequencies must serve (HF: ``max(position_ids) + 1``).
  Schedules whose result depends on it (``is_dynamic``) refuse ``seq_len=None``.

Modules: ``registry`` (the record, the registry and its decorator), ``shared`` (the default ladder, factor
and trained length read from params), ``config`` (parsing and checking the dict), ``api`` (the entry points),
and one module per family of schedules: ``basic`` (default, linear, base), ``ntk`` (ntk, ntk_mixed,
dynamic, dynamic_qwen), ``yarn`` (yarn, dynamic_yarn), ``llama3``, ``longrope``, ``proportional``.
"""

from __future__ import annotations

# importing a family registers its schedules
from posenc.parts.frequencies import basic, llama3, longrope, ntk, proportional, yarn  # noqa: F401
from posenc.parts.frequencies.api import is_dynamic, rope_frequencies, scaling_factor, validate_rope_scaling
from posenc.parts.frequencies.registry import ROPE_SCALINGS, RopeFrequencies
from posenc.parts.frequencies.shared import default_inv_freq
from posenc.parts.frequencies.yarn import yarn_correction_range

__all__ = ["ROPE_SCALINGS", "RopeFrequencies", "default_inv_freq", "is_dynamic", "rope_frequencies", "scaling_factor",
           "validate_rope_scaling", "yarn_correction_range"]
