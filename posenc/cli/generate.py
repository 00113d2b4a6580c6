"""``posenc generate``: decode from a checkpoint with the KV cache (:func:`posenc.models.generation.generate`),
or stream a long input through StreamingLLM (:func:`posenc.models.generation.stream_tokens`)."""

from __future__ import annotations

import argparse
import sys
import time

from posenc.cli._common import add_param, parse_params


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate text from a checkpoint (KV cache), or stream with StreamingLLM")
    p.add_argument("ckpt", help="run directory (config.json + model.safetensors)")
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--method", "--scheme", dest="method", default=None,
                   help="inference-time method applied to the checkpoint's scheme (e.g. yarn, rerope+logn)")
    add_param(p)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stream", action="store_true",
                   help="run StreamingLLM over the prompt repeated to --stream-tokens; report tokens/s and memory")
    p.add_argument("--stream-tokens", type=int, default=10000)
    p.add_argument("--chunk", type=int, default=64, help="tokens per forward when streaming")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from posenc._util import check_positive_int
    from posenc.lab.checkpoint import load_run

    check_positive_int("--max-new-tokens", args.max_new_tokens)  # checked before the model is loaded
    check_positive_int("--chunk", args.chunk)
    params = parse_params(args.param)
    model, tokenizer = load_run(args.ckpt)
    if args.stream:
        return _stream(args, model.with_scheme(args.method or "streaming_llm", **params), tokenizer)
    if args.method:
        model = model.with_scheme(args.method, **params)
    elif params:
        raise ValueError("--param needs --method")
    return _generate(args, model, tokenizer)


def _prompt_ids(args: argparse.Namespace, tokenizer) -> list[int]:
    ids = tokenizer.encode(args.prompt)
    if not ids:
        raise ValueError("--prompt must not be empty")
    return ids


def _stream(args: argparse.Namespace, model, tokenizer) -> int:
    """The prompt repeated to ``--stream-tokens`` tokens, fed ``--chunk`` at a time; prints tokens/s,
    the mean loss and the resident memory."""
    from posenc._util import check_positive_int
    from posenc.models.generation import resident_memory_bytes, stream_tokens

    ids = _prompt_ids(args, tokenizer)
    n = check_positive_int("--stream-tokens", args.stream_tokens)
    stream = (ids[i % len(ids)] for i in range(n))
    t0, total, count = time.perf_counter(), 0.0, 0
    for loss in stream_tokens(model, stream, chunk=args.chunk):
        if loss == loss:  # not NaN
            total, count = total + loss, count + 1
    dt = time.perf_counter() - t0
    print(f"streamed {n} tokens with {model.scheme.name}: {n / dt:.1f} tokens/s, mean loss "
          f"{total / max(count, 1):.4f}, RSS {resident_memory_bytes() / 2**20:.1f} MiB")
    return 0


def _generate(args: argparse.Namespace, model, tokenizer) -> int:
    """Print the prompt, then each new token's text as soon as it decodes."""
    import torch

    from posenc.models.generation import generate

    ids = _prompt_ids(args, tokenizer)
    new: list[int] = []
    printed = [0]

    def on_token(step, tok):
        new.append(int(tok[0]))
        text = tokenizer.decode(new)
        sys.stdout.write(text[printed[0]:])
        sys.stdout.flush()
        printed[0] = len(text)

    sys.stdout.write(args.prompt)
    generate(model, torch.tensor([ids]), args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
             top_p=args.top_p, seed=args.seed, stream=on_token, eos_token_id=getattr(tokenizer, "eos_id", None))
    sys.stdout.write("\n")
    return 0
