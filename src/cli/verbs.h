// Entry points of the verbs; argv[0] is the verb itself.
#pragma once
namespace myriad::cli {
int RunPrepare(int argc, char** argv);
int RunTrain(int argc, char** argv);
int RunLaunch(int argc, char** argv);
int RunPreflight(int argc, char** argv);
int RunEval(int argc, char** argv);
int RunGenerate(int argc, char** argv);
int RunDoctor(int argc, char** argv);
int RunInspect(int argc, char** argv);
int RunExport(int argc, char** argv);
int RunServe(int argc, char** argv);
int RunPlan(int argc, char** argv);
int RunSimulate(int argc, char** argv);
int RunImport(int argc, char** argv);
int RunRl(int argc, char** argv);
int RunDistill(int argc, char** argv);
int RunTasks(int argc, char** argv);
int RunRedact(int argc, char** argv);
int RunRoute(int argc, char** argv);
// `redact corpus|train|eval|tag`: argv[0] is the subcommand (src/cli/redact_tagger.cc).
int RunRedactTools(int argc, char** argv);
}  // namespace myriad::cli
