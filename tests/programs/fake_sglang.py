"""A tiny stand-in for SGLang 0.5.23's HTTP face, for fault tests (run as a script).

Unlike `sweep sim` it reports ``launch_command`` the way SGLang does,
``" ".join(sys.argv)`` (unquoted), and it can be made to misbehave:

* ``FAKE_LOAD_S``: seconds of "loading" before the port is bound (SGLang binds
  only after loading);
* ``GET /crash``: log an NCCL error the way a dying rank does, then SIGKILL itself;
* ``GET /escape``: fork a child that leaves the process group (``setsid``)
  keeping the listening socket open, and write its PID to ``FAKE_ESCAPE_PIDFILE``:
  a port that stays held after the server's group is gone.

Usage: ``python tests/programs/fake_sglang.py --model-path M --port P [--host H] [any flags]``.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import sys
import time
from typing import Any


def flag(name: str, default: str = "") -> str:
    args = sys.argv[1:]
    return args[args.index(name) + 1] if name in args[:-1] else default


def log(line: str) -> None:
    print(f"[2026-11-29 10:00:00] {line}", flush=True)


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path in ("/ready", "/health", "/health_generate", "/model_info"):
            self._json(200, {"status": "ok"})
        elif self.path in ("/server_info", "/get_server_info"):
            self._json(200, server_info())
        elif self.path == "/crash":
            self._json(200, {"crashing": True})
            crash()
        elif self.path == "/escape":
            escape(os.environ["FAKE_ESCAPE_PIDFILE"])
            self._json(200, {"escaped": True})
        else:
            self._json(404, {"error": self.path})

    def _json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def server_info() -> dict[str, Any]:
    return {
        "launch_command": " ".join(sys.argv),  # what SGLang reports: not quoted
        "model_path": flag("--model-path"),
        "port": int(flag("--port", "30000")),
        "tp_size": int(flag("--tp-size", "1")),
        "served_model_name": flag("--served-model-name") or None,
        "speculative_algorithm": flag("--speculative-algorithm") or None,
        "speculative_num_steps": int(flag("--speculative-num-steps", "0")) or None,
        "speculative_eagle_topk": int(flag("--speculative-eagle-topk", "0")) or None,
        "speculative_num_draft_tokens": int(flag("--speculative-num-draft-tokens", "0")) or None,
        "max_running_requests": int(flag("--max-running-requests", "48")),
        "version": "0.5.23",
        "internal_states": [{}],
    }


def crash() -> None:
    log("[TP0] Scheduler hit an exception: Traceback (most recent call last):")
    log("torch.distributed.DistBackendError: NCCL error in: nccl.cpp:3318, unhandled system error")
    log("Received sigquit from a child process. It usually means the child failed.")
    os.kill(os.getpid(), signal.SIGKILL)


def escape(pidfile: str) -> None:
    """Fork a child that leaves our process group, keeping the inherited listening socket."""
    if os.fork() == 0:
        os.setsid()
        with open(pidfile + ".tmp", "w") as out:
            out.write(str(os.getpid()))
        os.replace(pidfile + ".tmp", pidfile)
        time.sleep(600)
        os._exit(0)


def main() -> None:
    log("Load weight begin. avail mem=141.00 GB")
    time.sleep(float(os.environ.get("FAKE_LOAD_S", "0")))
    log("Load weight end.")
    address = (flag("--host", "127.0.0.1"), int(flag("--port", "30000")))
    httpd = http.server.HTTPServer(address, Handler)
    log(f"Uvicorn running on http://{address[0]}:{address[1]} (Press CTRL+C to quit)")
    log("The server is fired up and ready to roll!")
    httpd.serve_forever()


if __name__ == "__main__":
    main()
