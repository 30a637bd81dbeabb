// Renders chat-template cases with @huggingface/jinja, Hugging Face's own
// JavaScript renderer (pinned in package-lock.json), the first oracle of the
// chat template parity test (src/data/chat_template_parity_test.cc).
// @huggingface/jinja applies trim_blocks and lstrip_blocks itself, as
// transformers' environment does.
//
// Usage (from the folder setup.sh prints): node render_chat.mjs IN.json OUT.json
// IN: {"clock": [Y, M, D, h, m, s], "cases": [{"id", "template_path",
//      "variables", "oracles"?}]}; OUT: {"renderer", "results": [{"id",
//      "output" | "error"}]}. Cases whose "oracles" list lacks "hf" are skipped.
import { readFileSync, writeFileSync } from "node:fs";
import { Template } from "@huggingface/jinja";

const [inPath, outPath] = process.argv.slice(2);
const spec = JSON.parse(readFileSync(inPath, "utf8"));

// strftime_now() formats `new Date()`: make "now" the cases' fixed clock.
const [year, month, day, hour, minute, second] = spec.clock;
const RealDate = Date;
const fixed = new RealDate(year, month - 1, day, hour, minute, second).getTime();
globalThis.Date = class extends RealDate {
  constructor(...args) {
    if (args.length === 0) super(fixed);
    else super(...args);
  }
  static now() {
    return fixed;
  }
};

const compiled = new Map();
const results = [];
for (const c of spec.cases) {
  if (!(c.oracles ?? ["hf"]).includes("hf")) continue;
  try {
    let t = compiled.get(c.template_path);
    if (t === undefined) {
      t = new Template(readFileSync(c.template_path, "utf8"));
      compiled.set(c.template_path, t);
    }
    results.push({ id: c.id, output: t.render(c.variables) });
  } catch (e) {
    results.push({ id: c.id, error: `${e?.name ?? "Error"}: ${e?.message ?? e}` });
  }
}
const version = JSON.parse(
  readFileSync(new URL("./node_modules/@huggingface/jinja/package.json", import.meta.url), "utf8"),
).version;
writeFileSync(outPath, JSON.stringify({ renderer: `@huggingface/jinja ${version}`, results }));
