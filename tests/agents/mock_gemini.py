#!/usr/bin/env python3
"""mock_gemini.py — a scripted stand-in for the Gemini API, for driving the real Gemini CLI
in tests with no network and no model.

usage: mock_gemini.py SCRIPT.json PORT_FILE LOG_FILE

Binds 127.0.0.1 on a free port (loopback only: nothing can reach it from elsewhere, and it
calls nothing), writes the port to PORT_FILE (atomically: write + rename) and prints
"ready PORT" on stdout, then serves until killed. Point the CLI at it with
GOOGLE_GEMINI_BASE_URL=http://127.0.0.1:PORT.

SCRIPT.json maps a marker to the tool calls that answer a prompt containing it:
  {"prompts": {"[p1]": [{"name": "write_file", "args": {...}}, ...], ...}}
For a generateContent / streamGenerateContent request, the prompt is the last user turn
with text in "contents"; the number of model turns after it is how many of its calls were
already made. The answer is the next call as a functionCall part, or, once all are made, a
final text "done: MARKER". The mock keeps no state, so concurrent sessions (one CLI each)
can share it. A request whose prompt has no known marker (the CLI's own internal calls)
gets a JSON text that satisfies the CLI's small classifiers (next speaker: user).
countTokens answers a token estimate; anything else is 404 and logged.

Every request is appended to LOG_FILE as one JSON line:
  {"method", "path", "marker", "step", "answer", "prompts"}
(answer: a tool name, "text", "json", "count" or "404"; prompts, for generate requests: how
many user prompts the request's history holds, e.g. 2 for the second prompt of a session)
"""
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SCRIPT = {}
LOG_FILE = None
LOG_LOCK = threading.Lock()


def log(entry):
    with LOG_LOCK, open(LOG_FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")


def is_prompt(content):
    """Whether a turn of "contents" is a user prompt (text, not a tool result)."""
    parts = content.get("parts", [])
    return (content.get("role", "user") == "user"
            and any(isinstance(p.get("text"), str) for p in parts)
            and not any("functionResponse" in p for p in parts))


def prompt_and_step(contents):
    """The text of the last user prompt, and how many model turns followed it."""
    for i in range(len(contents) - 1, -1, -1):
        if is_prompt(contents[i]):
            texts = [p["text"] for p in contents[i]["parts"] if isinstance(p.get("text"), str)]
            step = sum(1 for d in contents[i + 1:] if d.get("role") == "model")
            return "\n".join(texts), step
    return "", 0


def answer(body):
    """(response JSON, marker, step, answer kind) for a generate request body."""
    prompt, step = prompt_and_step(body.get("contents", []))
    marker = next((m for m in SCRIPT.get("prompts", {}) if m in prompt), None)
    usage = {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15}
    if marker is None:
        text = json.dumps({"reasoning": "mock", "next_speaker": "user",
                           "model_choice": "flash", "complexity_score": 1})
        part, kind = {"text": text}, "json"
    else:
        calls = SCRIPT["prompts"][marker]
        if step < len(calls):
            call = calls[step]
            part = {"functionCall": {"name": call["name"], "args": call["args"]}}
            kind = call["name"]
        else:
            part, kind = {"text": "done: " + marker}, "text"
    response = {
        "candidates": [{"content": {"role": "model", "parts": [part]},
                        "finishReason": "STOP", "index": 0}],
        "usageMetadata": usage,
        "modelVersion": "mock-gemini",
    }
    return response, marker, step, kind


def generate(path, body):
    """Answers a generate request and logs it; the number of prompts in its history shows
    whether the CLI sent an earlier conversation along (a resumed session)."""
    resp, marker, step, kind = answer(body)
    prompts = sum(1 for c in body.get("contents", []) if is_prompt(c))
    log({"method": "POST", "path": path, "marker": marker, "step": step, "answer": kind,
         "prompts": prompts})
    return resp


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet: the request log is LOG_FILE
        pass

    def send_json(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        log({"method": "GET", "path": self.path, "marker": None, "step": None,
             "answer": "404"})
        self.send_json(404, {"error": {"code": 404, "message": "mock: not served"}})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        path = self.path.split("?", 1)[0]
        if path.endswith(":countTokens"):
            n = len(raw) // 4
            log({"method": "POST", "path": self.path, "marker": None, "step": None,
                 "answer": "count"})
            self.send_json(200, {"totalTokens": n})
        elif path.endswith(":generateContent"):
            self.send_json(200, generate(self.path, body))
        elif path.endswith(":streamGenerateContent"):
            data = ("data: " + json.dumps(generate(self.path, body)) + "\r\n\r\n").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            log({"method": "POST", "path": self.path, "marker": None, "step": None,
                 "answer": "404"})
            self.send_json(404, {"error": {"code": 404, "message": "mock: not served"}})


def main():
    global SCRIPT, LOG_FILE
    if len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0)
    if len(sys.argv) != 4:
        sys.exit("usage: mock_gemini.py SCRIPT.json PORT_FILE LOG_FILE (see --help)")
    with open(sys.argv[1], encoding="utf-8") as f:
        SCRIPT = json.load(f)
    port_file, LOG_FILE = sys.argv[2], sys.argv[3]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    port = server.server_address[1]
    tmp = port_file + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(f"{port}\n")
    os.rename(tmp, port_file)
    print(f"ready {port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
