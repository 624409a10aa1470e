#!/usr/bin/env python3
"""An external reward server for fuseflow (protocol version 1; docs/graphs.md).

ZeroMQ REP socket; each request and reply is one JSON object in one frame:

  request  {"version": 1, "id": 7, "function": "arith" | null,
            "items": [{"prompt": "...", "response": "...", "answer": "...", "metadata": {...}}]}
  reply    {"version": 1, "id": 7, "scores": [1.0, 0.0, ...]}
  error    {"version": 1, "id": 7, "error": "what went wrong"}
  ping     {"version": 1, "id": 8, "ping": true}  ->  {"version": 1, "id": 8, "pong": true}

Run it, then point a reward_fn node at it:

  python3 examples/reward_server.py --bind tcp://127.0.0.1:5555
  # graph:
  #   reward: {op: reward_fn, in: [prompt, response, answer], out: [score],
  #            function: remote, endpoint: "tcp://127.0.0.1:5555", server_function: arith}

Add your own scoring function to FUNCTIONS (any Python: a verifier, a sandbox, an LLM judge).
Needs pyzmq (Debian: python3-zmq). Stops on Ctrl-C, SIGTERM, or after --max-requests.
"""
import argparse
import json
import re
import signal
import sys

import zmq

PROTOCOL_VERSION = 1
# a sign belongs to a number unless it follows a letter or digit ("7-3" is 7 and 3), as in C
NUMBER = re.compile(r"(?<![0-9A-Za-z])[-+]?\d+(?:,\d+)*(?:\.\d+)?|\d+(?:,\d+)*(?:\.\d+)?")


def normalize(text):
    """'+0,012.50' -> '12.5'; None when text is not a number (mirrors fuseflow's rule)."""
    text = text.strip()
    if not re.fullmatch(r"[-+]?\d[\d,]*(?:\.\d+)?", text):
        return None
    neg = text.startswith("-")
    text = text.lstrip("+-").replace(",", "")
    whole, _, frac = text.partition(".")
    whole = whole.lstrip("0") or "0"
    frac = frac.rstrip("0")
    out = whole + ("." + frac if frac else "")
    return "-" + out if neg and out != "0" else out


def arith(item):
    """1.0 when the first number in the response equals the reference answer (as fuseflow's
    built-in arith_exact_match: the bundled task's answer starts the response)."""
    found = NUMBER.findall(item.get("response") or "")
    answer = item.get("answer")
    if answer is None or not found:
        return 0.0
    want = normalize(str(answer))
    return 1.0 if want is not None and normalize(found[0]) == want else 0.0


def length(item):
    """The response's length in characters (a toy: reward verbosity)."""
    return float(len(item.get("response") or ""))


FUNCTIONS = {"arith": arith, "length": length}


def handle(raw):
    try:
        req = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        return {"version": PROTOCOL_VERSION, "id": None, "error": f"request is not JSON: {e}"}
    if not isinstance(req, dict):
        return {"version": PROTOCOL_VERSION, "id": None, "error": "request is not a JSON object"}
    rid = req.get("id")
    if req.get("version") != PROTOCOL_VERSION:
        return {"version": PROTOCOL_VERSION, "id": rid, "error": f"unsupported protocol version {req.get('version')!r}"}
    if req.get("ping"):
        return {"version": PROTOCOL_VERSION, "id": rid, "pong": True}
    name = req.get("function") or "arith"
    fn = FUNCTIONS.get(name)
    if fn is None:
        return {"version": PROTOCOL_VERSION, "id": rid, "error": f"unknown function {name!r} (known: {', '.join(FUNCTIONS)})"}
    items = req.get("items")
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        return {"version": PROTOCOL_VERSION, "id": rid, "error": "'items' must be a list of objects"}
    try:
        scores = [float(fn(i)) for i in items]
    except Exception as e:  # a bug in a scoring function is reported, not fatal
        return {"version": PROTOCOL_VERSION, "id": rid, "error": f"{name} failed: {e!r}"}
    return {"version": PROTOCOL_VERSION, "id": rid, "scores": scores}


def main():
    ap = argparse.ArgumentParser(description="fuseflow reward server (ZeroMQ REP, JSON)")
    ap.add_argument("--bind", default="tcp://127.0.0.1:5555", help="endpoint to listen on (tcp://HOST:PORT or ipc:///path)")
    ap.add_argument("--max-requests", type=int, default=0, help="exit after this many requests (0: run until stopped)")
    args = ap.parse_args()

    ctx = zmq.Context()
    sock = ctx.socket(zmq.REP)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(args.bind)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    print(f"reward server: listening on {args.bind} (functions: {', '.join(FUNCTIONS)})", file=sys.stderr, flush=True)
    served = 0
    try:
        while not stop and (args.max_requests <= 0 or served < args.max_requests):
            if not sock.poll(200):
                continue
            reply = handle(sock.recv())
            sock.send(json.dumps(reply).encode())
            served += 1
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
        ctx.term()


if __name__ == "__main__":
    main()
