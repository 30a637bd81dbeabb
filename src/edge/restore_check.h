// The restore figure of the desensitisation evaluation: for every document,
// the answers a cloud model writes back -- the redacted text echoed, every
// placeholder reformatted (lower case, inner spaces, [[ ]], 【】, full-width
// digits), and the placeholders repeated in reverse order -- restored, whole
// and streamed in small chunks, against the expected text built from the
// same pieces with the vault's originals. A failure is any difference or
// any unresolved placeholder.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "edge/redact.h"

namespace myriad::edge {

struct RestoreCheck {
  int64_t documents = 0;
  int64_t answers = 0;       // answers restored (each whole and streamed)
  int64_t placeholders = 0;  // placeholders in those answers
  int64_t failures = 0;      // answers whose restoration was not exact
  std::vector<std::string> examples;  // the first few failures, described
};

RestoreCheck CheckRestores(const Redactor& redactor, const std::vector<std::string>& documents);

}  // namespace myriad::edge
