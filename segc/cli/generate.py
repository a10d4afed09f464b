"""Generate tokens greedily from an mlx-lm model through segc, streaming them.

``segc generate --model DIR`` loads a local mlx-lm model directory (config.json and
safetensors, no network); without ``--model`` a tiny random model of ``--arch`` is
built. ``--compare`` also runs eager mlx-lm and checks that the tokens are identical;
``--fast`` takes ``segc.engine.FAST_OPTIONS`` (the fastest decode measured on a GPU).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .common import positive_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="DIR", help="local mlx-lm model directory (config.json + *.safetensors)")
    p.add_argument(
        "--arch",
        default="llama",
        help="tiny random mlx-lm architecture when no --model (default llama; see segc trace --help)",
    )
    p.add_argument("--prompt", default=None, help="prompt text (needs the model's tokenizer)")
    p.add_argument("--prompt-tokens", default=None, help="prompt as comma-separated token ids (default 1..8)")
    p.add_argument("--max-tokens", type=positive_int(), default=64, help="tokens to generate (default 64)")
    p.add_argument(
        "--boundaries", default=None, help="segment globs, 'auto' (one per layer: the default without --fast) or 'none'"
    )
    p.add_argument(
        "--fast",
        action="store_true",
        help="one segment (unless --boundaries), concatenated projections, frozen parameters, the KV cache "
        "written in place: the fastest decode measured on a GPU, the same tokens",
    )
    p.add_argument("--eager", action="store_true", help="run eager mlx-lm instead of segc")
    p.add_argument("--compare", action="store_true", help="also run eager mlx-lm and compare the tokens")
    p.add_argument("--quiet", action="store_true", help="do not stream the tokens")


def run(args: argparse.Namespace) -> int:
    from segc.engine import FAST_OPTIONS, GenerationStats, generate_tokens, load_local_model
    from segc.errors import SegcError, UsageError

    from .target import check_arch

    tokenizer = None
    try:
        if args.model:
            model, tokenizer = load_local_model(args.model)
            what = args.model
        else:
            from segc.models.zoo import build

            model = build(check_arch(args.arch))
            what = f"tiny random {args.arch}"
        if args.prompt is not None:
            if tokenizer is None:
                raise SegcError("--prompt needs a model directory with a tokenizer; use --prompt-tokens")
            prompt = list(tokenizer.encode(args.prompt))
        elif args.prompt_tokens:
            try:
                prompt = [int(t) for t in args.prompt_tokens.split(",") if t.strip()]
            except ValueError:
                raise UsageError(
                    f"--prompt-tokens takes comma-separated token ids, got {args.prompt_tokens!r}"
                ) from None
        else:
            prompt = list(range(1, 9))
        options: dict[str, Any] = dict(FAST_OPTIONS) if args.fast else {"boundaries": "auto"}
        if args.boundaries is not None:
            options["boundaries"] = None if args.boundaries in ("none", "") else args.boundaries
        stats = GenerationStats()
        print(f"# {what}: {len(prompt)} prompt tokens, {'eager mlx-lm' if args.eager else 'segc'}", flush=True)
        eos = None
        if tokenizer is not None and getattr(tokenizer, "eos_token_ids", None):
            ids = set(tokenizer.eos_token_ids)
            eos = ids.__contains__
        detok = tokenizer.detokenizer if tokenizer is not None else None
        if detok is not None:
            detok.reset()
        for tok in generate_tokens(
            model, prompt, args.max_tokens, use_segc=not args.eager, eos=eos, stats=stats, **options
        ):
            if args.quiet:
                continue
            if detok is not None:
                detok.add_token(tok)
                sys.stdout.write(detok.last_segment)
            else:
                sys.stdout.write(f"{tok} ")
            sys.stdout.flush()
        if detok is not None and not args.quiet:
            detok.finalize()
            sys.stdout.write(detok.last_segment)
        print()
        line = f"# {len(stats.tokens)} tokens, first token {stats.first_token_s * 1e3:.1f} ms, "
        line += f"decode {stats.decode_tokens_per_s:.1f} tokens/s"
        if stats.jitted is not None:
            info = stats.jitted.cache_info()
            line += f", {info.traces} traces ({info.trace_seconds * 1e3:.1f} ms tracing)"
            for why in info.aborted:  # automatic fallbacks (exact state, growth) are reported
                print(f"segc generate: fallback: {why}", file=sys.stderr)
        print(line)
        if args.compare:
            ref = list(generate_tokens(model, prompt, args.max_tokens, use_segc=args.eager, eos=eos))
            same = ref == stats.tokens
            print(f"# eager mlx-lm tokens identical: {same}")
            return 0 if same else 1
    except SegcError as exc:
        print(f"segc generate: {exc}", file=sys.stderr)
        return 2
    return 0
