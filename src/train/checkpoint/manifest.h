// manifest.json of a checkpoint directory: reading, validating, and checking
// the files it lists. Shared by LoadCheckpoint and InspectCheckpoint; see
// checkpoint.h for the directory layout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/env.h"
#include "core/safetensors.h"
#include "core/status.h"

namespace myriad {

struct ManifestFile {
  std::string name;      // a plain file name inside the step directory
  uint64_t size = 0;
  std::string xxhash64;  // ChecksumHex of the file's bytes
};

struct Manifest {
  nlohmann::json json;  // the whole document
  int64_t step = 0;
  std::vector<ManifestFile> files;
  const ManifestFile* Find(const std::string& name) const;
};

// "a/b" with exactly one slash between the parts.
std::string JoinPath(const std::string& dir, const std::string& name);

// `path` without trailing slashes ("/" stays "/").
std::string StripTrailingSlashes(std::string path);

// The order in which manifest keys are written and shown (others follow).
inline constexpr const char* kManifestKeyOrder[] = {
    "format_version", "step",     "model_config", "train_config", "data_cursor",
    "rng",            "parallel", "tokenizer",    "files", "manifest_xxhash64"};

// The manifest's own checksum: ChecksumHex of the compact dump of the
// document without its "manifest_xxhash64" key, keys sorted (nlohmann::json
// order), so the value does not depend on the order or spacing written.
// Every byte that decides a resume (step, data cursor, configs, the file
// list) is covered; ReadManifest verifies it.
std::string ManifestChecksum(const nlohmann::json& manifest);

// The manifest document as written: meta plus format_version, step, files,
// with keys in kManifestKeyOrder for readers of the file.
nlohmann::ordered_json BuildManifest(const nlohmann::json& meta, int64_t step,
                             const std::vector<ManifestFile>& files);

// Reads and validates DIR/manifest.json: present, a JSON object, a supported
// format_version, its own checksum (manifest_xxhash64), an integer step equal
// to the step in DIR's name (when DIR is named step_N), and a file list of plain names with sizes
// and 16-hex-digit checksums. Errors name the manifest path and end in a hint.
Result<Manifest> ReadManifest(Env* env, const std::string& dir);

// Checks one listed file: it exists, has the listed size and, if
// verify_checksum, the listed xxHash64. On success `*mapped` (if non-null)
// holds the file mapped read-only. Errors name the file and suggest an
// earlier checkpoint.
Status VerifyManifestFile(Env* env, const std::string& dir, const ManifestFile& file,
                          bool verify_checksum, MappedFile* mapped);

// The hint for a damaged checkpoint at `dir`: "use an earlier checkpoint: X"
// when the parent directory holds a complete checkpoint with a lower step,
// otherwise advice to restore from a backup. Never fails.
std::string EarlierCheckpointHint(Env* env, const std::string& dir);

}  // namespace myriad
