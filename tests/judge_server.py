"""A minimal OpenAI-compatible chat server whose replies are scripted, for tests/test_judge.py (stdlib only, so it
starts in a fraction of a second). It serves POST /v1/chat/completions on 127.0.0.1 and prints "PORT <n>" once
it listens.

    python tests/judge_server.py --script RULES.json --log LOG.jsonl [--die-after N] [--delay S] [--lifetime S]

RULES.json is a list of rules, the first whose "when" is a substring of the request's last message applies:
{"when": "...", "reply": "SCORE: 7"}, {"when": ..., "status": 500, "times": 1} (an HTTP error, the first
"times" matches only), {"when": ..., "sleep": 5} (answer late), {"when": ..., "echo_auth": true} (a 200 whose
reply is the Authorization header it got), {"when": ..., "null": true} (content null), {"when": ...,
"garbage": true} (a 200 that is not a chat completion), {"when": ..., "raw": TEXT, "content_type": TYPE} (a 200
whose body is TEXT exactly: broken JSON, an HTML page; default type application/json), {"when": ..., "cut": N} (a
chat completion whose body is cut after N bytes, the connection closed with the rest unsent, as a crashing server
or proxy leaves it). No rule applies: "SCORE: 5". Every request is logged
to LOG.jsonl ({"content", "auth", "in_flight"}) before it is answered; with --die-after N the process exits
without answering request N + 1, like a server killed mid-run. It exits by itself after --lifetime seconds (default
300), so a test killed before it could stop the server leaves nothing running for long.

``ScriptedServer`` runs this file as such a process, for the tests (tests/test_judge.py, test_judge_studies.py).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--script", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--die-after", type=int, default=None)
    p.add_argument("--delay", type=float, default=0.0, help="seconds before every answer")
    p.add_argument("--lifetime", type=float, default=300.0, help="exit after this many seconds, whatever happens")
    args = p.parse_args()
    stopper = threading.Timer(args.lifetime, os._exit, (0,))
    stopper.daemon = True
    stopper.start()
    rules = json.loads(open(args.script).read())
    used = [0] * len(rules)
    lock = threading.Lock()
    state = {"requests": 0, "in_flight": 0}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):  # quiet
            pass

        def _send(self, status: int, body, content_type: str = "application/json", cut: int | None = None) -> None:
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data if cut is None else data[:cut])
            if cut is not None:  # the promised length never comes: close mid-body
                self.wfile.flush()
                self.close_connection = True

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            content = (body.get("messages") or [{}])[-1].get("content", "")
            auth = self.headers.get("Authorization", "")
            with lock:
                state["requests"] += 1
                state["in_flight"] += 1
                n, in_flight = state["requests"], state["in_flight"]
                with open(args.log, "a") as f:
                    f.write(json.dumps({"content": content, "auth": auth, "in_flight": in_flight,
                                        "path": self.path, "model": body.get("model")}) + "\n")
                if args.die_after is not None and n > args.die_after:
                    os._exit(3)
                rule = {}
                for i, r in enumerate(rules):
                    if r.get("when", "") in content and used[i] < r.get("times", 10**9):
                        used[i] += 1
                        rule = r
                        break
            try:
                time.sleep(args.delay + rule.get("sleep", 0))
                if "status" in rule:
                    self._send(rule["status"], {"error": {"message": rule.get("message", f"scripted {rule['status']}")
                                                          + (f" (got {auth})" if rule.get("echo_auth") else "")}})
                    return
                if rule.get("garbage"):
                    self._send(200, {"hello": "not a chat completion"})
                    return
                if "raw" in rule:
                    self._send(200, rule["raw"], rule.get("content_type", "application/json"))
                    return
                reply = auth if rule.get("echo_auth") else None if rule.get("null") else rule.get("reply", "SCORE: 5")
                self._send(200, {"id": f"c{n}", "object": "chat.completion", "created": int(time.time()),
                                 "model": body.get("model"),
                                 "choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": reply}}],
                                 "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}},
                           cut=rule.get("cut"))
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (its timeout)
                pass
            finally:
                with lock:
                    state["in_flight"] -= 1

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(f"PORT {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()


class ScriptedServer:
    """tests/judge_server.py as a process: ``url``, ``requests()`` (its log), ``stop()``."""

    def __init__(self, folder: Path, rules, die_after=None, delay=0.0):
        folder.mkdir(parents=True, exist_ok=True)
        script = folder / "rules.json"
        script.write_text(json.dumps(list(rules)))
        self.log = folder / "requests.jsonl"
        cmd = [sys.executable, str(Path(__file__)), "--script", str(script), "--log", str(self.log), "--delay", str(delay)]
        if die_after is not None:
            cmd += ["--die-after", str(die_after)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], 20)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("PORT "):
            self.stop()
            raise RuntimeError(f"scripted judge server did not start: {line!r} {self.proc.stderr.read()[-2000:]}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}/v1"

    def requests(self) -> list[dict]:
        from setpo.records import read_records  # here: the server process itself stays stdlib-only

        return read_records(self.log) if self.log.exists() else []

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        for stream in (self.proc.stdout, self.proc.stderr):
            stream.close()


if __name__ == "__main__":
    sys.exit(main())
