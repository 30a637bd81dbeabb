#!/usr/bin/env python3
"""Renders chat-template cases with Python Jinja2 in the environment that
transformers' apply_chat_template uses, the second oracle of the chat
template parity test (src/data/chat_template_parity_test.cc).

That environment, as transformers documents and sets it up: an
ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the
loopcontrols extension and a {% generation %} tag that renders its body,
|tojson replaced by json.dumps(x, ensure_ascii=False, indent, separators,
sort_keys), and the globals raise_exception(message) and strftime_now(format).

Usage: render_chat_jinja2.py IN.json OUT.json
IN: {"clock": [Y, M, D, h, m, s], "cases": [{"id", "template_path",
     "variables", "oracles"?}]}; OUT: {"renderer", "results": [{"id",
     "output" | "error"}]}. Cases whose "oracles" list lacks "python" are
skipped.
"""
import datetime
import json
import sys

try:
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    sys.exit("FAIL: Python's jinja2 is not installed (hint: apt-get install python3-jinja2)")


class GenerationTag(Extension):
    """{% generation %}...{% endgeneration %}: renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    now = datetime.datetime(*spec["clock"])
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: now.strftime(fmt)
    compiled = {}
    results = []
    for case in spec["cases"]:
        if "python" not in case.get("oracles", ["python"]):
            continue
        try:
            path = case["template_path"]
            if path not in compiled:
                with open(path, encoding="utf-8", newline="") as f:
                    compiled[path] = env.from_string(f.read())
            results.append({"id": case["id"], "output": compiled[path].render(**case["variables"])})
        except Exception as e:  # an error is a result the test compares too
            results.append({"id": case["id"], "error": f"{type(e).__name__}: {e}"})
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump({"renderer": f"jinja2 {jinja2.__version__}", "results": results}, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
