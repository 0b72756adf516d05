#!/usr/bin/env python3
"""A scripted mock of the Anthropic Messages API, for driving the real Claude Code CLI in tests.

usage: mock_anthropic.py SCRIPT.json PORT_FILE LOG_FILE

Binds 127.0.0.1 on a free port (loopback only: nothing leaves the machine), writes the port to
PORT_FILE (atomically, by rename) once it accepts connections, and serves until killed:

  POST /v1/messages               a scripted reply, as SSE when the request says "stream": true
                                  (Claude Code always streams), else one JSON message
  POST /v1/messages/count_tokens  {"input_tokens": N}
  CONNECT (as an HTTPS proxy)     logged and refused with 403: point HTTPS_PROXY here to
                                  see any connection the client tries to make elsewhere (a
                                  plain-HTTP proxy request shows as a "path" with a scheme)
  anything else                   an empty JSON object with status 200 (HEAD: no body)

SCRIPT.json maps a prompt key to the turns of the agent's answer:

  {"KEY": [{"tool": "Write", "input": {...}}, ..., {"text": "done"}], ...}

A conversation is answered from the key of its latest user prompt that contains "[[KEY]]";
turn number i is the number of tool_result blocks sent after that prompt, so each request gets
the next tool call once the CLI has run the previous one (and sent its result). Past the last
turn, or for a request with no scripted key (Claude Code's side queries, such as a title), the
reply is a short text with stop_reason "end_turn". A turn may carry "barrier": [NAME, N]: its
reply is held until N requests with that barrier name have arrived (at most 60 s), which makes
N concurrent agents provably run at the same time without any sleep.

Every request is appended to LOG_FILE as one JSON line, {"method", "path"} and for
POST /v1/messages also:
  "key" (null when unscripted), "turn", "tools" (the tool names offered), "tool_results" (after
  the prompt: [{"tool_use_id", "is_error", "content"}]), "reply" (the tool name, or "text"),
  "session" (the X-Claude-Code-Session-Id header, when the CLI sends one), "model", "stream".
"""

import json
import os
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

KEY_RE = re.compile(r"\[\[([A-Za-z0-9_.-]+)\]\]")
LOG_LOCK = threading.Lock()
BARRIER = threading.Condition()
BARRIER_COUNTS = {}


def text_of(content):
    """The plain text of a message's content (a string or a list of blocks)."""
    if isinstance(content, str):
        return content
    parts = []
    for block in content or []:
        if isinstance(block, dict) and block.get("type") == "text":
            parts.append(block.get("text", ""))
    return "\n".join(parts)


def result_text(block):
    content = block.get("content")
    if isinstance(content, list):
        return text_of(content)
    return content if isinstance(content, str) else ""


def locate(messages):
    """(key, tool results after the latest keyed user prompt) for a conversation."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m.get("role") != "user":
            continue
        found = KEY_RE.findall(text_of(m.get("content")))
        if not found:
            continue
        results = []
        for later in messages[i + 1:]:
            if later.get("role") != "user" or not isinstance(later.get("content"), list):
                continue
            for b in later["content"]:
                if isinstance(b, dict) and b.get("type") == "tool_result":
                    results.append({
                        "tool_use_id": b.get("tool_use_id"),
                        "is_error": bool(b.get("is_error")),
                        "content": result_text(b)[:2000],
                    })
        return found[-1], results
    return None, []


def wait_barrier(name, count):
    """Blocks until `count` requests have reached barrier `name` (or 60 s have passed)."""
    deadline = time.monotonic() + 60
    with BARRIER:
        BARRIER_COUNTS[name] = BARRIER_COUNTS.get(name, 0) + 1
        BARRIER.notify_all()
        while BARRIER_COUNTS[name] < count:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            BARRIER.wait(left)
    return True


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    script = {}
    log_path = None
    counter = 0
    counter_lock = threading.Lock()

    def log_message(self, fmt, *args):  # quiet: the request log is the record
        pass

    def log_request_json(self, entry):
        with LOG_LOCK:
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(entry) + "\n")
                f.flush()

    def read_body(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            return {}

    def send_json(self, obj, status=200):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self):
        self.log_request_json({"path": self.path, "method": "GET"})
        self.send_json({})

    def do_CONNECT(self):
        """The CLI's HTTPS_PROXY points here too: a tunnel to anywhere is logged and refused."""
        self.log_request_json({"path": self.path, "method": "CONNECT"})
        self.send_json({}, 403)
        self.close_connection = True

    do_HEAD = do_GET
    do_PUT = do_GET
    do_DELETE = do_GET

    def do_POST(self):
        path = self.path.split("?", 1)[0]
        req = self.read_body()
        if path.endswith("/count_tokens"):
            self.log_request_json({"path": self.path, "method": "POST"})
            self.send_json({"input_tokens": 100})
            return
        if not path.endswith("/v1/messages"):
            self.log_request_json({"path": self.path, "method": "POST"})
            self.send_json({})
            return
        tools = [t.get("name") for t in req.get("tools") or [] if isinstance(t, dict)]
        key, results = locate(req.get("messages") or [])
        turns = self.script.get(key, []) if key and "Bash" in tools else []
        turn_no = len(results)
        turn = turns[turn_no] if turn_no < len(turns) else {"text": f"done {key or ''}".strip()}
        entry = {
            "path": self.path, "method": "POST", "key": key if turns else None,
            "turn": turn_no, "tools": tools, "tool_results": results,
            "reply": turn.get("tool", "text"),
            "session": self.headers.get("X-Claude-Code-Session-Id"),
            "model": req.get("model"), "stream": bool(req.get("stream")),
        }
        self.log_request_json(entry)
        if "barrier" in turn:
            name, count = turn["barrier"]
            if not wait_barrier(name, count):
                self.send_json({"type": "error", "error": {
                    "type": "api_error", "message": f"mock: barrier {name} timed out"}}, 500)
                return
        with Handler.counter_lock:
            Handler.counter += 1
            n = Handler.counter
        if "tool" in turn:
            block = {"type": "tool_use", "id": f"toolu_mock{n:06d}", "name": turn["tool"],
                     "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(turn["input"])}
            full = dict(block, input=turn["input"])
            stop = "tool_use"
        else:
            block = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": turn["text"]}
            full = {"type": "text", "text": turn["text"]}
            stop = "end_turn"
        message = {
            "id": f"msg_mock{n:06d}", "type": "message", "role": "assistant",
            "model": req.get("model") or "claude-mock", "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 100, "output_tokens": 1,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
        }
        if not req.get("stream"):
            self.send_json(dict(message, content=[full], stop_reason=stop,
                                usage=dict(message["usage"], output_tokens=10)))
            return
        events = [
            ("message_start", {"type": "message_start", "message": message}),
            ("content_block_start", {"type": "content_block_start", "index": 0,
                                     "content_block": block}),
            ("ping", {"type": "ping"}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                     "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta",
                               "delta": {"stop_reason": stop, "stop_sequence": None},
                               "usage": {"output_tokens": 10}}),
            ("message_stop", {"type": "message_stop"}),
        ]
        body = "".join(f"event: {e}\ndata: {json.dumps(d)}\n\n" for e, d in events).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    script_path, port_file, log_file = sys.argv[1:4]
    with open(script_path, encoding="utf-8") as f:
        Handler.script = json.load(f)
    Handler.log_path = log_file
    open(log_file, "a").close()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    tmp = port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{server.server_address[1]}\n")
    os.rename(tmp, port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
