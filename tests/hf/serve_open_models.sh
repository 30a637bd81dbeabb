#!/usr/bin/env bash
# Imported open models served through the OpenAI API (`myriad import`, then
# `myriad serve --ckpt`), each with its byte-level BPE tokenizer and Jinja
# chat template: a Qwen3-MoE-shaped tiny model (a dense layer between MoE
# layers) and a DeepSeek-V3-shaped one (MLA: the latent cache in the pool
# and every tier; the sigmoid group-limited router, a shared expert, MTP).
#   - Prefix-cache hits from every tier (the device pool, host, disk after a
#     restart, Redis between two servers) give greedy output identical to a server
#     without a prefix cache (tests/e2e/serve_tiers_lib.bash, the checks our
#     own tiny model passes in e2e_serve_tiers).
#   - /v1/chat/completions renders the model's template: the reply equals the
#     greedy completion of the prompt Python's jinja2 renders from the same
#     template (tests/hf/render_chat_jinja2.py), with the same prompt tokens.
# Args: build dir, source dir, myriad binary.
BUILD="$(cd "$1" && pwd)"
source "$2/tests/e2e/lib.sh" "$3" "$2"
PY=/usr/bin/python3
command -v redis-server >/dev/null || { echo "FAIL: redis-server not installed (hint: scripts/install-deps.sh)"; exit 1; }
export OMP_NUM_THREADS=1
# serve_family FAMILY MAKE_TINY_ARGS...: import a tiny folder, run the tier
# and chat-template checks on it.
serve_family() {
local family="$1"; shift
echo "==== $family"
HF="$WORK/$family"
rm -rf "$WORK/run" "$WORK/kvdisk" "$WORK/redis"
"$PY" "$SRC/tests/hf/make_tiny.py" --family "$family" --out "$HF" --tokenizer --dtype bf16 "$@" >"$WORK/make_tiny.log" 2>&1 ||
  { echo "FAIL: make_tiny: $(tail -3 "$WORK/make_tiny.log")"; exit 1; }
"$MYRIAD" import "$HF" --out "$WORK/run" >"$WORK/import.log" 2>&1 ||
  { echo "FAIL: import: $(tail -3 "$WORK/import.log")"; exit 1; }
pass "imported $(grep -oE '[A-Za-z0-9]+ForCausalLM, [0-9]+ parameters' "$WORK/import.log")"
SERVE_MODEL="--ckpt $WORK/run"
run_tier_checks 33 200

echo "== $family: the chat template"
MSGS='[{"role":"system","content":"You answer briefly."},{"role":"user","content":"What is in the weekly report?"}]'
"$PY" - "$HF/tokenizer_config.json" "$MSGS" "$WORK/case.json" <<'PYEOF'
import json, sys
tc = json.load(open(sys.argv[1]))
open(sys.argv[3] + ".jinja", "w").write(tc["chat_template"])
case = {"id": "serve", "template_path": sys.argv[3] + ".jinja",
        "variables": {"messages": json.loads(sys.argv[2]), "add_generation_prompt": True,
                      "bos_token": tc["bos_token"] or "", "eos_token": tc["eos_token"]}}
json.dump({"clock": [2026, 12, 2, 12, 0, 0], "cases": [case]}, open(sys.argv[3], "w"))
PYEOF
"$PY" "$SRC/tests/hf/render_chat_jinja2.py" "$WORK/case.json" "$WORK/rendered.json" ||
  { echo "FAIL: jinja2 rendering"; exit 1; }
# The completion gets the rendering without a leading bos: the server
# prepends bos to a completion prompt when the tokenizer adds one.
RENDERED=$("$PY" -c '
import json, sys
out = json.load(open(sys.argv[1]))["results"][0]["output"]
tc = json.load(open(sys.argv[2]))
if tc.get("add_bos_token") and tc.get("bos_token") and out.startswith(tc["bos_token"]):
    out = out[len(tc["bos_token"]):]
print(json.dumps(out))' "$WORK/rendered.json" "$HF/tokenizer_config.json")
start_server --no-prefix-cache
chat=$(curl -sf "$URL/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "{\"model\":\"tiny\",\"messages\":$MSGS,\"max_tokens\":12,\"temperature\":0}") || { fail "chat request"; }
comp=$(curl -sf "$URL/v1/completions" -H 'Content-Type: application/json' \
  -d "{\"model\":\"tiny\",\"prompt\":$RENDERED,\"max_tokens\":12,\"temperature\":0}") || { fail "completion request"; }
"$PY" - "$chat" "$comp" <<'PYEOF' && pass "chat reply = completion of jinja2's rendering (same text, same prompt tokens)" || fail "chat and rendered completion differ"
import json, sys
c, p = json.loads(sys.argv[1]), json.loads(sys.argv[2])
ct, pt = c["choices"][0]["message"]["content"], p["choices"][0]["text"]
cu, pu = c["usage"]["prompt_tokens"], p["usage"]["prompt_tokens"]
print(f"chat: {ct!r} ({cu} prompt tokens); completion: {pt!r} ({pu} prompt tokens)")
sys.exit(0 if ct == pt and cu == pu and cu > 20 else 1)
PYEOF
stop_server
# The device pool's prefix cache: the same chat again hits it, same reply.
start_server
chat1=$(curl -sf "$URL/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "{\"model\":\"tiny\",\"messages\":$MSGS,\"max_tokens\":12,\"temperature\":0}") || fail "chat request"
chat2=$(curl -sf "$URL/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "{\"model\":\"tiny\",\"messages\":$MSGS,\"max_tokens\":12,\"temperature\":0}") || fail "chat request"
"$PY" - "$chat" "$chat1" "$chat2" <<'PYEOF' && pass "device-pool hit: the same reply as without a cache" || fail "device-pool hit"
import json, sys
ref, a, b = (json.loads(x) for x in sys.argv[1:4])
text = lambda j: j["choices"][0]["message"]["content"]
cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
print(f"cached_tokens {cached} on the repeat")
sys.exit(0 if text(a) == text(ref) and text(b) == text(ref) and cached >= 16 else 1)
PYEOF
grep -q 'chat template: .*tokenizer_config.json.* (Jinja)' "$WORK/serve.log" && pass "the server names the model's Jinja template" ||
  fail "the serve log does not name the Jinja template: $(grep 'chat template' "$WORK/serve.log")"
stop_server
}

source "$SRC/tests/e2e/serve_lib.bash"
source "$SRC/tests/e2e/serve_tiers_lib.bash"
serve_family qwen3_moe
serve_family deepseek_v3
finish
