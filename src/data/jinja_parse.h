// Parser of the Jinja subset of data/jinja.h (the lexer, with the
// whitespace rules of transformers' environment, is data/jinja_lex.h).
//
// Contract: throws PositionedError for a syntax error, for a construct that
// is not supported (the message names it), and for a filter or test name
// that does not exist or is not supported (Python Jinja checks those when it
// compiles the template, so this does too).
#pragma once

#include <string_view>
#include <vector>

#include "data/jinja_ast.h"

namespace myriad::jinja {

std::vector<NodePtr> ParseTemplate(std::string_view source);

}  // namespace myriad::jinja
