// tpu::ChatTemplate: the loader of tokenizer_config.json, errors that name the construct and its
// position, the run limits, and Jinja2's whitespace rules on small cases whose expected output is
// written out by hand from Jinja2's documentation (the byte-for-byte comparison with Jinja2 itself
// on real templates is the CTest "chat: templates render as Jinja2 renders them").
#include <catch2/catch.hpp>

#include "tpucore/chat_template.h"
#include "tpucore/core/error.h"

namespace {

std::string render(const std::string& src, nlohmann::ordered_json extra = nlohmann::ordered_json::object()) {
  tpu::ChatRequest req;
  req.extra = std::move(extra);
  return tpu::ChatTemplate::from_source(src).render(req);
}

std::string error_of(const std::string& src) {
  try {
    render(src);
  } catch (const tpu::Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("chat template: trim_blocks, lstrip_blocks and whitespace control", "[chat]") {
  CHECK(render("  {% if true %}\n  x\n  {% endif %}\n") == "  x\n");  // tags on their own lines vanish
  CHECK(render("a {#- c -#} b\n{% for i in [1,2] +%}\n{{ i }}{% endfor %}") == "ab\n\n1\n2");
  CHECK(render("{{ 'x' }}\n{{ 'y' }}\n") == "x\ny");  // no trim after }}; one trailing newline dropped
  CHECK(render("  {%+ if true %}x{% endif %}") == "  x");  // + keeps the indentation
}

TEST_CASE("chat template: loop variables, namespace, macros, break and continue", "[chat]") {
  CHECK(render("{% for x in 'abc' %}{{ loop.index }}{{ x }}{{ loop.revindex0 }}{% if loop.last %}.{% endif %}{% endfor %}") ==
        "1a22b13c0.");
  CHECK(render("{% set ns = namespace(n=0) %}{% for i in range(5) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}") == "10");
  CHECK(render("{% set n = 1 %}{% for i in range(3) %}{% set n = i %}{% endfor %}{{ n }}") == "1");  // loop scope
  CHECK(render("{% macro m(a, b='B') %}<{{ a }}{{ b }}>{% endmacro %}{{ m(1) }}{{ m(2, b=3) }}") == "<1B><23>");
  CHECK(render("{% for i in range(9) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}") ==
        "02");
  CHECK(render("{% for i in [] %}x{% else %}empty{% endfor %}") == "empty");
}

TEST_CASE("chat template: Python values print as Python prints them", "[chat]") {
  CHECK(render("{{ [1, 'a', none, true, 2.5] }}") == "[1, 'a', None, True, 2.5]");
  CHECK(render("{{ 1e16 }} {{ 0.0001 }} {{ 1e-5 }} {{ 3 / 2 }} {{ -7 // 2 }} {{ -7 % 3 }}") == "1e+16 0.0001 1e-05 1.5 -4 2");
  CHECK(render("{{ {'b': 1, 'a': [1, 2]} | tojson }}") == "{\"b\": 1, \"a\": [1, 2]}");
  CHECK(render("{{ {'b': 1, 'a': 'é\"'} | tojson(indent=2, sort_keys=true) }}") == "{\n  \"a\": \"é\\\"\",\n  \"b\": 1\n}");
  CHECK(render("{{ x.split(',') | map('trim') | join('|') }}", {{"x", " a , b,c "}}) == "a|b|c");
}

TEST_CASE("chat template: unsupported syntax and bad input are errors naming the construct and position", "[chat]") {
  CHECK_THAT(error_of("ok\n  {% include 'other.jinja' %}"), Catch::Contains("2:6") && Catch::Contains("unsupported construct: '{% include %}'"));
  CHECK_THAT(error_of("{{ x | frobnicate }}"), Catch::Contains("1:6") && Catch::Contains("unsupported filter 'frobnicate'"));
  CHECK_THAT(error_of("{{ x is frobnicated }}"), Catch::Contains("unsupported test 'frobnicated'"));
  CHECK_THAT(error_of("{% raw %}x{% endraw %}"), Catch::Contains("unsupported construct: '{% raw %}'"));
  CHECK_THAT(error_of("{% if true %}x"), Catch::Contains("missing '{% endif %}'"));
  CHECK_THAT(error_of("{{ 'abc' "), Catch::Contains("never closed"));
  CHECK_THAT(error_of("{{ raise_exception('roles must alternate') }}"), Catch::Contains("roles must alternate"));
  CHECK_THAT(error_of("{{ missing.attr }}"), Catch::Contains("'missing' is undefined"));
  CHECK_THAT(error_of("{{ 'a' + 1 }}"), Catch::Contains("unsupported operand type(s) for +: 'str' and 'int'"));
  CHECK_THAT(error_of("{{ '%s' % 1 }}"), Catch::Contains("printf-style"));
  CHECK_THAT(error_of("{% set x = [] %}{{ x.append(1) }}"), Catch::Contains("sandbox"));
  CHECK_THAT(error_of("{{ range(200000) | length }}"), Catch::Contains("MAX_RANGE"));
}

TEST_CASE("chat template: runaway templates stop at the limits", "[chat]") {
  tpu::ChatTemplateLimits lim;
  lim.max_steps = 100000;
  lim.max_output = 1 << 16;
  tpu::ChatRequest req;
  const auto loops = tpu::ChatTemplate::from_source("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
  CHECK_THROWS_WITH(loops.render(req, lim), Catch::Contains("step limit"));
  const auto big = tpu::ChatTemplate::from_source("{{ 'x' * 100000000 }}");
  CHECK_THROWS_WITH(big.render(req, lim), Catch::Contains("longer than the limit"));
  const auto rec = tpu::ChatTemplate::from_source("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  CHECK_THROWS_WITH(rec.render(req, lim), Catch::Contains("nested deeper"));
}

TEST_CASE("chat template: tokenizer_config.json loader", "[chat]") {
  const std::string cfg = R"({"bos_token": {"__type": "AddedToken", "content": "<s>"}, "eos_token": "</s>",
    "chat_template": [{"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"},
                      {"name": "tool_use", "template": "{{ tools | length }} tools"}]})";
  const auto t = tpu::ChatTemplate::from_config_text(cfg);
  CHECK(t.bos_token() == "<s>");
  CHECK(t.eos_token() == "</s>");
  tpu::ChatRequest req;
  req.messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
  CHECK(t.render(req) == "<s>hi</s>");
  req.tools = nlohmann::ordered_json::parse(R"([{"type": "function"}, {"type": "function"}])");
  CHECK(tpu::ChatTemplate::from_config_text(cfg, "tool_use").render(req) == "2 tools");
  CHECK_THROWS_WITH(tpu::ChatTemplate::from_config_text(cfg, "rag"), Catch::Contains("no chat template named 'rag'"));
  CHECK_THROWS_WITH(tpu::ChatTemplate::from_config_text(R"({"eos_token": "</s>"})"), Catch::Contains("no chat template"));
  CHECK_THROWS_WITH(tpu::ChatTemplate::from_config_text(R"({"chat_template": 3})"), Catch::Contains("must be a string or a list"));
  CHECK_THROWS_WITH(tpu::ChatTemplate::from_config_text("{"), Catch::Contains("not valid JSON"));
}
