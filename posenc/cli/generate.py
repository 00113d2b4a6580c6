"""``posenc generate RUN``: decode from a run folder with the KV cache (:func:`posenc.models.generation.generate`),
or stream a long input through StreamingLLM (:func:`posenc.models.generation.stream_tokens`)."""

from __future__ import annotations

import argparse
import sys
import time

from posenc.cli._common import (
    add_device,
    add_dtype,
    add_method,
    add_seed,
    deprecated,
    device_dtype,
    merge_old,
    params_from_args,
    subparser,
)


def add_parser(sub) -> None:
    p = subparser(sub, "generate", "generate text from a run folder (KV cache), or stream with StreamingLLM",
                  "Generate text from RUN (a run folder of `posenc train`) with the KV cache, printing each token as "
                  "it decodes; or, with --stream, feed the prompt repeated to --stream-tokens tokens through the "
                  "model under StreamingLLM (or --method) and report tokens/s, the mean loss and the memory.")
    p.add_argument("run", metavar="RUN", help="run folder of `posenc train` (config.json + model.safetensors)")
    p.add_argument("--prompt", required=True, help="text to continue (tokenized with the run's tokenizer)")
    add_method(p, "inference-time method applied to the run's scheme, e.g. yarn or rerope+logn (default: none; "
               "with --stream: streaming_llm)")
    p.add_argument("--max-new-tokens", type=int, default=64, metavar="N", help="tokens to generate")
    p.add_argument("--temperature", type=float, default=0.0, metavar="T", help="sampling temperature (0: greedy)")
    p.add_argument("--top-k", type=int, default=None, metavar="K", help="sample from the K most likely tokens "
                   "(default: all)")
    p.add_argument("--top-p", type=float, default=None, metavar="P", help="nucleus sampling: the smallest set of "
                   "tokens with probability >= P (default: all)")
    add_seed(p, None, help="sampling seed (default: torch's current random state)")
    add_device(p)
    add_dtype(p)
    p.add_argument("--stream", action="store_true",
                   help="run the prompt repeated to --stream-tokens through the model; report tokens/s and memory")
    p.add_argument("--stream-tokens", type=int, default=10000, metavar="N", help="tokens fed with --stream")
    p.add_argument("--chunk", type=int, default=64, metavar="N", help="tokens per forward with --stream")
    deprecated(p, "--scheme", dest="old_scheme", use="use --method SPEC")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from posenc._util import check_positive_int
    from posenc.models.checkpoint import load_run

    merge_old(args, "old_scheme", "method", "--method", "--scheme")
    check_positive_int("--max-new-tokens", args.max_new_tokens)  # checked before the model is loaded
    check_positive_int("--chunk", args.chunk)
    device, dtype = device_dtype(args)
    params = params_from_args(args)
    model, tokenizer = load_run(args.run, device=device)
    model = model.to(getattr(torch, dtype))  # with_scheme keeps the device and the dtype
    if args.stream:
        return _stream(args, model.with_scheme(args.method or "streaming_llm", **params), tokenizer)
    if args.method:
        model = model.with_scheme(args.method, **params)
    elif params:
        raise ValueError("--param, --factor and --window need --method")
    return _generate(args, model, tokenizer)


def _prompt_ids(args: argparse.Namespace, tokenizer) -> list[int]:
    ids = tokenizer.encode(args.prompt)
    if not ids:
        raise ValueError("--prompt must not be empty")
    return ids


def _stream(args: argparse.Namespace, model, tokenizer) -> int:
    """The prompt repeated to ``--stream-tokens`` tokens, fed ``--chunk`` at a time behind a progress bar; prints
    tokens/s, the mean loss and the resident memory."""
    from tqdm.auto import tqdm

    from posenc._util import check_positive_int
    from posenc.models.generation import resident_memory_bytes, stream_tokens

    ids = _prompt_ids(args, tokenizer)
    n = check_positive_int("--stream-tokens", args.stream_tokens)
    stream = (ids[i % len(ids)] for i in range(n))
    t0, total, count = time.perf_counter(), 0.0, 0
    with tqdm(total=n, desc=f"stream {model.scheme.name}", unit="tok", disable=args.quiet, mininterval=0.5) as bar:
        for loss in stream_tokens(model, stream, chunk=args.chunk):
            bar.update(1)
            if loss == loss:  # not NaN
                total, count = total + loss, count + 1
    dt = time.perf_counter() - t0
    print(f"streamed {n} tokens with {model.scheme.name}: {n / dt:.1f} tokens/s, mean loss "
          f"{total / max(count, 1):.4f}, RSS {resident_memory_bytes() / 2**20:.1f} MiB")
    return 0


def _generate(args: argparse.Namespace, model, tokenizer) -> int:
    """Print the prompt, then each new token's text as soon as it decodes (the text itself shows the progress)."""
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
    generate(model, torch.tensor([ids], device=args.device), args.max_new_tokens, temperature=args.temperature,
             top_k=args.top_k, top_p=args.top_p, seed=args.seed, stream=on_token,
             eos_token_id=getattr(tokenizer, "eos_id", None))
    sys.stdout.write("\n")
    return 0
