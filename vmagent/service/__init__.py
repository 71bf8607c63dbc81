"""The job service (`vmagent serve`): jobs over HTTP, one worker process per job."""

from __future__ import annotations

import argparse
import logging

from .config import ServiceConfig, load_config


def create_app(config: ServiceConfig):
    # FastAPI and the routes only when an app is made: importing vmagent.service.config (the
    # hosts' listing, `vmagent hosts`, the Ray shim) loads none of them.
    from .app import create_app as _create_app

    return _create_app(config)


def serve_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vmagent serve", description=(
        "Serve the job API: POST /jobs, live events, answers, cancel and the preview page. "
        "Tokens come from the config file or VMAGENT_TOKENS / VMAGENT_SERVICE_TOKEN."))
    parser.add_argument("--config", help="a YAML or JSON file with the service settings")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--data-dir", help="where the job database and job folders live")
    parser.add_argument("--max-concurrent", type=int, help="jobs running at once; the rest queue")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    config = load_config(args.config, host=args.host, port=args.port, data_dir=args.data_dir,
                         max_concurrent=args.max_concurrent)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not config.tokens and not config.service_token:
        parser.error("no tokens are configured: set `tokens`/`service_token` in the config, "
                     "or VMAGENT_TOKENS / VMAGENT_SERVICE_TOKEN, so that jobs have owners.")

    import uvicorn

    uvicorn.run(create_app(config), host=config.host, port=config.port, log_level=args.log_level)
    return 0


__all__ = ["ServiceConfig", "create_app", "load_config", "serve_main"]
