// Lexer and parser of the Jinja subset of data/jinja.h.
//
// The lexer follows Python Jinja's rules in the environment transformers
// renders chat templates with: trim_blocks (the first newline after a block
// or comment tag is dropped), lstrip_blocks (spaces and tabs from the start
// of a line up to a block or comment tag are dropped), "-" and "+" tag
// modifiers, newlines normalised to "\n" and one trailing newline dropped.
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
