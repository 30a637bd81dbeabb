// myriad inspect CKPT: manifest, files with checksum status, tensor table.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>

#include "cli/verbs.h"
#include "train/checkpoint/checkpoint.h"

namespace myriad::cli {

int RunInspect(int argc, char** argv) {
  CLI::App app{"Show a checkpoint: manifest, files (checksums verified) and tensors", "myriad inspect"};
  std::string path;
  app.add_option("checkpoint", path, "a run directory (follows latest) or a step directory")->required();
  CLI11_PARSE(app, argc, argv);
  Status s = InspectCheckpoint(path, std::cout);
  if (!s.ok()) {
    std::fprintf(stderr, "myriad inspect: %s\n", s.message().c_str());
    return 1;
  }
  return 0;
}

}  // namespace myriad::cli
