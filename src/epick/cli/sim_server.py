"""`epick sim-server`: simulated vLLM servers, no GPU needed."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from collections.abc import Callable

import uvloop

from epick.kvcache.vllm_hashing import DEFAULT_ALGORITHM, HASH_ALGORITHMS
from epick.sim import tokenizing
from epick.sim.engine.profiles import DEFAULT_PROFILE, PROFILES
from epick.sim.errors import FAILURE_TYPES
from epick.sim.options import KV_EVENTS_ENCODINGS, ServerOptions
from epick.sim.server import SimServer, serve
from epick.sim.uds_tokenizer import TokenizerSidecar


def _probability(text: str) -> float:
    """An argparse type: a finite number in [0, 1] (a bad one is a usage error naming the flag, exit 2)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a probability between 0 and 1")
    return value


def _seconds(text: str) -> float:
    """An argparse type: a finite number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and value >= 0.0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds >= 0")
    return value


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("sim-server", help="run simulated vLLM-compatible model servers")
    _server_flags(p)
    _engine_flags(p)
    p.set_defaults(func=run)


def _server_flags(p: argparse.ArgumentParser) -> None:
    """What is served, where, and how many: model, ports, role, LoRA slots, KV events."""
    p.add_argument("--model", default="sim-model", help="served model name")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="first port (server i listens on PORT + i)")
    p.add_argument("--count", type=int, default=1, help="independent servers in this process")
    p.add_argument("--time-scale", type=float, default=1.0, help="simulated seconds per wall second")
    p.add_argument("--role", choices=["both", "prefill", "decode"], default="both")
    p.add_argument("--name", help="identity in the x-epick-sim-server header (default host:port)")
    p.add_argument(
        "--lora-modules", nargs="*", default=[], metavar="NAME=PATH", help="adapters loaded at start"
    )
    p.add_argument("--max-loras", type=int, default=None, help="LoRA slots (default 1)")
    p.add_argument("--kv-events-endpoint", help="publish KV events on tcp://HOST:PORT (server i: PORT + i)")
    p.add_argument(
        "--kv-events-encoding",
        choices=KV_EVENTS_ENCODINGS,
        default="map",
        help="KV events as vLLM 0.34 encodes them (map: events are maps tagged by 'type'), or as "
        "earlier vLLM did (array: tagged positional arrays) (default map)",
    )
    p.add_argument(
        "--prefix-caching-hash-algo",
        choices=HASH_ALGORITHMS,
        default=DEFAULT_ALGORITHM,
        help="vLLM's block hash function, for the hashes the KV events carry; NONE_HASH is seeded by "
        f"the PYTHONHASHSEED environment variable, as in vLLM (default {DEFAULT_ALGORITHM})",
    )
    p.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="tokenize prompts and chats with this model tokenizer (a directory holding tokenizer.json "
        "and tokenizer_config.json, or the tokenizer.json file) as vLLM does; default: the built-in one",
    )


def _engine_flags(p: argparse.ArgumentParser) -> None:
    """Faults injected, the engine's profile and its limits."""
    p.add_argument("--failure-rate", type=float, default=0.0, help="share of requests answered with an error")
    p.add_argument(
        "--failure-types",
        default="rate_limit,server_error",
        help=f"comma-separated, from: {','.join(FAILURE_TYPES)}",
    )
    p.add_argument(
        "--latency-spike-rate",
        type=_probability,
        default=0.0,
        metavar="R",
        help="probability (0..1, drawn per request from --seed) that a request accepted for generation "
        "is held --latency-spike-s wall seconds before it reaches the engine: no response header or "
        "stream byte before the spike ends; /metrics, /health and the other endpoints are never "
        "held (default 0)",
    )
    p.add_argument(
        "--latency-spike-s",
        type=_seconds,
        default=0.0,
        metavar="S",
        help="length of a latency spike in wall seconds, not scaled by --time-scale (default 0)",
    )
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument(
        "--engine-profile",
        choices=list(PROFILES),
        default=DEFAULT_PROFILE,
        help="the model and GPUs simulated: step costs and KV blocks (docs/simulator.md)",
    )
    p.add_argument("--num-gpu-blocks", type=int, default=None, help="KV blocks (default: the profile's)")
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--no-enable-prefix-caching", action="store_true")
    p.add_argument(
        "--default-max-tokens", type=int, default=128, help="output length when max_tokens is unset"
    )
    p.add_argument("--seed", type=int, default=0, help="seed for failure and latency-spike injection")
    p.add_argument(
        "--uds-tokenizer",
        metavar="SOCKET",
        help="also serve llm-d's tokenizer sidecar (gRPC tokenization.TokenizationService) on this Unix "
        "socket, with the servers' tokenizer (an EPP's udsTokenizerConfig.socketFile)",
    )


def options_from(args: argparse.Namespace) -> ServerOptions:
    failure_types = tuple(t.strip() for t in args.failure_types.split(",") if t.strip())
    unknown = [t for t in failure_types if t not in FAILURE_TYPES]
    if unknown:
        raise SystemExit(
            f"epick sim-server: unknown --failure-types {unknown}; choose from {', '.join(FAILURE_TYPES)}"
        )
    if not 0.0 <= args.failure_rate <= 1.0:
        raise SystemExit("epick sim-server: --failure-rate must be between 0 and 1")
    if args.time_scale <= 0 or args.count < 1:
        raise SystemExit("epick sim-server: --time-scale must be > 0 and --count >= 1")
    engine = ServerOptions.engine_config(
        num_gpu_blocks=args.num_gpu_blocks,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_loras=args.max_loras,
        max_model_len=args.max_model_len,
        enable_prefix_caching=not args.no_enable_prefix_caching,
        profile=args.engine_profile,
    )
    return ServerOptions(
        model=args.model,
        host=args.host,
        port=args.port,
        count=args.count,
        time_scale=args.time_scale,
        role=args.role,
        name=args.name,
        lora_modules=tuple(args.lora_modules),
        kv_events_endpoint=args.kv_events_endpoint,
        kv_events_encoding=args.kv_events_encoding,
        prefix_caching_hash_algo=args.prefix_caching_hash_algo,
        tokenizer=args.tokenizer,
        failure_rate=args.failure_rate,
        failure_types=failure_types or ("rate_limit", "server_error"),
        latency_spike_rate=args.latency_spike_rate,
        latency_spike_s=args.latency_spike_s,
        default_max_tokens=args.default_max_tokens,
        seed=args.seed,
        engine=engine,
    )


def run(args: argparse.Namespace) -> int:
    options = options_from(args)
    try:
        tokenizing.load(options.tokenizer)  # a bad --tokenizer is an error before any server starts
    except ValueError as e:
        print(f"epick sim-server: {e}", file=sys.stderr)
        return 2

    def ready(servers: list[SimServer]) -> None:
        for s in servers:
            print(
                f"sim-server {s.name} serving {options.model!r} at {s.url} (role {options.role})", flush=True
            )

    with contextlib.suppress(KeyboardInterrupt):
        try:
            uvloop.run(_serve(options, args.uds_tokenizer, ready))
        except OSError as e:
            print(f"epick sim-server: cannot listen: {e}", file=sys.stderr)
            return 2
        except ValueError as e:
            print(f"epick sim-server: {e}", file=sys.stderr)
            return 2
    return 0


async def _serve(
    options: ServerOptions, sidecar_socket: str | None, ready: Callable[[list[SimServer]], None]
) -> None:
    """The servers, and the tokenizer sidecar beside them when asked."""
    sidecar = None
    if sidecar_socket:
        sidecar = TokenizerSidecar(tokenizing.load(options.tokenizer), sidecar_socket)
        await sidecar.start()
        print(f"tokenizer sidecar serving at unix://{os.path.abspath(sidecar_socket)}", flush=True)
    try:
        await serve(options, ready=ready)
    finally:
        if sidecar is not None:
            await sidecar.stop()
