// Command-line parsing shared by the C++ halves of the benchmarks:
// --config FILE or --hf HF_DIR (a Hugging Face model folder, for the
// benchmarks that take one), --set k=v (repeatable) and named numeric/string
// options.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

struct BenchArgs {
  std::string config;
  std::string hf;  // a Hugging Face folder instead of --config (where supported)
  std::vector<std::string> sets;
  std::map<std::string, std::string> opts;  // "--name" -> value, pre-filled with defaults

  // Returns false (after printing why) on an unknown flag or a missing value.
  bool Parse(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (i + 1 >= argc) { std::fprintf(stderr, "%s needs a value\n", a.c_str()); return false; }
      std::string v = argv[++i];
      if (a == "--config") config = v;
      else if (a == "--hf") hf = v;
      else if (a == "--set") sets.push_back(v);
      else if (opts.count(a)) opts[a] = v;
      else { std::fprintf(stderr, "unknown flag %s\n", a.c_str()); return false; }
    }
    if (config.empty() == hf.empty()) { std::fprintf(stderr, "give one of --config FILE and --hf HF_DIR\n"); return false; }
    return true;
  }
  int Int(const std::string& name) const { return std::atoi(opts.at(name).c_str()); }
  const std::string& Str(const std::string& name) const { return opts.at(name); }
};
