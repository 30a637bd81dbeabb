// For tests only: the temp directories and file damage the tier and
// prefix-cache tests share. Header-only so that no library carries test code.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "model/config.h"

namespace myriad::serve::testing {

// An empty directory path under the system temp dir, unique to this
// process and `name` (removed first if a previous run left it).
inline std::string FreshTempDir(const std::string& name) {
  std::filesystem::path p =
      std::filesystem::temp_directory_path() / ("myriad_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  return p.string();
}

// The attention shape that sizes a KV block (BlockFloats): the rest of the
// config keeps its defaults.
inline ModelConfig KvShape(int64_t n_layers, int64_t d_model, int64_t n_heads, int64_t n_kv_heads) {
  ModelConfig c;
  c.n_layers = n_layers;
  c.d_model = d_model;
  c.n_heads = n_heads;
  c.n_kv_heads = n_kv_heads;
  return c;
}

// Flips one bit of the byte at `pos` of a file (a corrupt block on disk).
inline void FlipByte(const std::string& path, int64_t pos) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(pos);
  char c;
  f.get(c);
  f.seekp(pos);
  f.put(static_cast<char>(c ^ 0x40));
}

}  // namespace myriad::serve::testing
