"""The `mmproc` command: serve, encode, config, health (and bench, see mmproc/bench/catalog.py)."""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
from pathlib import Path

from mmproc.errors import ConfigError, MmprocError
from mmproc.priority import INTERACTIVE, PRIORITIES


def _add_serve_flags(parser: argparse.ArgumentParser) -> None:
    from service.app.flags import add_setting_flags

    add_setting_flags(parser)  # one flag per ServerSettings field, plus --config


def _config_file(args: argparse.Namespace) -> Path | None:
    path = getattr(args, "config_file", None) or os.environ.get("MMPROC_CONFIG_FILE")
    return Path(path) if path else None


def _settings(args: argparse.Namespace):
    from service.app.config_sources import load_settings
    from service.app.flags import setting_overrides

    return load_settings(_config_file(args), **setting_overrides(args))


def cmd_serve(args: argparse.Namespace) -> int:
    from service.observe.logs import configure_logging

    settings = _settings(args)  # validated before the heavy imports: a bad setting fails in a blink
    configure_logging(settings.log_level, settings.log_json)
    from service.app.event_loop import run
    from service.app.server import serve

    return run(serve(settings), settings.event_loop)


def cmd_config(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if settings.model_path is None:  # what `serve` checks before binding (service/app/server.py)
        from mmproc.models.registry import PRESETS

        if settings.model not in PRESETS:
            raise ConfigError(f"unknown preset {settings.model!r} (--model); choose one of {sorted(PRESETS)}")
    print(json.dumps(settings.model_dump(mode="json"), indent=2, sort_keys=True))
    return 0


def cmd_encode(args: argparse.Namespace) -> int:
    from mmproc.client import EncoderClient
    from mmproc.errors import InvalidMediaError
    from mmproc.transport.serialized.staging import tensor_to_bytes

    try:
        images = [Path(p).read_bytes() for p in args.images]
    except OSError as err:
        print(f"mmproc: cannot read {err.filename}: {err.strerror}", file=sys.stderr)
        return 2
    token = _client_token(args)
    pending, bad = list(range(len(images))), {}
    with EncoderClient(_target(args), timeout=args.timeout, token=token, priority=args.priority) as client:
        while pending:  # a bad image fails its request: set it aside and send the rest again
            try:
                results = dict(zip(pending, client.encode([images[i] for i in pending])))
                break
            except InvalidMediaError as err:
                if not 0 <= err.index < len(pending):
                    print(f"invalid: request: {err.message} [{err.reason}]", file=sys.stderr)
                    return 2
                bad[pending.pop(err.index)] = err
        else:
            results = {}
    for i, path in enumerate(args.images):
        if i in bad:
            print(f"invalid: {path}: {bad[i].message} [{bad[i].reason}]", file=sys.stderr)
            continue
        result = results[i]
        emb = result.tensor
        digest = hashlib.sha256(tensor_to_bytes(emb.cpu())).hexdigest()[:16]
        dtype = str(emb.dtype).removeprefix("torch.")
        if args.json:
            fields = {"path": path, "tokens": result.num_tokens, "shape": list(emb.shape), "dtype": dtype}
            fields |= {"grid_thw": list(result.grid_thw), "image_size": list(result.image_size), "sha256": digest}
            print(json.dumps(fields))
        else:
            print(f"{path}\ttokens={emb.shape[0]}\tshape={tuple(emb.shape)}\tdtype={dtype}\tsha256={digest}")
    return 2 if bad else 0


def _target(args: argparse.Namespace) -> str:
    """--target, else the configured gRPC address (flags file / MMPROC_GRPC_ADDRESS) dialled on loopback."""
    from service.app.config_sources import load_settings

    return args.target or local_target(load_settings(_config_file(args)).grpc_address)


def _client_token(args: argparse.Namespace) -> str | None:
    """--token-file, --token, else MMPROC_AUTH_TOKEN (the edge may read the environment)."""
    if args.token_file:
        try:
            return Path(args.token_file).read_text().strip() or None
        except OSError as err:
            raise ConfigError(f"--token-file {args.token_file}: {err.strerror}") from None
    return args.token or os.environ.get("MMPROC_AUTH_TOKEN") or None


def local_target(address: str) -> str:
    """The address a local probe dials for a listening address: wildcard hosts become loopback."""
    if address.startswith("unix:"):
        return address
    host, _, port = address.rpartition(":")
    if host in ("", "0.0.0.0"):
        return f"127.0.0.1:{port}"
    if host in ("[::]", "::"):
        return f"[::1]:{port}"
    return address


def cmd_health(args: argparse.Namespace) -> int:
    """Exit 0 when the server reports SERVING, else 1 (a container HEALTHCHECK / exec probe)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    target = _target(args)
    with grpc.insecure_channel(target) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout
            )
        except grpc.RpcError as err:
            print(f"{target}: {err.code().name}: {err.details()}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{target}: {status}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


def cmd_bench(args: argparse.Namespace) -> int:
    from mmproc.bench.catalog import BENCHMARKS, run

    if args.name is None:
        print("mmproc bench NAME [flags]; `mmproc bench NAME --help` for a bench's flags. Benches:")
        print("\n".join(f"  {name}" for name in BENCHMARKS))
        return 0
    return run(args.name, args.args)


def build_parser() -> argparse.ArgumentParser:
    import mmproc
    from mmproc.bench.catalog import BENCHMARKS
    from service.app.flags import HelpFormatter

    parser = argparse.ArgumentParser(prog="mmproc", description="MoonViT encoder sidecar for VLM serving")
    parser.add_argument("--version", action="version", version=f"mmproc {mmproc.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    usage = "%(prog)s [--config FILE] [--model-path DIR | --model NAME] [--device DEVICE] [setting flags]"
    serve = sub.add_parser(
        "serve", help="run the gRPC + HTTP encoder service", usage=usage, formatter_class=HelpFormatter
    )
    _add_serve_flags(serve)
    serve.set_defaults(func=cmd_serve)

    config = sub.add_parser(
        "config",
        help="print the effective configuration (flags, env, file, defaults)",
        usage=usage,
        formatter_class=HelpFormatter,
    )
    _add_serve_flags(config)
    config.set_defaults(func=cmd_config)

    encode = sub.add_parser("encode", help="encode image files through a running server")
    encode.add_argument("images", nargs="+", help="image files")
    encode.add_argument("--target", help="server address (default: the configured --grpc-address, on loopback)")
    encode.add_argument("--config", dest="config_file", help="settings file to take the address from")
    encode.add_argument("--timeout", type=float, default=60.0)
    encode.add_argument("--token", help="the server's auth token (default: env MMPROC_AUTH_TOKEN)")
    encode.add_argument("--token-file", help="read the auth token from this file (not the process list)")
    encode.add_argument("--priority", choices=PRIORITIES, default=INTERACTIVE,
                        help="batch: offline work, refused first when the server is overloaded")  # fmt: skip
    encode.add_argument("--json", action="store_true", help="one JSON object per image instead of a table")
    encode.set_defaults(func=cmd_encode)

    health = sub.add_parser("health", help="exit 0 when the server's gRPC health reports SERVING (probes)")
    health.add_argument("--target", help="server address (default: the configured --grpc-address, on loopback)")
    health.add_argument("--config", dest="config_file", help="settings file to take the address from")
    health.add_argument("--service", default="", help="health service name (default: the whole server)")
    health.add_argument("--timeout", type=float, default=3.0)
    health.set_defaults(func=cmd_health)

    bench = sub.add_parser("bench", help=f"benchmarks: {' | '.join(BENCHMARKS)} (`mmproc bench NAME --help`)")
    bench.add_argument("name", nargs="?", choices=BENCHMARKS, help="a bench; none: list them")
    bench.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's own flags")
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler below, not at exit
        return code
    except KeyboardInterrupt:
        _say_last("mmproc: interrupted")
        return 130
    except BrokenPipeError:  # `mmproc config | head`: the reader left; say nothing
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except ConfigError as err:
        _say_last(f"mmproc: configuration error: {err}")
        return 2
    except MmprocError as err:
        logging.getLogger("mmproc").debug("command failed", exc_info=True)
        _say_last(f"mmproc: {type(err).__name__}: {err}")
        return 1


def _say_last(line: str) -> None:
    """`line` on stderr after every log line logged before it (the log's own thread writes those)."""
    from service.observe.logs import flush_logs

    flush_logs()
    print(line, file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
