#!/usr/bin/env python3
"""Concurrent conversations against an OpenAI-compatible server, graded.

Each conversation is a generated evaluation session (evoke-taskgen, the
evaluation split the model never trained on) of the trained model's task
language, cut into turns at its questions: a turn sends the conversation so
far, up to "answer :", to /v1/completions (greedy, as many tokens as the
answer's value has), and the reply is graded by exact match against the
fact's value the session gave earlier. The model's own reply then stays in
the conversation, and the next turn adds the session's text after the
answer up to the next question: the same sessions, probes and grading as
evoke-eval (eval/session_runner.h), over HTTP.

N clients run conversations back to back for --duration seconds. Reported:
requests, failures (anything but HTTP 200, or a transport error), latency
p50 / p99 (whole request, and time to first token from the stream), prompt
tokens the server did not compute (usage.prompt_tokens_details), and probes
answered.

  scripts/serve-conversations.py --url http://127.0.0.1:8080 --clients 8 \\
      --duration 300 --length 2048 --json out.json

Nothing here knows a policy or what a server keeps: the same run measures
evoke-serve and llama-server.
"""
import argparse
import json
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request


def sessions(taskgen, task, length, first_seed, count):
    out = subprocess.run([taskgen, "--split", "eval", "--tasks", task, "--length", str(length),
                          "--first-seed", str(first_seed), "--count", str(count), "--print"],
                         check=True, capture_output=True, text=True).stdout
    result = []
    for block in re.split(r"^# ", out, flags=re.M)[1:]:
        header, _, text = block.partition("\n")
        text = text.replace("<s>", " ").strip()
        turns = []
        pos = 0
        for m in re.finditer(r"answer :", text):
            # The answer's value: the words up to its period ("D D D"), as
            # evoke-eval grades it; the period and what follows are the
            # session's own text, sent with the next turn.
            rest = text[m.end():]
            value = rest.split(" .", 1)[0]
            turns.append((text[pos:m.end()], " ".join(value.split())))
            pos = m.end() + len(value)
        result.append({"header": header.strip(), "turns": turns})
    return result


def post(url, body, api_key, timeout):
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    if api_key:
        req.add_header("Authorization", "Bearer " + api_key)
    start = time.monotonic()
    first = None
    text, usage, status, error = "", {}, 0, ""
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status = resp.status
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    status, error = 599, json.dumps(event["error"])[:200]
                    break
                for c in event.get("choices", []):
                    if c.get("text"):
                        if first is None:
                            first = time.monotonic() - start
                        text += c["text"]
                if event.get("usage"):
                    usage = event["usage"]
    except urllib.error.HTTPError as e:
        status, error = e.code, e.read().decode()[:200]
    except Exception as e:  # noqa: BLE001 - any transport failure is a failed request
        status, error = 0, repr(e)[:200]
    total = time.monotonic() - start
    return status, text, usage, total, first if first is not None else total, error


def token_prompt(url, text, bos):
    """[bos] + the server's tokens of `text` (its /tokenize, no special tokens)."""
    req = urllib.request.Request(url + "/tokenize", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"content": text, "add_special": False}).encode())
    with urllib.request.urlopen(req, timeout=60) as resp:
        return [bos] + json.load(resp)["tokens"]


def percentile(values, p):
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100.0 * (len(v) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", default="evoke-recall")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--duration", type=float, default=300)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--task", default="multifact")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--sessions", type=int, default=64, help="generated; reused round-robin")
    ap.add_argument("--once", action="store_true",
                    help="each session once, then stop (a fixed, graded set)")
    ap.add_argument("--taskgen", default="build/eval/evoke-taskgen")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--json", default="")
    ap.add_argument("--token-prompts", type=int, default=-1, metavar="BOS",
                    help="send each prompt as token ids: BOS, then the server's /tokenize of the "
                         "text without special tokens (llama-server, whose text prompts get the "
                         "trained model's separator appended); not timed")
    a = ap.parse_args()

    pool = sessions(a.taskgen, a.task, a.length, a.first_seed, a.sessions)
    lock = threading.Lock()
    records = []
    next_session = [0]
    deadline = time.monotonic() + a.duration

    def client(cid):
        while time.monotonic() < deadline:
            with lock:
                if a.once and next_session[0] >= len(pool):
                    return
                s = pool[next_session[0] % len(pool)]
                conv = next_session[0]
                next_session[0] += 1
            prompt = ""
            for turn, (segment, answer) in enumerate(s["turns"]):
                if time.monotonic() >= deadline:
                    return
                prompt = (prompt.rstrip() + " " + segment.strip()).strip()
                sent = prompt if a.token_prompts < 0 else token_prompt(a.url, prompt,
                                                                       a.token_prompts)
                body = {"model": a.model, "prompt": sent, "max_tokens": len(answer.split()),
                        "temperature": 0,
                        "stream": True, "stream_options": {"include_usage": True}}
                status, text, usage, total, ttft, error = post(a.url, body, a.api_key, a.timeout)
                reply = " ".join(text.split())
                details = usage.get("prompt_tokens_details") or {}
                with lock:
                    records.append({"client": cid, "conversation": conv, "turn": turn,
                                    "status": status, "seconds": total, "ttft": ttft,
                                    "prompt_tokens": usage.get("prompt_tokens", 0),
                                    "cached_tokens": details.get("cached_tokens", 0),
                                    "pass": status == 200 and reply == answer,
                                    "reply": reply, "answer": answer, "error": error})
                if status != 200:
                    break  # A failed turn ends the conversation.
                prompt = prompt + " " + reply

    threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    ok = [r for r in records if r["status"] == 200]
    failed = [r for r in records if r["status"] != 200]
    summary = {
        "url": a.url, "clients": a.clients, "duration_s": round(elapsed, 1), "task": a.task,
        "length": a.length, "requests": len(records), "failed": len(failed),
        "conversations": len({r["conversation"] for r in records}),
        "probes_passed": sum(r["pass"] for r in records), "probes": len(records),
        "p50_s": percentile([r["seconds"] for r in ok], 50),
        "p99_s": percentile([r["seconds"] for r in ok], 99),
        "ttft_p50_s": percentile([r["ttft"] for r in ok], 50),
        "ttft_p99_s": percentile([r["ttft"] for r in ok], 99),
        "prompt_tokens": sum(r["prompt_tokens"] for r in ok),
        "cached_tokens": sum(r["cached_tokens"] for r in ok),
        "max_prompt_tokens": max([r["prompt_tokens"] for r in ok], default=0),
        "first_errors": sorted({r["error"] for r in failed})[:3],
    }
    print(json.dumps(summary, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"summary": summary, "records": records}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
