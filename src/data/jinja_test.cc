// The Jinja renderer against answers written by hand (closed forms), so
// that a bug the reference renderers might share cannot pass, and its error
// messages, exactly. chat_template_parity_test.cc compares it with the
// reference renderers.
#include "data/jinja.h"

#include <gtest/gtest.h>

namespace myriad::jinja {
namespace {

using ojson = nlohmann::ordered_json;

std::string Render(const std::string& source, const ojson& vars = ojson::object()) {
  auto t = Template::Parse(source, "t");
  if (!t.ok()) return "PARSE ERROR " + t.status().message();
  auto r = t->Render(vars);
  return r.ok() ? r.value() : "RENDER ERROR " + r.status().message();
}

// The message of the error `source` must fail with, at parse or render.
std::string Error(const std::string& source, const ojson& vars = ojson::object()) {
  auto t = Template::Parse(source, "t");
  if (!t.ok()) return t.status().message();
  auto r = t->Render(vars);
  return r.ok() ? "rendered: " + r.value() : r.status().message();
}

TEST(JinjaTest, TrimBlocksLstripBlocksAndDashes) {
  // Tag lines vanish (lstrip_blocks + trim_blocks); {{ }} keeps its
  // newline; dashes strip all whitespace on their side.
  EXPECT_EQ(Render("a\n  {% if true %}\n  b\n  {% endif %}\nc {{- ' d' }}  {{ 'e' -}}  \n f"), "a\n  b\nc d  ef");
  EXPECT_EQ(Render("{# comment #}\nx\n  {#- strip -#}  \n y"), "xy");
  EXPECT_EQ(Render("{{ 'v' }}\n{% if true %}t{% endif %}\n"), "v\nt");  // one trailing newline dropped
  EXPECT_EQ(Render("  {%+ if true %}kept{% endif +%}\nnext"), "  kept\nnext");
  // Newlines are read as \n first (Python Jinja), so trim_blocks eats a \r\n.
  EXPECT_EQ(Render("a\r\nb{% if true %}y{% endif %}\r\nz"), "a\nbyz");
}

TEST(JinjaTest, ForLoops) {
  const ojson vars = {{"xs", {1, 2, 3}}, {"nothing", ojson::array()}, {"d", {{"k", "v"}, {"a", 1}}}};
  EXPECT_EQ(Render("{% for x in xs if x > 1 %}{{ loop.index }}{{ x }}{{ ',' if not loop.last }}{% endfor %}", vars),
            "12,23");
  EXPECT_EQ(Render("{% for x in nothing %}x{% else %}empty{% endfor %}", vars), "empty");
  EXPECT_EQ(Render("{% for x in xs %}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.length }}{% if loop.first %}F"
                   "{% endif %};{% endfor %}",
                   vars),
            "323F;213;103;");
  EXPECT_EQ(Render("{% for k, v in d.items() %}{{ k }}={{ v }} {% endfor %}{% for k in d %}{{ k }}{% endfor %}", vars),
            "k=v a=1 ka");
  EXPECT_EQ(Render("{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}{% endif %}"
                   "{{ x }}{% endfor %}",
                   vars),
            "1");
  // A {% set %} in a loop body lives for one iteration (Python Jinja).
  EXPECT_EQ(Render("{% set x = 'out' %}{% for i in [1, 2] %}{% if i == 1 %}{% set x = 'in' %}{% endif %}{{ x }}"
                   "{% endfor %}{{ x }}"),
            "inoutout");
}

TEST(JinjaTest, NamespaceReverseScan) {
  // Qwen3's search for the last user message, backwards.
  const ojson vars = {{"ms", {"u", "a", "u", "a"}}};
  EXPECT_EQ(Render("{% set ns = namespace(i=-1) %}{% for m in ms[::-1] %}{% if ns.i < 0 and m == 'u' %}"
                   "{% set ns.i = (ms | length - 1) - loop.index0 %}{% endif %}{% endfor %}{{ ns.i }}",
                   vars),
            "2");
}

TEST(JinjaTest, PythonValueSemantics) {
  EXPECT_EQ(Render("{{ none }}|{{ true }}|{{ 7 // -2 }}|{{ -7 % 3 }}|{{ 2.0 }}|{{ 1e16 }}|{{ 0.1 + 0.2 }}|{{ 1e-5 }}"),
            "None|True|-4|2|2.0|1e+16|0.30000000000000004|1e-05");
  EXPECT_EQ(Render("{{ 7 / 2 }} {{ 2 ** 10 }} {{ -2 ** 2 }} {{ 1 + 2 * 3 }} {{ 'a' + 'b' ~ 1 }}"), "3.5 1024 4 7 ab1");
  EXPECT_EQ(Render("{{ 1 == 1.0 }} {{ [1, [2]] == [1, [2]] }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }}"), "True True True False");
  EXPECT_EQ(Render("{{ [] or 'x' }} {{ 'a' and 'b' }} {{ 'y' if false }}|"), "x b |");
  EXPECT_EQ(Render("[{{ missing }}][{{ missing | length }}][{{ d.nokey }}][{{ missing is defined }}]",
                   {{"d", ojson::object()}}),
            "[][0][][False]");
}

TEST(JinjaTest, StringsCountCodePoints) {
  EXPECT_EQ(Render("{{ '  héllo  '.strip() }}|{{ 'a,b,,c'.split(',') | length }}|{{ 'xxhixx'.strip('x') }}|"
                   "{{ 'héllo'[::-1] }}|{{ 'h😀llo' | length }}|{{ 'h😀llo'[1] }}|{{ 'abcdef'[4:1:-2] }}"),
            "héllo|4|hi|olléh|5|😀|ec");
  EXPECT_EQ(Render("{{ 'abc'.startswith(('x', 'a')) }} {{ 'k=v=w'.split('=', 1)[1] }} {{ 'aaa'.replace('a', 'b', 2) }}"),
            "True v=w bba");
  EXPECT_EQ(Render("{{ 'hello wORLD'.title() }}|{{ 'hELLO' | capitalize }}|{{ 'éa' | upper }}|{{ ' a\tb\n' | trim }}"),
            "Hello World|Hello|ÉA|a\tb");
  EXPECT_EQ(Render("{{ 'a\\tb\\n\\'\\x41\\u00e9\\q' }}"), "a\tb\n'Aé\\q");
}

TEST(JinjaTest, Filters) {
  EXPECT_EQ(Render("{{ {'b': [1, 'é\\n'], 'a': {}} | tojson }}"), "{\"b\": [1, \"é\\n\"], \"a\": {}}");
  EXPECT_EQ(Render("{{ [1, {'k': []}] | tojson(indent=2) }}"), "[\n  1,\n  {\n    \"k\": []\n  }\n]");
  EXPECT_EQ(Render("{{ 'é' | tojson(ensure_ascii=true) }} {{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}"),
            "\"\\u00e9\" {\"a\": 2, \"b\": 1}");
  EXPECT_EQ(Render("{{ 'x\ny\n\nz' | indent(2) }}|{{ 'x' | indent(2, true) }}"), "x\n  y\n\n  z|  x");
  const ojson users = {{"users", {{{"n", "b"}, {"ok", true}}, {{"n", "A"}}, {{"n", "c"}, {"ok", false}}}}};
  EXPECT_EQ(Render("{{ users | map(attribute='n') | join(',') }} {{ users | selectattr('ok') | map(attribute='n') | "
                   "join }} {{ users | sort(attribute='n') | map(attribute='n') | join }}",
                   users),
            "b,A,c b Abc");
  EXPECT_EQ(Render("{{ [3, 1, 2] | sort | join }} {{ [1, 2, 2] | unique | join }} {{ [1, 0, 2] | select | join }} "
                   "{{ '42' | int + 1 }} {{ '4.7' | int }} {{ 'x' | int(7) }} {{ missing | default('d') }} "
                   "{{ '' | default('e', true) }} {{ [1, 2] | first }}{{ [1, 2] | last }}"),
            "123 12 12 43 4 7 d e 12");
}

TEST(JinjaTest, Macros) {
  EXPECT_EQ(Render("{% macro m(a, b='B') %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }}{{ m(1, b=2) }}{{ m(b=3, a=4) }}"),
            "1B1243");
  EXPECT_EQ(Render("{% set p = 'P' %}{% macro m() %}{{ p }}{% endmacro %}{{ m() | lower }}"), "p");
}

TEST(JinjaTest, BlockSetFilterBlockAndGeneration) {
  EXPECT_EQ(Render("{% set x | trim %}  padded  {% endset %}[{{ x }}]{% filter upper %}abc{% endfilter %}"),
            "[padded]ABC");
  EXPECT_EQ(Render("{% generation %}kept{% endgeneration %}"), "kept");
}

TEST(JinjaTest, StrftimeNowUsesTheInjectedClock) {
  auto t = Template::Parse("{{ strftime_now('%d %b %Y %H:%M') }}", "t");
  ASSERT_TRUE(t.ok());
  RenderOptions options;
  options.now = [] {
    std::tm tm{};
    tm.tm_year = 2024 - 1900;
    tm.tm_mon = 6;
    tm.tm_mday = 26;
    tm.tm_hour = 9;
    tm.tm_min = 5;
    return tm;
  };
  auto r = t->Render(ojson::object(), options);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r.value(), "26 Jul 2024 09:05");
}

TEST(JinjaTest, SyntaxErrorsNameThePlace) {
  EXPECT_EQ(Error("{% if x %}x"), "t:1:1: {% if %} is not closed (expected {% elif %} or {% else %} or {% endif %})");
  EXPECT_EQ(Error("{{ 1 + }}"), "t:1:8: expected an expression, got '}}'");
  EXPECT_EQ(Error("ok\n{{ x"), "t:2:1: {{ is not closed (expected }})");
  EXPECT_EQ(Error("{% endfor %}"), "t:1:1: unexpected {% endfor %}");
  EXPECT_EQ(Error("{% frob %}"), "t:1:1: unknown tag 'frob'");
  EXPECT_EQ(Error("{% break %}"), "t:1:1: {% break %} outside a for loop");
  EXPECT_EQ(Error("{{ 'a' $ 1 }}"), "t:1:8: unexpected character '$'");
  EXPECT_EQ(Error("{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}"),
            "t:1:203: expressions or blocks nested deeper than 200");
}

TEST(JinjaTest, UnsupportedConstructsAreRefusedByName) {
  EXPECT_EQ(Error("{{ x | frobnicate }}"), "t:1:8: no filter named 'frobnicate'");
  EXPECT_EQ(Error("{{ x | wordwrap }}"), "t:1:8: filter 'wordwrap' is not supported");
  EXPECT_EQ(Error("{% if x is frob %}{% endif %}"), "t:1:12: no test named 'frob'");
  EXPECT_EQ(Error("{% include 'other.jinja' %}"), "t:1:1: {% include %} is not supported");
  EXPECT_EQ(Error("{% raw %}{{ x }}{% endraw %}"), "t:1:1: {% raw %} blocks are not supported");
  EXPECT_EQ(Error("{% call m() %}x{% endcall %}"), "t:1:1: {% call %} is not supported");
  EXPECT_EQ(Error("{{ f(*xs) }}"), "t:1:6: argument unpacking (* and **) is not supported");
  EXPECT_EQ(Error("{{ '%s' % 1 }}"), "t:1:9: string formatting with % is not supported");
  EXPECT_EQ(Error("{{ [1] }}"),
            "t:1:4: cannot write a list as text (Python Jinja writes its repr, @huggingface/jinja JSON; use |tojson)");
  EXPECT_EQ(Error("{% set xs = [] %}{{ xs.append(1) }}"),
            "t:1:21: list.append() is refused: transformers renders chat templates in Jinja's immutable sandbox");
  EXPECT_EQ(Error("{{ 'a'.zfill(3) }}"), "t:1:4: str.zfill() is not supported");
}

TEST(JinjaTest, RenderErrorsNameThePlace) {
  EXPECT_EQ(Error("\n  {{ raise_exception('bad ' ~ 'role') }}"), "t:2:6: raise_exception: bad role");
  EXPECT_EQ(Error("{{ raise_exception('two\\nlines') }}"), "t:1:4: raise_exception: two\\nlines");
  EXPECT_EQ(Error("{{ u.x }}"), "t:1:4: 'u' is undefined");
  EXPECT_EQ(Error("{{ u + 1 }}"), "t:1:6: 'u' is undefined");
  EXPECT_EQ(Error("{{ 'a' + 1 }}"), "t:1:8: can only concatenate str (not \"int\") to str (hint: use ~ or |string)");
  EXPECT_EQ(Error("{{ 1 // 0 }}"), "t:1:6: division by zero");
  EXPECT_EQ(Error("{% set d = {} %}{% set d.x = 1 %}"),
            "t:1:17: cannot set attribute 'x' of a dict: only a namespace() has assignable attributes");
  EXPECT_EQ(Error("{% for x in 3 %}{% endfor %}"), "t:1:13: 'int' object is not iterable");
  EXPECT_EQ(Error("{{ 9223372036854775807 + 1 }}"),
            "t:1:24: integer overflow (Python's integers are unbounded, these are 64-bit)");
}

}  // namespace
}  // namespace myriad::jinja
