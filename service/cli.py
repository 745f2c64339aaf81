"""The `mmproc` command: serve, encode, config (and bench, see service/bench/)."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import sys
from pathlib import Path

from mmproc.errors import ConfigError, MmprocError


def _add_serve_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--config", type=Path, dest="config_file", help="JSON file of settings (below env vars and flags)")
    add("--model-path", type=Path, help="local Hugging Face checkpoint directory (Kimi-VL or Kimi K2.5)")
    add("--model", help="embedded preset when no --model-path (default: tiny)")
    add("--device", help="cpu | cuda | cuda:N")
    add("--dtype", choices=["float32", "bfloat16", "float16"])
    add("--grpc-address", help="HOST:PORT or unix:PATH (default 127.0.0.1:50051)")
    add("--http-address", help="HOST:PORT (default 127.0.0.1:8080; empty string disables)")
    add("--transport", choices=["auto", "ipc", "serialized"])
    add("--ipc-pool-mb", type=int)
    add("--max-batch-patches", type=int)
    add("--preprocess-workers", type=int)
    add("--grace-period-s", type=float)
    add("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    add("--log-json", action="store_const", const=True, default=None)


_SETTING_FLAGS = [
    "model_path",
    "model",
    "device",
    "dtype",
    "grpc_address",
    "http_address",
    "transport",
    "ipc_pool_mb",
    "max_batch_patches",
    "preprocess_workers",
    "grace_period_s",
    "log_level",
    "log_json",
]


def _settings(args: argparse.Namespace):
    from service.settings import load_settings

    return load_settings(args.config_file, **{name: getattr(args, name) for name in _SETTING_FLAGS})


def cmd_serve(args: argparse.Namespace) -> int:
    from service.app import configure_logging, serve

    settings = _settings(args)
    configure_logging(settings.log_level, settings.log_json)
    return asyncio.run(serve(settings))


def cmd_config(args: argparse.Namespace) -> int:
    settings = _settings(args)
    print(json.dumps(settings.model_dump(mode="json"), indent=2, sort_keys=True))
    return 0


def cmd_encode(args: argparse.Namespace) -> int:
    from mmproc.client import EncoderClient
    from mmproc.errors import InvalidMediaError
    from mmproc.transport import tensor_to_bytes

    images = [Path(p).read_bytes() for p in args.images]
    with EncoderClient(args.target, timeout=args.timeout) as client:
        try:
            embeddings = client.encode_images(images)
        except InvalidMediaError as err:
            name = args.images[err.index] if 0 <= err.index < len(args.images) else "request"
            print(f"invalid: {name}: {err.message} [{err.reason}]", file=sys.stderr)
            return 2
    for path, emb in zip(args.images, embeddings):
        digest = hashlib.sha256(tensor_to_bytes(emb.cpu())).hexdigest()[:16]
        dtype = str(emb.dtype).removeprefix("torch.")
        print(f"{path}\ttokens={emb.shape[0]}\tshape={tuple(emb.shape)}\tdtype={dtype}\tsha256={digest}")
    return 0


BENCHMARKS = ("rope", "encoder", "serve")


def cmd_bench(args: argparse.Namespace) -> int:
    import importlib

    module = importlib.import_module(f"service.bench.{args.name}")
    return module.main(args.args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmproc", description="MoonViT encoder sidecar for VLM serving")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gRPC + HTTP encoder service")
    _add_serve_flags(serve)
    serve.set_defaults(func=cmd_serve)

    config = sub.add_parser("config", help="print the effective configuration (flags, env, file, defaults)")
    _add_serve_flags(config)
    config.set_defaults(func=cmd_config)

    encode = sub.add_parser("encode", help="encode image files through a running server")
    encode.add_argument("images", nargs="+", help="image files")
    encode.add_argument("--target", default="127.0.0.1:50051", help="server address (HOST:PORT or unix:PATH)")
    encode.add_argument("--timeout", type=float, default=60.0)
    encode.set_defaults(func=cmd_encode)

    bench = sub.add_parser("bench", help="benchmarks: rope | encoder | serve (`mmproc bench NAME --help`)")
    bench.add_argument("name", choices=BENCHMARKS)
    bench.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's own flags")
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as err:
        print(f"mmproc: configuration error: {err}", file=sys.stderr)
        return 2
    except MmprocError as err:
        logging.getLogger("mmproc").debug("command failed", exc_info=True)
        print(f"mmproc: {type(err).__name__}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
