// Verbs not yet wired up report so plainly (temporary during bring-up).
#include <cstdio>
#include "cli/verbs.h"
namespace myriad::cli {
static int NotYet(const char* v) { std::fprintf(stderr, "myriad %s: not available in this build\n", v); return 2; }
int RunPrepare(int, char**) { return NotYet("prepare"); }
int RunTrain(int, char**) { return NotYet("train"); }
int RunEval(int, char**) { return NotYet("eval"); }
int RunGenerate(int, char**) { return NotYet("generate"); }
int RunDoctor(int, char**) { return NotYet("doctor"); }
int RunInspect(int, char**) { return NotYet("inspect"); }
}  // namespace myriad::cli
