#!/usr/bin/env bash
# Log-probabilities from `myriad serve`, both APIs, against the model's own
# distribution: greedy tokens are the argmax of their top_logprobs (and the
# text is `myriad generate`'s); the values do not depend on temperature or
# top-k (the model's log_softmax is reported, not the sampler's); streamed
# chunks carry the same entries as the whole response; completions'
# tokens and text_offset spell out the text; echo + logprobs scores a
# prompt of token ids (what a remote distillation teacher serves); bad
# requests are 400.
# (The numeric oracle, log_softmax recomputed in long double from an
# independent InferenceSession, is engine_test's LogprobsAreTheModelsLogSoftmax.)
# Usage: serve_logprobs.sh MYRIAD_BINARY SOURCE_DIR
source "$(dirname "$0")/lib.sh" "$1" "$2"
source "$(dirname "$0")/serve_lib.bash"
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
export OMP_NUM_THREADS=1
train_tiny_model
PROMPT="The configuration file names every key"
# (generate prints the prompt, the output and a newline; the x keeps trailing newlines)
GEN=$("$MYRIAD" generate --ckpt "$WORK/run" --prompt "$PROMPT" --max-tokens 10 --temperature 0 2>/dev/null; echo x)
GEN="${GEN%x}"
start_server
"$PY" - "$URL" "$PROMPT" "$GEN" <<'PYEOF' && pass "logprobs checks" || fail "logprobs checks"
import json, math, sys, urllib.request, urllib.error
url, prompt, gen = sys.argv[1], sys.argv[2], sys.argv[3]
fails = 0
def check(ok, what):
    global fails
    print(("ok: " if ok else "FAIL: ") + what)
    fails += 0 if ok else 1
def post(path, body, stream=False):
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        r = urllib.request.urlopen(req, timeout=60)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
    if not stream:
        return r.status, json.loads(r.read())
    chunks = [json.loads(l[6:]) for l in r.read().decode().splitlines() if l.startswith("data: {")]
    return r.status, chunks

msgs = [{"role": "user", "content": "name a key"}]
base = {"model": "tiny", "messages": msgs, "max_tokens": 10, "logprobs": True, "top_logprobs": 5}
st, j = post("/v1/chat/completions", dict(base, temperature=0))
content = j["choices"][0]["logprobs"]["content"]
check(st == 200 and len(content) == j["usage"]["completion_tokens"], f"chat: one entry per token ({len(content)})")
greedy = all(e["top_logprobs"][0]["token"] == e["token"] and e["top_logprobs"][0]["logprob"] == e["logprob"] for e in content)
check(greedy, "chat, greedy: every token is its top_logprobs' first, with the largest logprob")
check(all(len(e["top_logprobs"]) == 5 and all(a["logprob"] >= b["logprob"] for a, b in zip(e["top_logprobs"], e["top_logprobs"][1:]))
          and sum(math.exp(t["logprob"]) for t in e["top_logprobs"]) <= 1 + 1e-5 and e["logprob"] <= 0 for e in content),
      "chat: 5 alternatives, most likely first, probabilities summing to at most 1")
text = j["choices"][0]["message"]["content"].encode()
check(b"".join(bytes(e["bytes"]) for e in content) == text, "chat: the tokens' bytes spell the message")
# Not the sampler's distribution: top_k 1 at temperature 0.7 samples the same tokens, with the same logprobs.
st, k1 = post("/v1/chat/completions", dict(base, temperature=0.7, top_k=1, seed=3))
c1 = k1["choices"][0]["logprobs"]["content"]
check([e["token"] for e in c1] == [e["token"] for e in content] and
      all(abs(a["logprob"] - b["logprob"]) < 1e-6 for a, b in zip(c1, content)),
      "logprobs are the model's, not the sampler's (top_k=1: same values, not 0)")
st, chunks = post("/v1/chat/completions", dict(base, temperature=0, stream=True), stream=True)
streamed = [e for c in chunks for ch in c["choices"] if ch.get("logprobs") for e in ch["logprobs"]["content"]]
same = len(streamed) == len(content) and all(a["token"] == b["token"] and abs(a["logprob"] - b["logprob"]) < 1e-6
                                             for a, b in zip(streamed, content))
check(same, f"chat stream: the chunks carry the same {len(streamed)} entries")
if not same:
    print("streamed:", json.dumps(streamed)[:600]); print("whole:", json.dumps(content)[:600])
# Completions.
cb = {"model": "tiny", "prompt": prompt, "max_tokens": 10, "temperature": 0, "logprobs": 3}
st, c = post("/v1/completions", cb)
lp = c["choices"][0]["logprobs"]
ctext = c["choices"][0]["text"]
check(prompt + ctext + "\n" == gen, f"completions: greedy text is myriad generate's ({ctext!r})")
check(all(len(t) <= 4 and lp["token_logprobs"][i] == max(t.values()) and t[lp["tokens"][i]] == lp["token_logprobs"][i]
          for i, t in enumerate(lp["top_logprobs"])), "completions: each token's logprob is the max of its top_logprobs")
check(lp["text_offset"][0] == 0 and all(a <= b for a, b in zip(lp["text_offset"], lp["text_offset"][1:])),
      "completions: text_offset starts at 0 and grows")
check("".join(lp["tokens"]) == ctext, "completions: the tokens spell the text")
st, one = post("/v1/completions", dict(cb, max_tokens=1))
check(abs(one["choices"][0]["logprobs"]["token_logprobs"][0] - lp["token_logprobs"][0]) < 1e-6,
      "completions: the first token's logprob is the same alone")
st, none = post("/v1/completions", dict(cb, logprobs=None))
check(none["choices"][0]["logprobs"] is None, "no logprobs asked: null")
for body, param in [(dict(base, top_logprobs=21), "top_logprobs"), (dict(base, logprobs=False), "top_logprobs"),
                    (dict(base, tools=[{"type": "function", "function": {"name": "f"}}]), "tools"),
                    (dict(base, tool_choice="required"), "tool_choice")]:
    st, e = post("/v1/chat/completions", body)
    check(st == 400 and e["error"]["param"] == param, f"400 on {param}: {e['error']['message']}")
# Scoring a prompt (echo + logprobs, max_tokens 0): the prompt's own tokens, each given the ones before
# it. Scoring the greedy prompt + completion ids must give the completion tokens the logprobs the
# generation reported for them (two paths through the engine: decode steps, and one prefill with
# every row's logits), and the prompt ids back in token_ids.
ids_body = dict(cb, logprobs=3, max_tokens=10)
st, g = post("/v1/completions", ids_body)
glp = g["choices"][0]["logprobs"]
st, tk = post("/v1/completions", dict(cb, prompt=[1, 2, 3], max_tokens=1))  # token ids are accepted
check(st == 200, f"completions: a token-id prompt ({st})")
gen_ids = glp["token_ids"]
check(len(gen_ids) == len(glp["tokens"]) and all(isinstance(i, int) for i in gen_ids), "completions: token_ids extension")
# The prompt's ids: score the text prompt alone first.
st, sp = post("/v1/completions", dict(cb, echo=True, max_tokens=0))
slp = sp["choices"][0]["logprobs"]
prompt_ids = slp["token_ids"]
check(st == 200 and sp["usage"]["completion_tokens"] == 0 and sp["choices"][0]["text"] == prompt,
      f"score only: no tokens generated, the text is the prompt ({st}, {sp.get('usage')})")
check(slp["token_logprobs"][0] is None and slp["top_logprobs"][0] is None and slp["top_logprobs_ids"][0] is None
      and all(v is not None and v <= 0 for v in slp["token_logprobs"][1:]) and len(prompt_ids) == sp["usage"]["prompt_tokens"],
      "score only: the first prompt token has nulls, every other a logprob")
check(all(len(t) <= 3 and t[0][1] >= t[-1][1] for t in slp["top_logprobs_ids"][1:]),
      "score only: top_logprobs_ids, 3 per token, most likely first")
st, sc = post("/v1/completions", dict(cb, prompt=prompt_ids + gen_ids, echo=True, max_tokens=0))
sclp = sc["choices"][0]["logprobs"]
n0 = len(prompt_ids)
tail = sclp["token_logprobs"][n0:]
check(st == 200 and sclp["token_ids"] == prompt_ids + gen_ids and len(tail) == len(gen_ids) and
      all(abs(a - b) < 1e-4 for a, b in zip(tail, glp["token_logprobs"])),
      "scoring prompt + completion gives the completion the generation's logprobs")
check([t[0][0] for t in sclp["top_logprobs_ids"][n0:]] == gen_ids, "scored greedy completion: each token is its top-1 id")
st, e = post("/v1/completions", dict(cb, echo=True, max_tokens=0, stream=True))
check(st == 400 and e["error"]["param"] == "echo", f"400 on scoring while streaming: {e['error']['message']}")
st, e = post("/v1/completions", dict(cb, max_tokens=0))
check(st == 400 and e["error"]["param"] == "max_tokens", f"400 on max_tokens 0 without echo: {e['error']['message']}")
st, e = post("/v1/completions", dict(cb, logprobs=6))
check(st == 400 and e["error"]["param"] == "logprobs", f"400 on completions logprobs 6: {e['error']['message']}")
sys.exit(1 if fails else 0)
PYEOF
stop_server && pass "server stopped cleanly" || fail "server exit: $(tail -5 "$WORK/serve.log")"
finish
