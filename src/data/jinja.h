// A Jinja renderer for chat templates: the subset of Jinja that open
// models' chat templates use, with the semantics of Python Jinja in the
// environment transformers renders them with (trim_blocks, lstrip_blocks,
// loop controls, an immutable sandbox, |tojson as json.dumps without ASCII
// escaping, raise_exception and strftime_now). docs/chat-templates.md lists
// what is supported and what is refused.
//
// What is not supported fails, when the template is parsed or when the
// construct is reached, with one line that names it: a template never
// renders differently from Python Jinja without saying so.
//
// Thread safety: a parsed Template is immutable; Render may be called from
// any number of threads at once.
#pragma once

#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "data/jinja_value.h"

namespace myriad::jinja {

struct Node;

struct RenderOptions {
  // The local time strftime_now(format) formats; empty = the clock's.
  std::function<std::tm()> now;
};

class Template {
 public:
  // Parses `source`. Errors read "<name>:<line>:<column>: <message>".
  static Result<Template> Parse(std::string_view source, const std::string& name);

  // Renders with `variables` as the template's variables. Errors (a
  // raise_exception, an undefined value used, a type error) read as Parse's.
  Result<std::string> Render(const Dict& variables, const RenderOptions& options = {}) const;
  // The same with a JSON object; nlohmann::ordered_json keeps the key order
  // that |tojson writes, nlohmann::json has sorted the keys.
  Result<std::string> Render(const nlohmann::ordered_json& variables, const RenderOptions& options = {}) const;
  Result<std::string> Render(const nlohmann::json& variables, const RenderOptions& options = {}) const;

  const std::string& name() const { return name_; }

 private:
  Template(std::string name, std::shared_ptr<const std::vector<std::unique_ptr<Node>>> body)
      : name_(std::move(name)), body_(std::move(body)) {}
  std::string name_;
  std::shared_ptr<const std::vector<std::unique_ptr<Node>>> body_;
};

}  // namespace myriad::jinja
