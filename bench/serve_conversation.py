#!/usr/bin/python3
"""`ktier serve`: a conversation's second message on a server that keeps the first's sequence,
against a fresh server (docs/PERFORMANCE.md "Serving"). Greedy, 4 tokens per answer.

    bench/serve_conversation.py KTIER MODEL_DIR PROMPT_FILE

Prints each request's prompt tokens, reused tokens, prefill time (the response's timings) and
whole request time, and whether the two second answers are the same text.
"""
import json, subprocess, sys, threading, time, urllib.request, re
if len(sys.argv) != 4:
    raise SystemExit(__doc__)
ktier, model = sys.argv[1], sys.argv[2]
first = open(sys.argv[3]).read()
def start():
    p = subprocess.Popen([ktier, "serve", "-m", model, "--port", "0", "-c", "2048"], stderr=subprocess.PIPE, text=True)
    line, seen = "", []
    while "Ctrl-C stops" not in line:
        line = p.stderr.readline()
        if not line: raise SystemExit("server did not start:\n" + "".join(seen[-5:]))
        seen.append(line)
    port = re.search(r"127\.0\.0\.1:(\d+)", line).group(1)
    # Its log read on to the end: a full pipe would stop the server mid-request.
    threading.Thread(target=lambda: p.stderr.read(), daemon=True).start()
    return p, "http://127.0.0.1:" + port
def post(base, body):
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode())
    t = time.time()
    with urllib.request.urlopen(req, timeout=600) as r: j = json.load(r)
    return j, time.time() - t
u1 = [{"role": "user", "content": first}]
p, base = start()
a, t1 = post(base, {"messages": u1, "max_tokens": 4, "temperature": 0})
m2 = u1 + [{"role": "assistant", "content": a["choices"][0]["message"]["content"]}, {"role": "user", "content": "Say it again, shorter."}]
b, t2 = post(base, {"messages": m2, "max_tokens": 4, "temperature": 0})
p.terminate(); p.wait()
p, base = start()
c, t3 = post(base, {"messages": m2, "max_tokens": 4, "temperature": 0})
p.terminate(); p.wait()
for name, j, t in (("first message", a, t1), ("second, reused", b, t2), ("second, fresh server", c, t3)):
    u, tm = j["usage"], j["timings"]
    print(f"{name}: prompt {u['prompt_tokens']} cached {u['prompt_tokens_details']['cached_tokens']} prefill {tm['prompt_ms']/1e3:.2f} s request {t:.2f} s text {j['choices'][0]['message']['content']!r}")
print("same answer:", b["choices"][0]["message"]["content"] == c["choices"][0]["message"]["content"])
