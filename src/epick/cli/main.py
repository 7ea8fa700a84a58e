"""`epick`: check configs, explain decisions, list plugins, run the demo."""

from __future__ import annotations

import argparse
import asyncio
import io
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from epick import __version__
from epick.cli import demo, epp, serve, sim_server, simulate
from epick.cli.explain import dumps, explain, render, replay_history
from epick.cli.inputs import (
    InputError,
    parse_headers,
    parse_request,
    read_endpoints,
    read_history,
    read_json,
)
from epick.cli.kv_events import KVEventsFileError, read_kv_events, record, replay
from epick.config import ConfigError, LoadedConfig, load_config, load_config_file
from epick.config.entrypoints import default_registry
from epick.datalayer.kvevents import sinks_of
from epick.framework import InferenceRequest
from epick.requestcontrol.tokenize import RemoteTokenization

EXIT_OK = 0
EXIT_SCHEDULING_FAILED = 1
EXIT_BAD_INPUT = 2


def cmd_check_config(args: argparse.Namespace) -> int:
    failed = False
    for path in args.files:
        try:
            config = load_config_file(path)
        except ConfigError as e:
            for issue in e.issues:
                print(issue.render(e.source), file=sys.stderr)
            failed = True
            continue
        print(f"{path}: ok")
        for line in config.summary():
            print(f"  {line}")
        for warning in config.warnings:
            print(f"  warning: {warning}")
    return EXIT_BAD_INPUT if failed else EXIT_OK


def cmd_explain(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config, seed=args.seed)
        endpoints = read_endpoints(args.endpoints)
        headers = parse_headers(args.header)
        request = parse_request(
            config, read_json(args.request), args.request, path=args.path, headers=headers
        )
        history = read_history(config, args.history, endpoints, args.path) if args.history else []
        events = read_kv_events(args.kv_events) if args.kv_events else []
    except ConfigError as e:
        for issue in e.issues:
            print(issue.render(e.source), file=sys.stderr)
        return EXIT_BAD_INPUT
    except (InputError, KVEventsFileError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    sinks = sinks_of(config.plugins.values())
    if events and not sinks:
        print(
            "warning: --kv-events given, but no plugin of this config keeps a KV-block index", file=sys.stderr
        )
    replay(sinks, events)
    replay_history(config, history)
    if config.hooks.remote_tokenizers:  # ask the model server for the tokens, as the service would
        asyncio.run(_tokenize(config, request))
    explanation = explain(config, request, endpoints)
    if args.json:
        print(dumps(explanation))
    else:
        render(explanation, Console(highlight=False))
    return EXIT_OK if explanation.result is not None else EXIT_SCHEDULING_FAILED


async def _tokenize(config: LoadedConfig, request: InferenceRequest) -> None:
    remote = RemoteTokenization()
    try:
        await remote.tokenize(request, config.hooks.remote_tokenizers)
    finally:
        await remote.close()


def cmd_kv_events(args: argparse.Namespace) -> int:
    """Record a publisher's KV events to a file `epick explain --kv-events` replays."""
    if args.count is None and args.seconds is None:
        print("error: give --count or --seconds", file=sys.stderr)
        return EXIT_BAD_INPUT
    written = asyncio.run(record(args.endpoint, Path(args.out), count=args.count, seconds=args.seconds))
    print(f"{written} messages written to {args.out}")
    return EXIT_OK


def cmd_plugins(args: argparse.Namespace) -> int:
    registry, failures = default_registry()
    for spec in registry:
        params = ", ".join(f.alias or n for n, f in spec.parameters.model_fields.items()) or "-"
        aliases = f"  (also: {', '.join(spec.aliases)})" if spec.aliases else ""
        print(f"{spec.type:32} {spec.summary}  [parameters: {params}]{aliases}")
    for failure in failures:
        print(f"warning: {failure}", file=sys.stderr)
    return EXIT_OK


EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "explain"


def cmd_examples(args: argparse.Namespace) -> int:
    """Explain one decision per shipped config on the shipped endpoint state and history."""
    root = Path(args.examples)
    configs = Path(args.configs)
    console = Console(highlight=False)
    status = EXIT_OK
    for name in ("default", "lora", "pd", "shadow", "precise-prefix", "predicted-latency"):
        console.rule(f"[bold]config/{name}.yaml[/bold]", style="cyan")
        ns = argparse.Namespace(
            config=str(configs / f"{name}.yaml"),
            endpoints=str(root / "endpoints.json"),
            request=str(root / f"request-{name}.json"),
            history=str(root / "history.json"),
            kv_events=str(root / "kv-events.jsonl") if name == "precise-prefix" else None,
            path=None,
            header=[],
            json=False,
            seed=0,
        )
        status = max(status, cmd_explain(ns))
    return status


def _add_explain(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ex = sub.add_parser("explain", help="show every step of one scheduling decision")
    ex.add_argument(
        "--config", metavar="FILE", help="EndpointPickerConfig (default: the built-in default config)"
    )
    ex.add_argument(
        "--endpoints", metavar="STATE.json", required=True, help="endpoints with labels and metrics"
    )
    ex.add_argument("--request", metavar="REQ.json", required=True, help="an OpenAI request body")
    ex.add_argument(
        "--history", metavar="HIST.json", help="past requests and where they went, replayed first"
    )
    ex.add_argument(
        "--path",
        help="request path, read by the config's parser for it (default: /v1/chat/completions for a body "
        "with messages, else /v1/completions)",
    )
    ex.add_argument(
        "--header", action="append", default=[], metavar="K:V", help="a request header (repeatable)"
    )
    ex.add_argument(
        "--kv-events",
        metavar="EVENTS.jsonl",
        help="recorded KV events (epick kv-events), replayed into the config's precise prefix index first",
    )
    ex.add_argument("--json", action="store_true", help="print one JSON object")
    ex.add_argument("--seed", type=int, default=0, help="seed for random tie-breaks and random pickers")
    ex.set_defaults(func=cmd_explain)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="epick", description="An inference-aware endpoint picker for LLM serving."
    )
    parser.add_argument("--version", action="version", version=f"epick {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    check = sub.add_parser("check-config", help="validate EndpointPickerConfig files")
    check.add_argument("files", nargs="+", metavar="FILE")
    check.set_defaults(func=cmd_check_config)

    _add_explain(sub)

    kv = sub.add_parser("kv-events", help="record a vLLM engine's KV events (for epick explain --kv-events)")
    kv.add_argument("--endpoint", required=True, help="the engine's publisher, e.g. tcp://10.0.0.1:5557")
    kv.add_argument("--out", required=True, metavar="EVENTS.jsonl")
    kv.add_argument("--count", type=int, help="stop after this many messages")
    kv.add_argument("--seconds", type=float, help="stop after this many seconds")
    kv.set_defaults(func=cmd_kv_events)

    plugins = sub.add_parser("plugins", help="list the registered plugin types")
    plugins.set_defaults(func=cmd_plugins)

    sim_server.add_parser(sub)
    serve.add_parser(sub)
    simulate.add_parser(sub)

    examples = sub.add_parser(
        "examples", help="explain a decision of each shipped config on example endpoints"
    )
    examples.add_argument("--examples", default=str(EXAMPLES), help=argparse.SUPPRESS)
    examples.add_argument("--configs", default=str(EXAMPLES.parents[1] / "config"), help=argparse.SUPPRESS)
    examples.set_defaults(func=cmd_examples)

    demo.add_parser(sub)
    sub.add_parser(
        "epp",
        add_help=False,
        help="the Go EPP's command line, probes and lifecycle (also the `epp` command; epp --help)",
    )
    return parser


class _Discard(io.TextIOBase):
    """A stdout that drops what it is given."""

    def write(self, text: str) -> int:
        return len(text)


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["epp"]:  # Go's flag syntax, which argparse would refuse
        return epp.main(given[1:])
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # as given (serve --workers passes it on)
    try:
        code: int = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader left (`epick check-config ... | head -1`): what is left to print goes nowhere,
        # and Python's exit-time flush must not raise again.
        sys.stdout = _Discard()
        return EXIT_OK
    return code


if __name__ == "__main__":
    sys.exit(main())
