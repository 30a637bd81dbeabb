#!/usr/bin/env bash
# Bad input: each case gets one clear line naming the problem (and a hint
# where one helps), a non-zero exit and no crash.
source "$(dirname "$0")/lib.sh" "$@"
make_tiny_data
CFG="$SRC/configs/tiny.toml"
D=(--set data.dir="$WORK/data" -q)

# Configs.
printf '[model\nd_model = 1\n' > "$WORK/syntax.toml"
expect_error "malformed config" "syntax.toml:1:.*hint" "$MYRIAD" train --config "$WORK/syntax.toml"
expect_error "inconsistent config" "n_heads=5 does not divide d_model=32 \(hint" \
  "$MYRIAD" train --config "$CFG" "${D[@]}" --set model.n_heads=5
expect_error "unknown config key" "unknown key model.d_modle \(hint: did you mean model.d_model" \
  "$MYRIAD" train --config "$CFG" "${D[@]}" --set model.d_modle=32
expect_error "wrong type" "train.lr must be a number" "$MYRIAD" train --config "$CFG" "${D[@]}" --set 'train.lr="fast"'
expect_error "missing config" "nope.toml: cannot open config" "$MYRIAD" train --config "$WORK/nope.toml"
expect_error "unknown flag" "--bogus" "$MYRIAD" train --config "$CFG" --bogus
expect_error "unknown verb" "unknown verb 'trian' \(hint" "$MYRIAD" trian
expect_error "missing data" "(no such|not found|cannot|missing).*(hint|prepare)" \
  "$MYRIAD" train --config "$CFG" --set data.dir="$WORK/no-data" -q

# Checkpoints.
"$MYRIAD" train --config "$CFG" "${D[@]}" --set train.steps=4 --set train.ckpt_every=2 \
  --set train.out_dir="$WORK/run" 2>/dev/null
expect_error "missing checkpoint" "no checkpoint|not found|does not exist" "$MYRIAD" eval --ckpt "$WORK/missing"
cp -r "$WORK/run" "$WORK/trunc"
f="$WORK/trunc/step_00000004/model.safetensors"
head -c 1000 "$f" > "$f.x" && mv "$f.x" "$f"
expect_error "truncated checkpoint" "model.safetensors.*(truncated|size)" "$MYRIAD" eval --ckpt "$WORK/trunc"
cp -r "$WORK/run" "$WORK/corrupt"
f="$WORK/corrupt/step_00000004/model.safetensors"
printf '\xff\xfe' | dd of="$f" bs=1 seek=4000 conv=notrunc 2>/dev/null
expect_error "corrupt checkpoint" "model.safetensors.*checksum mismatch" "$MYRIAD" eval --ckpt "$WORK/corrupt"
# Resuming from a corrupt latest falls back to the earlier checkpoint (and
# says so), and never touches it.
cp -r "$WORK/corrupt" "$WORK/corrupt-all"
if "$MYRIAD" train --config "$CFG" "${D[@]}" --set train.steps=6 --set train.out_dir="$WORK/corrupt" \
     >/dev/null 2>"$WORK/corrupt.log" \
   && grep -q "skipped a damaged checkpoint: .*step_00000004.*checksum mismatch" "$WORK/corrupt.log" \
   && grep -q "resumed from .*step_00000002 at step 2" "$WORK/corrupt.log"; then
  pass "resume from a corrupt latest -> fell back to step 2: $(grep -o 'skipped a damaged checkpoint.*' "$WORK/corrupt.log" | cut -c1-120)"
else
  fail "resume from a corrupt latest: $(tail -3 "$WORK/corrupt.log")"
fi
# With every checkpoint damaged there is nothing to resume: a clear error.
f2="$WORK/corrupt-all/step_00000002/model.safetensors"
printf '\xff\xfe' | dd of="$f2" bs=1 seek=4000 conv=notrunc 2>/dev/null
expect_error "resume with every checkpoint corrupt" "no checkpoint loads.*step_00000004.*step_00000002" \
  "$MYRIAD" train --config "$CFG" "${D[@]}" --set train.steps=6 --set train.out_dir="$WORK/corrupt-all" \
  --set train.snapshot_dir=none
[ -f "$WORK/corrupt/step_00000002/model.safetensors" ] && cmp -s "$WORK/corrupt/step_00000002/model.safetensors" \
  "$WORK/run/step_00000002/model.safetensors" && pass "earlier checkpoint intact" || fail "earlier checkpoint damaged"

# Shards.
cp -r "$WORK/data" "$WORK/data-trunc"
f=$(ls "$WORK"/data-trunc/train_*.bin | head -1)
head -c 200 "$f" > "$f.x" && mv "$f.x" "$f"
expect_error "truncated shard" "train_000.bin.*(truncated|size)" "$MYRIAD" train --config "$CFG" \
  --set data.dir="$WORK/data-trunc" --set train.out_dir="$WORK/r2" -q
cp -r "$WORK/data" "$WORK/data-corrupt"
f=$(ls "$WORK"/data-corrupt/train_*.bin | head -1)
printf '\x01\x02\x03' | dd of="$f" bs=1 seek=100 conv=notrunc 2>/dev/null
expect_error "corrupt shard" "train_000.bin.*(checksum|corrupt)" "$MYRIAD" train --config "$CFG" \
  --set data.dir="$WORK/data-corrupt" --set train.out_dir="$WORK/r3" -q
finish
