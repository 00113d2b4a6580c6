"""Per-layer rules of :func:`posenc.hf.extend`: which scheme each attention layer of a transformers model runs.

Every attention layer goes through posenc's engine once a model is extended (the rotary modules return
the identity rotation for all of them), so each layer gets the scheme that reproduces what transformers
computed for it, and the posenc method on top where it applies:

- **rope parameters per layer type** (Gemma 3, Olmo 3, MiMo-V2-Flash, Laguna, ...:
  ``config.rope_parameters = {"full_attention": {...}, "sliding_attention": {...}}``): a layer's base scheme
  is built from the parameters of its own type (``config.layer_types[layer_idx]``). The method applies to
  the layers whose type is in ``layer_types`` (default on such models: the global layer types that have
  RoPE, ``("full_attention",)`` on Gemma 3, whose recipe extends its global layers only while the local
  sliding layers keep their base and window; where the global layers are NoPE, as on Beam, the types
  that have RoPE: :func:`default_target_types`);
- **NoPE layers** (Llama 4's ``no_rope_layers``, SmolLM 3; a module with ``use_rope = False``) run without
  rotation and without the method (Llama 4's query temperature tuning stays in its attention module);
- **chunked attention** (Llama 4, layer type ``"chunked_attention"``): ``config.attention_chunk_size``;
- **MLA** (DeepSeek V2/V3 and derivatives: ``qk_nope_head_dim + qk_rope_head_dim`` per head): only the
  ``qk_rope_head_dim`` slice is rotated; the shared rope key reaches attention already expanded per head;
- **complex rotary** (Llama 4, DeepSeek V2: ``freqs_cis`` multiplies adjacent pairs) and GPT-J / CodeGen's
  ``rotate_every_two`` (on the first ``rotary_dim`` dims, with ``(sin, cos)`` returned sin first):
  interleaved layout;
- **-theta rotation** (NanoChat's ``rotate_half``): the half layout on half-swapped q and k
  (:data:`NEGATED_LAYOUT`);
- **Mistral 3's** ``llama_4_scaling_beta`` is a query scale its attention module applies itself (left out
  of the frequency schedule);
- **DeepSeek sparse attention** (DeepSeek V3.2, GLM-MoE-DSA, A.X-K2): the lightning indexer keeps its
  own real rotation and gets the causal + padding mask; its top-k selection restricts the engine's keys
  per query (:mod:`posenc.hf.sparse`).

Families whose attention reads the 4-D mask itself (Doge's dynamic mask) are refused with a
``ValueError`` naming the missing piece (:data:`REFUSED`, :data:`REFUSED_MODULE_ATTRS`). Learned
attention sinks (GPT-OSS, MiMo-V2-Flash, HY V4: ``s_aux``, a per-head logit in the softmax denominator)
are the engine's ``sink_logits``.
"""

from __future__ import annotations

import torch

# rope_parameters keys that are no part of the frequency schedule: the attention module applies them
_NOT_SCHEDULE = ("llama_4_scaling_beta",)
_SLIDING_LAYER_TYPES = ("sliding_attention", "hybrid_sliding", "reference_sliding_attention")
DEFAULT_TYPE = "full_attention"
UNKNOWN_LAYOUT = "unknown"
# half-layout pairs rotated by -theta (NanoChat): the engine rotates the half-swapped q and k by +theta
NEGATED_LAYOUT = "half_negated"

# model_type -> what posenc's path lacks for it
REFUSED = {
    "deepseek_v4": "compressed attention (its rope_parameters are keyed 'main'/'compress', its keys are "
                   "compressed across positions)",
    "doge": "dynamic mask attention (the attention module builds its own mask from the 4-D attention mask)",
}
# an attention module attribute -> what posenc's path lacks for it
REFUSED_MODULE_ATTRS: dict[str, str] = {}  # (none today; DeepSeek's indexer and learned sinks are supported)


def is_nested(config) -> bool:
    rp = getattr(config, "rope_parameters", None) or {}
    return any(isinstance(v, dict) or v is None for v in rp.values()) and "rope_theta" not in rp


def rope_parameters(config, layer_type: str | None = None) -> dict | None:
    """The flat rope parameters of one layer type (``None``: a type without RoPE). On a model with
    parameters per layer type, ``layer_type=None`` means :data:`DEFAULT_TYPE`, or the first layer type
    with RoPE when the model has no such type."""
    rp = getattr(config, "rope_parameters", None) or {}
    if is_nested(config):
        key = layer_type or DEFAULT_TYPE
        if layer_type is None and key not in rp:  # no full_attention type (ZAYA's 'hybrid', Dots3's
            # 'indexed_attention'): the first layer type, in layer order, that has RoPE
            order = list(getattr(config, "layer_types", None) or []) + list(rp)
            key = next((t for t in order if rp.get(t) is not None), key)
        if key not in rp:
            raise ValueError(f"{config.model_type}: rope_parameters are given per layer type {sorted(rp)}; "
                             f"none for {key!r}")
        rp = rp[key]
        if rp is None:
            return None
    return {k: v for k, v in rp.items() if k not in _NOT_SCHEDULE}


def layer_type_of(config, module) -> str:
    types = getattr(config, "layer_types", None)
    idx = module.layer_idx
    return types[idx] if types is not None and idx < len(types) else DEFAULT_TYPE


def layer_window(config, module) -> int | None:
    """The sliding window of one attention layer, as transformers' ``DynamicCache`` decides it (its
    sliding cache layers keep only the last ``window - 1`` keys): the module's own ``sliding_window``
    if it has one, else ``config.layer_types[layer_idx]`` names a sliding layer, else (no
    ``layer_types``) ``config.sliding_window`` applies to every layer. Models whose attention ignores
    ``sliding_window`` while their cache truncates (Phi-MoE, Moshi) thus get one meaning, cached or not."""
    own = getattr(module, "sliding_window", None)
    if own:
        return int(own)
    window = getattr(config, "sliding_window", None)
    if not window:
        return None
    types = getattr(config, "layer_types", None)
    if types is None:
        return int(window)
    idx = module.layer_idx
    return int(window) if idx < len(types) and types[idx] in _SLIDING_LAYER_TYPES else None


CHUNKED_LAYER_TYPE = "chunked_attention"  # transformers' config.layer_types entry (Llama 4), not a posenc method


def layer_chunk(config, module) -> int | None:
    """Llama 4's chunked attention: ``attention_chunk_size`` on layers of type ``"chunked_attention"``."""
    if layer_type_of(config, module) != CHUNKED_LAYER_TYPE:
        return None
    chunk = getattr(config, "attention_chunk_size", None)
    return int(chunk) if chunk else None


def uses_rope(config, module) -> bool:
    """False for a NoPE layer: ``use_rope = False`` on the module (Llama 4, SmolLM 3), a layer type
    whose rope parameters are ``None``, or a ``forward`` that rotates only under a condition on the
    module that is false for this layer (:func:`rotates_in_forward`: EXAONE 4's global NoPE layers,
    AFMoE's full layers)."""
    if getattr(module, "use_rope", True) is False or getattr(module, "use_rope", True) == 0:
        return False
    if is_nested(config) and rope_parameters(config, layer_type_of(config, module)) is None:
        return False
    return rotates_in_forward(module) is not False


def rotates_in_forward(module) -> bool | None:
    """Whether the module's ``forward`` calls ``apply_rotary_pos_emb`` (or a variant: a function named
    ``apply_rotary*`` / ``apply_rope*``), judged from its source. A call counts unless an ``if`` around it
    whose test reads only ``self`` excludes it on this module (``if self.sliding_window is None or
    self.is_sliding:``, EXAONE 4; ``if self.is_local_attention:``, AFMoE; a call in the ``else`` branch
    needs the test false). False: every call excluded (a NoPE layer); True: some call runs (Gemma 3n's
    KV-shared layers rotate q outside ``if self.is_kv_shared_layer:`` and only k inside its ``else``);
    None: no call found or no readable source. Tests on other names (``position_embeddings is not
    None``) are not evaluated: taken as true."""
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(type(module).forward)))
    except (OSError, TypeError, SyntaxError):
        return None

    def is_rope_call(n) -> bool:
        return isinstance(n, ast.Call) and str(getattr(n.func, "id", getattr(n.func, "attr", ""))).startswith(
            ("apply_rotary", "apply_rope"))

    def verdict(test) -> bool | None:  # the test's value on this module, None when not decidable
        if not {n.id for n in ast.walk(test) if isinstance(n, ast.Name)} <= {"self"}:
            return None
        try:
            return bool(eval(compile(ast.Expression(test), "<rope condition>", "eval"), {}, {"self": module}))
        except Exception:  # an attribute this module lacks
            return None

    found, active = False, False

    def visit(node, reachable: bool) -> None:
        nonlocal found, active
        if is_rope_call(node):
            found, active = True, active or reachable
        if isinstance(node, ast.If):
            cond = verdict(node.test)
            visit(node.test, reachable)
            for child in node.body:
                visit(child, reachable and cond is not False)
            for child in node.orelse:
                visit(child, reachable and cond is not True)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, reachable)

    visit(tree, True)
    return active if found else None


def mla_nope_dims(module) -> int:
    """MLA (DeepSeek V2/V3, ...): the ``qk_nope_head_dim`` leading dims of each head are not rotated."""
    nope, rope = getattr(module, "qk_nope_head_dim", None), getattr(module, "qk_rope_head_dim", None)
    return int(nope) if nope and rope else 0


def _calls_attention_interface(module) -> bool:
    """Whether the module's ``forward`` dispatches through transformers' attention interface (read from its
    source; True when the source cannot be read)."""
    import inspect

    try:
        src = inspect.getsource(type(module).forward)
    except (OSError, TypeError):
        return True
    # (not merely "_attn_implementation": Falcon's eager module reads it to choose between SDPA and its own
    # matmul, and never calls the interface)
    return any(word in src for word in ("ALL_ATTENTION_FUNCTIONS", "attention_interface"))


def interface_modules(attention_modules) -> list:
    """The attention modules that call transformers' attention interface (MiniMax's lightning attention
    layers, linear attention without RoPE, compute their own and are left alone)."""
    return [m for m in attention_modules if _calls_attention_interface(m)]


def check_family(model, attention_modules) -> None:
    """Refuse a family whose attention posenc's path cannot reproduce (``ValueError``)."""
    model_type = getattr(model.config, "model_type", "")
    reason = REFUSED.get(model_type)
    for attr, why in REFUSED_MODULE_ATTRS.items():
        if reason is None and any(getattr(m, attr, None) is not None for m in attention_modules):
            reason = why
    if reason is None and not any(_calls_attention_interface(m) for m in attention_modules):
        reason = ("attention modules that compute attention themselves instead of calling transformers' "
                  "AttentionInterface (the rotation posenc removes would not be applied anywhere)")
    if reason:
        raise ValueError(f"{type(model).__name__} ({model_type}): posenc.hf.extend does not support {reason}")


def _rotary_out(mod, positions):
    ref = next(iter(mod.buffers()), None)
    device = ref.device if ref is not None else "cpu"
    try:
        with torch.no_grad():
            return mod(torch.zeros(1, 1, 1, device=device), positions.to(device))
    except (TypeError, RuntimeError, KeyError, AttributeError, ValueError):  # other signatures (Gemma 3)
        return None


def _layout_of_apply(mod, apply, cos, sin, positions) -> str | None:
    """Which layout ``apply(q, k, cos, sin)`` (the family's own ``apply_rotary_pos_emb``) rotates with."""
    from posenc.parts.rotary import apply_rope

    inv = getattr(mod, "inv_freq", None)
    if inv is None or cos.shape[-1] != 2 * inv.shape[-1]:
        return None
    g = torch.Generator(device="cpu").manual_seed(0)  # the same probe on every device: drawn on the host, moved
    q = torch.randn(1, 1, positions.shape[-1], cos.shape[-1], generator=g, device="cpu").to(cos.device)
    try:
        with torch.no_grad():
            got = apply(q, q.clone(), cos, sin)[0]
    except (TypeError, RuntimeError, ValueError, IndexError):
        return None
    from posenc.hf.attention import swap_rotary_halves

    scale = float(getattr(mod, "attention_scaling", 1.0) or 1.0)
    pos, rd = positions.to(q.device), q.shape[-1]
    wants = {layout: apply_rope(q.double(), pos, inv.double(), layout=layout) for layout in ("half", "interleaved")}
    wants[NEGATED_LAYOUT] = swap_rotary_halves(apply_rope(swap_rotary_halves(q.double(), rd), pos, inv.double()), rd)
    for layout, want in wants.items():
        if torch.allclose(got.double(), want * scale, atol=1e-4):
            return layout
    return UNKNOWN_LAYOUT  # it rotated, but none of the ways posenc can reproduce


def sin_first(mod) -> bool:
    """Whether the rotary module returns ``(sin, cos)`` rather than ``(cos, sin)`` (GPT-J, CodeGen): its
    first output is 0 and its second 1 at position 0."""
    ref = next(iter(mod.buffers()), None)  # the position on the module's own device
    out = _rotary_out(mod, torch.zeros(1, 1, dtype=torch.long, device=ref.device if ref is not None else "cpu"))
    if not (isinstance(out, tuple) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out)):
        return False
    return bool((out[0] == 0).all()) and bool((out[1] == 1).all()) and out[0].numel() > 0


def _layout_of_tensor_apply(mod, apply, out, positions) -> str | None:
    """Which layout ``apply(tensor, sin=..., cos=...)`` rotates with: GPT-J's and CodeGen's
    ``apply_rotary_pos_emb`` rotates one ``tensor [B,N,H,R]`` by ``sin, cos [B,N,R/2]`` (one entry per
    pair), which their rotary module returns sin first. The frequencies are read back from the angles
    at position 1 (the module has no ``inv_freq``: a table of sines and cosines)."""
    import inspect

    try:
        names = list(inspect.signature(apply).parameters)
    except (TypeError, ValueError):
        return None
    if len(names) != 3 or names[1:] != ["sin", "cos"] or not sin_first(mod):
        return None
    sin, cos = out
    if sin.dim() != 3 or sin.shape != cos.shape or sin.shape[1] < 2:
        return None
    inv = torch.atan2(sin[0, 1].double(), cos[0, 1].double())  # [R/2]: position 1's angles
    g = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(1, positions.shape[-1], 1, 2 * inv.shape[-1], generator=g, device="cpu").to(sin.device)
    try:
        with torch.no_grad():
            got = apply(q, sin=sin, cos=cos)
    except (TypeError, RuntimeError, ValueError, IndexError):
        return None
    if got.shape != q.shape:
        return None
    from posenc.hf.attention import swap_rotary_halves
    from posenc.parts.rotary import apply_rope

    pos, rd, qh = positions.to(q.device), q.shape[-1], q.double().transpose(1, 2)  # [B,H,N,R] for apply_rope
    wants = {layout: apply_rope(qh, pos, inv, layout=layout) for layout in ("half", "interleaved")}
    wants[NEGATED_LAYOUT] = swap_rotary_halves(apply_rope(swap_rotary_halves(qh, rd), pos, inv), rd)
    for layout, want in wants.items():
        if torch.allclose(got.double(), want.transpose(1, 2), atol=1e-4):
            return layout
    return UNKNOWN_LAYOUT


def probe_layout(rotary_modules, attention_modules) -> str:
    """The pair layout the model rotates with: ``"interleaved"`` when a rotary module returns complex
    ``freqs_cis`` (Llama 4, DeepSeek V2) or when the family's ``apply_rotary_pos_emb`` rotates adjacent
    pairs (Cohere, GLM 4: probed on random q at a few positions; GPT-J and CodeGen, whose
    ``apply_rotary_pos_emb(tensor, sin, cos)`` rotates one tensor: :func:`_layout_of_tensor_apply`),
    :data:`NEGATED_LAYOUT` when it rotates
    half-layout pairs by ``-theta`` (NanoChat's ``rotate_half`` is ``cat(x2, -x1)``; the engine keeps
    ``"half"`` and runs on half-swapped q and k, :func:`posenc.hf.attention.swap_rotary_halves`), else
    ``"half"``. A family whose own rotation matches none of these is refused (``ValueError``)."""
    import sys

    positions = torch.arange(5, device="cpu")[None]  # [1,5], moved to each rotary module's device (_rotary_out)
    module = sys.modules.get(type(attention_modules[0]).__module__) if attention_modules else None
    apply = getattr(module, "apply_rotary_pos_emb", None)
    for mod in rotary_modules:
        out = _rotary_out(mod, positions)
        if isinstance(out, torch.Tensor) and out.is_complex():
            return "interleaved"
        if isinstance(out, tuple) and len(out) == 2 and apply is not None:
            found = _layout_of_apply(mod, apply, out[0], out[1], positions)
            if found is None:  # GPT-J / CodeGen: one tensor, (sin, cos) of one entry per pair
                found = _layout_of_tensor_apply(mod, apply, out, positions)
            if found == UNKNOWN_LAYOUT:
                raise ValueError(f"{module.__name__.rsplit('.', 1)[-1]}: its apply_rotary_pos_emb rotates neither "
                                 "half nor interleaved pairs by +theta, nor half pairs by -theta; "
                                 "posenc.hf.extend does not support that rotation")
            if found is not None:
                return found
    return "half"


def rope_layer_types(config) -> list[str]:
    """The layer types of a model with rope parameters per layer type whose parameters are not ``None``
    (the types that rotate), in the order ``config.layer_types`` first names them."""
    rp = getattr(config, "rope_parameters", None) or {}
    types = dict.fromkeys(getattr(config, "layer_types", None) or [DEFAULT_TYPE])
    return [t for t in types if isinstance(rp.get(t), dict)]


def default_target_types(config) -> tuple[str, ...] | None:
    """The layer types a method applies to when ``layer_types`` is not given.

    On a model with rope parameters per layer type: its *global* layer types that have RoPE (types that
    are neither sliding nor chunked; Gemma 3's recipe extends the global ``full_attention`` layers, the
    local layers keep their base and window: they never see a distance past their window), and when no
    global type has RoPE (Beam: NoPE global layers, RoPE sliding layers) every type that has RoPE, since
    a method on no layer at all would extend nothing. On any other model every RoPE layer (``None``):
    its layers share one rotary schedule."""
    if not is_nested(config):
        return None
    with_rope = rope_layer_types(config)
    local = (*_SLIDING_LAYER_TYPES, CHUNKED_LAYER_TYPE)
    chosen = [t for t in with_rope if t not in local] or with_rope
    return tuple(chosen) or None


def target_types(config, layer_types) -> tuple[str, ...] | None:
    """The layer types a method applies to: ``layer_types`` as given (checked against the config), else
    :func:`default_target_types` (``None``: every layer that has RoPE)."""
    known = set(getattr(config, "layer_types", None) or [DEFAULT_TYPE])
    if layer_types is None:
        return default_target_types(config)
    if isinstance(layer_types, str) or not all(isinstance(t, str) for t in layer_types) or not layer_types:
        raise ValueError(f"layer_types must be a non-empty list of layer type names, got {layer_types!r}")
    unknown = sorted(set(layer_types) - known)
    if unknown:
        raise ValueError(f"layer_types {unknown} are not layer types of this model; it has {sorted(known)}")
    return tuple(layer_types)


def local_windows(config) -> tuple[int, ...]:
    """The sliding windows of a local/global hybrid's local layers (``config.layer_types`` entries of a sliding type
    with ``config.sliding_window`` no wider than the trained length), sorted; ``()`` for a model without such
    layers (every layer global, or one window on every layer as Mistral 7B v0.1 has, whose layers have no types)."""
    types = getattr(config, "layer_types", None) or ()
    window = getattr(config, "sliding_window", None)
    trained = getattr(config, "max_position_embeddings", None)
    if not window or not any(t in _SLIDING_LAYER_TYPES for t in types):
        return ()
    return (int(window),) if trained is None or int(window) <= int(trained) else ()


def check_local_targets(config, modules, layer_types, method: str, train_len: int) -> None:
    """``ValueError`` naming ``method`` and the layer type when ``layer_types`` (as the user chose them) put a
    method on local layers: layers of a sliding type (:data:`_SLIDING_LAYER_TYPES`) whose window is no wider than
    the trained length ``train_len``.

    Why: such a layer never sees a key more than ``window - 1`` positions back, a distance it was trained on; RoPE
    and every remap depend on the distance only, so any extension there changes what the layer computes inside its
    trained range and extends nothing (a method's own window wider than the layer's does nothing either). On a
    local/global hybrid (Gemma 3: window 512, trained at 32k) the methods belong on the global layers, which is
    the default. A layer whose window is wider than ``train_len`` reads distances it was not trained on and may
    take a method."""
    chosen = set(layer_types)
    for m in modules:
        ltype, window = layer_type_of(config, m), layer_window(config, m)
        if ltype in chosen and ltype in _SLIDING_LAYER_TYPES and window is not None and window <= train_len:
            raise ValueError(f"method {method!r} cannot go on layer type {ltype!r}: its layers attend within a "
                             f"sliding window of {window} tokens, inside the trained length {train_len}, so they never "
                             "read a distance to extend (the method would only change what they were trained on); "
                             "leave layer_types out to extend the global layers")
