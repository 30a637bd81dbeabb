#!/usr/bin/env bash
# myriad redact: spans in code points of the original (checked with python3
# against hand-written expectations and independently computed check
# characters), one vault across two calls, exact restore, unresolved
# placeholders -> exit 3, malformed vault and missing files -> one clear line.
source "$(dirname "$0")/lib.sh" "$@"
command -v python3 >/dev/null || { echo "python3 missing"; exit 1; }

# Check characters computed here, apart from the C++ under test.
read -r ID CARD <<<"$(python3 - <<'PY'
w = [7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2]
body = "11010519900307123"
idn = body + "10X98765432"[sum(int(a) * b for a, b in zip(body, w)) % 11]
def luhn_ok(d):
    s = 0
    for i, c in enumerate(reversed(d)):
        x = int(c) * (2 if i % 2 else 1)
        s += x - 9 if x > 9 else x
    return s % 10 == 0
card = next(b for b in ("622202123456789012" + c for c in "0123456789") if luhn_ok(b))
print(idn, card)
PY
)"
printf '张三的身份证 %s，手机 +86 138-0013-8000，卡号 %s。\n订单号 20231105143015 不是。\n' "$ID" "$CARD" >"$WORK/a.txt"
printf '再打 138 0013 8000 或发邮件 Zhang@Example.com。\n' >"$WORK/b.txt"

# --json: spans in code points with their text.
if "$MYRIAD" redact --json --vault "$WORK/v.json" "$WORK/a.txt" >"$WORK/a.json" 2>"$WORK/err"; then
  if python3 - "$WORK/a.txt" "$WORK/a.json" "$ID" "$CARD" <<'PY'
import json, sys
text = open(sys.argv[1], encoding="utf-8").read()
out = json.loads(open(sys.argv[2], encoding="utf-8").read())
idn, card = sys.argv[3], sys.argv[4]
want = [(idn, "ID_CN"), ("+86 138-0013-8000", "PHONE"), (card, "BANK_CARD")]
got = [(s["text"], s["type"]) for s in out["spans"]]
assert got == want, (got, want)
for s in out["spans"]:
    assert text[s["start"]:s["end"]] == s["text"], s  # code points of the original
    assert 0.5 <= s["confidence"] <= 1
assert out["doc"] == sys.argv[1]
assert out["redacted"] == text.replace(idn, "⟦ID_CN_1⟧").replace("+86 138-0013-8000", "⟦PHONE_1⟧").replace(card, "⟦BANK_CARD_1⟧"), out["redacted"]
PY
  then pass "--json spans on code points, decoy timestamp kept"; else fail "--json spans: $(cat "$WORK/a.json")"; fi
else fail "redact --json failed: $(cat "$WORK/err")"; fi

# A second call with the same vault: the same phone in another form keeps PHONE_1.
out="$("$MYRIAD" redact --vault "$WORK/v.json" "$WORK/b.txt" 2>&1)" || true
if [ "$out" = "再打 ⟦PHONE_1⟧ 或发邮件 ⟦EMAIL_1⟧。" ]; then pass "vault consistent across calls"
else fail "second call: $out"; fi

# stdin and --input-jsonl.
out="$(printf '电话 13900139000' | "$MYRIAD" redact --vault "$WORK/v.json" 2>&1)" || true
if [ "$out" = "电话 ⟦PHONE_2⟧" ]; then pass "stdin, next index"; else fail "stdin: $out"; fi
printf '{"id": "d1", "text": "mail zhang@example.COM"}\n{"text": "no pii here"}\n' >"$WORK/in.jsonl"
if "$MYRIAD" redact --json --input-jsonl --vault "$WORK/v.json" "$WORK/in.jsonl" >"$WORK/j.out" 2>"$WORK/err" &&
   python3 - "$WORK/j.out" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
assert [l["doc"] for l in lines] == ["d1", sys.argv[1].replace("j.out", "in.jsonl") + ":2"], lines
assert lines[0]["redacted"] == "mail ⟦EMAIL_1⟧" and lines[1]["redacted"] == "no pii here", lines
assert lines[1]["spans"] == []
PY
then pass "--input-jsonl"; else fail "--input-jsonl: $(cat "$WORK/j.out" "$WORK/err")"; fi

# Restore: exact originals, reformatted placeholders included.
printf '请联系 [[phone_1]]（⟦ PERSON 9 ⟧ 无）' >"$WORK/bad_answer.txt"
printf '已核对 【ID_CN_1】，卡 ⟦bank card 1⟧，电话 ⟦PHONE_1⟧ / ⟦PHONE_2⟧，邮箱 [EMAIL_1]。' >"$WORK/answer.txt"
out="$("$MYRIAD" redact --restore --vault "$WORK/v.json" "$WORK/answer.txt" 2>"$WORK/err")" && rc=0 || rc=$?
want="已核对 $ID，卡 $CARD，电话 +86 138-0013-8000 / 13900139000，邮箱 Zhang@Example.com。"
if [ "$rc" -eq 0 ] && [ "$out" = "$want" ]; then pass "--restore exact"; else fail "--restore rc $rc: $out / $(cat "$WORK/err")"; fi
out="$("$MYRIAD" redact --restore --vault "$WORK/v.json" - <"$WORK/bad_answer.txt" 2>"$WORK/err")" && rc=0 || rc=$?
if [ "$rc" -eq 3 ] && [ "$out" = "请联系 +86 138-0013-8000（⟦unresolved:PERSON_9⟧ 无）" ] &&
   grep -q "unresolved placeholder ⟦ PERSON 9 ⟧" "$WORK/err"; then pass "unresolved -> exit 3, named on stderr"
else fail "unresolved: rc $rc out '$out' err $(cat "$WORK/err")"; fi

# Errors: one clear line, non-zero exit.
printf '{"entries": [{"type": "PHONE"}]}' >"$WORK/bad_vault.json"
expect_one_line_error "malformed vault" "bad_vault.json: malformed vault" "$MYRIAD" redact --vault "$WORK/bad_vault.json" "$WORK/b.txt"
expect_one_line_error "malformed vault on restore" "bad_vault.json: malformed vault" "$MYRIAD" redact --restore --vault "$WORK/bad_vault.json" "$WORK/answer.txt"
expect_one_line_error "missing input" "nope.txt" "$MYRIAD" redact "$WORK/nope.txt"
expect_one_line_error "restore without vault" "needs --vault" "$MYRIAD" redact --restore "$WORK/answer.txt"
expect_one_line_error "restore with missing vault" "no such vault" "$MYRIAD" redact --restore --vault "$WORK/none.json" "$WORK/answer.txt"
printf 'not json\n' >"$WORK/bad.jsonl"
expect_one_line_error "bad jsonl" "bad.jsonl:1: expected a JSON object" "$MYRIAD" redact --input-jsonl "$WORK/bad.jsonl"
# A failed call leaves the vault as it was.
if python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$WORK/v.json"; then pass "vault intact JSON"; else fail "vault damaged"; fi
finish
