"""``posenc generate MODEL``: decode from a model, printing each token as it decodes. MODEL is any model the other
commands take: a run folder of ``posenc train`` (posenc's KV cache, :func:`posenc.models.generation.generate`, or
``--stream`` through StreamingLLM, :func:`posenc.models.generation.stream_tokens`), or a Hugging Face model: a folder
(one ``posenc extend`` wrote included, loaded with its method), a .gguf file or a bundled model, read by
:func:`posenc.hf.source.load_source` as ``eval`` and ``tune`` read it and decoded by transformers' ``generate``."""

from __future__ import annotations

import argparse
import sys
import time

from posenc.cli._common import (
    add_device,
    add_dtype,
    add_method,
    add_seed,
    check_method_flags,
    deprecated,
    device_dtype,
    merge_old,
    params_from_args,
    subparser,
    typed_params,
)

MODEL_HELP = ("a run folder of `posenc train`, or a Hugging Face model: a folder (one `posenc extend` wrote included), "
              "a .gguf file or a bundled model (smollm2, gemma3-270m)")


def add_parser(sub) -> None:
    p = subparser(sub, "generate", "generate text from a model (a run folder or a Hugging Face model), or stream a run "
                  "with StreamingLLM",
                  "Generate text from MODEL, printing each token as it decodes: a run folder of `posenc train` "
                  "(posenc's KV cache) or a Hugging Face model (a folder, one `posenc extend` wrote included, a .gguf "
                  "file or a bundled model, decoded by transformers). With --stream, feed the prompt repeated to "
                  "--stream-tokens tokens through a run folder's model under StreamingLLM (or --method) and report "
                  "tokens/s, the mean "
                  "loss and the memory.")
    p.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    p.add_argument("--prompt", required=True, help="text to continue (tokenized with the model's own tokenizer)")
    add_method(p, "inference-time method applied to the model, e.g. yarn or rerope+logn (default: none; with "
               "--stream: streaming_llm)")
    p.add_argument("--max-new-tokens", type=int, default=64, metavar="N", help="tokens to generate")
    p.add_argument("--temperature", type=float, default=0.0, metavar="T", help="sampling temperature (0: greedy)")
    p.add_argument("--top-k", type=int, default=None, metavar="K", help="sample from the K most likely tokens "
                   "(default: all)")
    p.add_argument("--top-p", type=float, default=None, metavar="P", help="nucleus sampling: the smallest set of "
                   "tokens with probability >= P (default: all)")
    add_seed(p, None, help="sampling seed (default: torch's current random state)")
    add_device(p)
    add_dtype(p)
    p.add_argument("--stream", action="store_true", help="run folder: run the prompt repeated to --stream-tokens "
                   "through the model; report tokens/s and memory")
    p.add_argument("--stream-tokens", type=int, default=10000, metavar="N", help="tokens fed with --stream")
    p.add_argument("--chunk", type=int, default=64, metavar="N", help="tokens per forward with --stream")
    deprecated(p, "--scheme", dest="old_scheme", use="use --method SPEC")
    p.set_defaults(func=run)


def _check_sampling(args: argparse.Namespace) -> None:
    """The decoding flags, before the model is loaded (one line naming the flag)."""
    from posenc._util import check_finite, check_positive_int

    check_positive_int("--max-new-tokens", args.max_new_tokens)
    check_positive_int("--chunk", args.chunk)
    check_positive_int("--stream-tokens", args.stream_tokens)
    check_finite("--temperature", args.temperature, minimum=0.0)
    if args.top_k is not None:
        check_positive_int("--top-k", args.top_k)
    if args.top_p is not None:
        check_finite("--top-p", args.top_p, minimum=0.0, maximum=1.0, strict_min=True)


def run(args: argparse.Namespace) -> int:
    from posenc.models.checkpoint import is_run_folder

    merge_old(args, "old_scheme", "method", "--method", "--scheme")
    _check_sampling(args)
    device, dtype = device_dtype(args)
    params = params_from_args(args)
    if params and not args.method and not args.stream:
        raise ValueError("--param, --factor and --window need --method")
    lab = is_run_folder(args.model)
    if not lab and args.stream:
        raise ValueError(f"--stream runs a run folder of `posenc train` (StreamingLLM on posenc's engine); MODEL "
                         f"{args.model!r} is a Hugging Face model: generate from it without --stream")
    check_method_flags(args.method, params, hf=not lab, typed=typed_params(args))
    if lab:
        return _run_folder(args, device, dtype, params)
    return _hugging_face(args, device, dtype, params)


def _run_folder(args: argparse.Namespace, device: str, dtype: str, params: dict) -> int:
    import torch

    from posenc.models.checkpoint import load_run

    model, tokenizer = load_run(args.model, device=device)
    model = model.to(getattr(torch, dtype))  # with_scheme keeps the device and the dtype
    if args.stream:
        return _stream(args, model.with_scheme(args.method or "streaming_llm", **params), tokenizer)
    if args.method:
        model = model.with_scheme(args.method, **params)
    return _generate(args, model, tokenizer)


def _hugging_face(args: argparse.Namespace, device: str, dtype: str, params: dict) -> int:
    """A Hugging Face model, loaded as every command loads one (a saved extension re-applied), ``--method`` applied
    with :func:`posenc.hf.extend`, decoded by transformers' ``generate`` with the text printed as it decodes."""
    import torch

    from posenc.hf.patch import extend
    from posenc.hf.source import load_source

    model, tokenizer = load_source(args.model, dtype=getattr(torch, dtype))
    if args.method:
        extend(model, args.method, **params)
    model = model.to(device)
    ids = tokenizer(args.prompt, return_tensors="pt").input_ids.to(device)
    if ids.shape[1] == 0:
        raise ValueError("--prompt must not be empty")
    printer = _Printer(tokenizer, skip=ids.shape[1])
    sample = args.temperature > 0
    if args.seed is not None:
        torch.manual_seed(args.seed)
    kw = {"do_sample": True, "temperature": args.temperature, "top_k": args.top_k or 0, "top_p": args.top_p or 1.0} \
        if sample else {"do_sample": False, "temperature": None, "top_k": None, "top_p": None}
    sys.stdout.write(args.prompt)
    with torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens, streamer=printer,
                       pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                       else tokenizer.eos_token_id, **kw)
    sys.stdout.write("\n")
    return 0


class _Printer:
    """A transformers streamer (``put`` / ``end``): the text of the new tokens, printed as they decode (the prompt's
    ``skip`` tokens, which ``generate`` puts first, are not printed again)."""

    def __init__(self, tokenizer, skip: int):
        self.tokenizer, self.skip, self.new, self.printed = tokenizer, skip, [], 0

    def put(self, tokens) -> None:
        flat = [int(t) for t in tokens.reshape(-1).tolist()]
        if self.skip:
            flat, self.skip = flat[self.skip:], max(0, self.skip - len(flat))
        self.new += flat
        text = self.tokenizer.decode(self.new, skip_special_tokens=True)
        sys.stdout.write(text[self.printed:])
        sys.stdout.flush()
        self.printed = len(text)

    def end(self) -> None:
        sys.stdout.flush()


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
