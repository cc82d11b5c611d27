"""A tiny fake workload for tests: prints, listens, ignores TERM, exits with a chosen code.

Usage: python3 tests/support/workload.py [flags]   (standard library only)

  --print TEXT        print TEXT on stdout at start (repeatable, flushed at once)
  --listen IP:PORT    serve TCP on IP:PORT; an HTTP request gets a status line and "ok"
  --http-status N     the status --listen answers HTTP requests with (default 200)
  --touch PATH        after listening, write "ready\\n" to PATH (for file probes)
  --ignore-term       survive SIGTERM, printing "workload: ignoring SIGTERM" each time
  --run-for SECONDS   live this long before exiting ("inf": until killed; default 0)
  --exit-code N       exit status once --run-for is over (default 0)

Without --ignore-term, SIGTERM kills it the default way (shell exit code 143).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="workload")
    parser.add_argument("--print", dest="lines", action="append", default=[])
    parser.add_argument("--listen", default=None)
    parser.add_argument("--http-status", type=int, default=200)
    parser.add_argument("--touch", type=Path, default=None)
    parser.add_argument("--ignore-term", action="store_true")
    parser.add_argument("--run-for", type=float, default=0.0)
    parser.add_argument("--exit-code", type=int, default=0)
    return parser.parse_args(argv)


async def _serve(listen: str, status: int) -> asyncio.Server:
    host, _, port = listen.rpartition(":")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            if line.startswith(b"GET ") or line.startswith(b"HEAD "):
                while (await reader.readline()).strip():
                    pass
                writer.write(f"HTTP/1.0 {status} X\r\nContent-Length: 3\r\n\r\nok\n".encode())
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host.strip("[]"), int(port))


async def _main(args: argparse.Namespace) -> int:
    if args.ignore_term:
        asyncio.get_running_loop().add_signal_handler(
            signal.SIGTERM, lambda: print("workload: ignoring SIGTERM", flush=True)
        )
    for line in args.lines:
        print(line, flush=True)
    server = await _serve(args.listen, args.http_status) if args.listen else None
    if args.touch is not None:
        args.touch.write_text("ready\n")
    if args.run_for == float("inf"):
        await asyncio.Event().wait()
    elif args.run_for > 0:
        await asyncio.sleep(args.run_for)
    if server is not None:
        server.close()
    return int(args.exit_code)


if __name__ == "__main__":
    sys.exit(asyncio.run(_main(_parse(sys.argv[1:]))))
