// The lexer of the Jinja subset of data/jinja.h: Python Jinja's rules in
// the environment transformers renders chat templates with (trim_blocks,
// lstrip_blocks, "-" and "+" tag modifiers, newlines read as "\n", one
// trailing newline dropped). Comments leave no token.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "data/jinja_ast.h"

namespace myriad::jinja {

enum class Tok { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };

// One token; the text between tags is kText, what a tag holds the rest.
struct Token {
  Tok type;
  std::string text;  // the text, name, string value or operator
  SourcePos pos;
  Value number;
};

// The tokens of `source`, ending with kEof. Throws PositionedError for a
// tag or string that is not closed, an unexpected character, or a {% raw %}.
std::vector<Token> Tokenize(std::string_view source);

}  // namespace myriad::jinja
