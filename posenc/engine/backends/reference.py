"""``reference``: materialise ``[B,H,Nq,Nk]`` scores; per pair pick the branch whose region holds it,
add biases and content-relative terms, mask, softmax. Short and readable: the ground truth, and the
training path (autograd) at short lengths. Runs every call."""

from __future__ import annotations

from posenc.engine.backends.base import Backend
from posenc.engine.call import AttentionCall
from posenc.engine.scores import content_mask, finish, scores_tile


class Reference(Backend):
    name = "reference"
    learned_sinks = True
    content_selection = True

    def run(self, call: AttentionCall):
        scores = scores_tile(call)  # [B,H,Nq,Nk]
        allowed = call.parts.allowed(call.q_pos[:, None, :, None], call.k_pos[:, None, None, :])  # [B,1,Nq,Nk]
        if call.key_mask is not None:
            allowed = allowed & call.key_mask[:, None, None, :]
        chosen = content_mask(call, call.q, call.q_pos)  # InfLLM / DuoAttention: [B,H|1,Nq,Nk], or None
        if chosen is not None:
            allowed = allowed & chosen
        return finish(call.parts, scores, allowed, call.v, call.q, call.k, call.q_pos, call.k_pos, call.q_scale,
                      sink_logits=call.sink_logits)
