// Checkpoints: one directory per step under a run's checkpoint root.
//
//   ROOT/
//     latest                 text: the name of the newest complete checkpoint
//     step_00000123/
//       manifest.json        format_version, step, model_config, train_config,
//                            data_cursor, rng, parallel, tokenizer (optional),
//                            files: [{name, size, xxhash64}],
//                            manifest_xxhash64 (ManifestChecksum: every
//                            other byte of the manifest is covered)
//       model.safetensors    parameters and buffers under their model names
//       optimizer.safetensors  "<param>.exp_avg", "<param>.exp_avg_sq", "step"
//
// Save protocol: everything is written into ROOT/step_00000123.tmp/ (each
// file fsynced, then the directory), which is renamed to its final name; ROOT
// is fsynced; then `latest` is replaced atomically; only then are checkpoints
// beyond keep_last deleted. A crash or error at any point leaves the previous
// checkpoint and `latest` as they were. Leftover *.tmp directories are never
// listed or loaded and are removed by the next save.
//
// Concurrency: one writer per ROOT at a time (a save removes other saves'
// *.tmp directories). Loads may run concurrently with each other and with a
// save (a save never modifies a complete checkpoint, except that pruning
// deletes old ones and re-saving an existing step replaces it).
//
// Layouts: this writes a single-rank (unsharded) checkpoint; `parallel` in
// the manifest records the layout, e.g. {"dp":1,"tp":1,"pp":1,"ep":1,"cp":1}.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/env.h"
#include "core/safetensors.h"
#include "core/status.h"

namespace myriad {

// 2: manifest.json carries manifest_xxhash64, the checksum of the rest of
// the manifest (version 1 had none: its step and data cursor were unchecked).
inline constexpr int kCheckpointFormatVersion = 2;
inline constexpr const char* kCheckpointManifest = "manifest.json";
inline constexpr const char* kCheckpointModelFile = "model.safetensors";
inline constexpr const char* kCheckpointOptimizerFile = "optimizer.safetensors";
inline constexpr const char* kCheckpointLatest = "latest";

// "step_00000123" (at least 8 digits; wider steps keep all their digits).
std::string CheckpointDirName(int64_t step);
// The step of a complete-checkpoint directory name ("step_" + digits only), or
// -1 for anything else ("step_00000123.tmp", "latest", ...).
int64_t ParseCheckpointDirName(std::string_view name);

// What a checkpoint holds. Views are borrowed: the caller keeps the tensor
// memory alive and unchanged during SaveCheckpoint.
struct CheckpointData {
  // Manifest content except "format_version", "step" and "files", which
  // SaveCheckpoint sets (overwriting any given). Must be a JSON object (or
  // null for none). Expected keys: model_config, train_config, data_cursor,
  // rng, parallel, and optionally tokenizer (a path).
  nlohmann::json meta;
  std::vector<TensorView> model;      // written to model.safetensors (always)
  std::vector<TensorView> optimizer;  // optimizer.safetensors; omitted if empty
};

// Saves `data` as ROOT/step_<step>/ following the protocol above and returns
// that directory's path. keep_last > 0 keeps that many complete checkpoints
// (the highest steps, always including this one) and deletes the rest after
// `latest` is updated; 0 keeps all. Saving a step that already exists replaces
// it: the old directory is renamed to step_*.deleting just before the new one
// is renamed into place (a crash between those two renames leaves `latest`
// naming a missing directory; the old data survives in the .deleting dir
// until the next save). Errors name the failing path and say what state ROOT
// is in; a failed save removes its .tmp directory (best effort). If only the
// update of `latest` fails, the new step directory is complete and kept.
// Failing to prune is logged, not an error.
Result<std::string> SaveCheckpoint(Env* env, const std::string& root, int64_t step,
                                   const CheckpointData& data, int keep_last = 3);

// A loaded checkpoint. Tensor views point into read-only mappings owned by
// `model` / `optimizer`; they live as long as this object (it is movable).
struct LoadedCheckpoint {
  std::string dir;          // the step directory that was loaded
  int64_t step = 0;
  nlohmann::json manifest;  // the whole manifest.json
  SafetensorsFile model;
  std::optional<SafetensorsFile> optimizer;  // absent if none was saved
};

// A loaded checkpoint as data SaveCheckpoint writes again, tensors and
// metadata unchanged (views into `ck`, which must outlive the result): how
// a step that only the shared-memory copy holds is written to disk.
CheckpointData CheckpointDataOf(const LoadedCheckpoint& ck);

// Loads `path`, which is either a step directory or a ROOT (then `latest` is
// followed; without a `latest` file the highest complete step is used).
// Checks the manifest, that every listed file exists with the listed size and,
// if verify_checksums, its xxHash64; then parses the safetensors files. Errors
// name the file and end in a hint (usually: the earlier checkpoint to use).
// Safetensors files are mmapped directly (Env has no mmap); Env is used for
// the manifest, `latest`, existence checks and listing.
Result<LoadedCheckpoint> LoadCheckpoint(Env* env, const std::string& path,
                                        bool verify_checksums = true);

// Loads the newest checkpoint under `root` that verifies (checksums
// included): `latest` first, then every complete checkpoint by descending
// step (the one `latest` named is not tried twice). Each one skipped is
// appended to *skipped as "<dir>: <reason>" (skipped may be null) and logged
// with LOG_WARN; a `latest` that names a missing directory is skipped the same
// way, and one that holds no checkpoint name as "<root>/latest: <reason>".
// The reason is LoadCheckpoint's error without its "(hint: ...)" tail. Fails,
// naming every skipped one, only when none loads (or with LoadCheckpoint's
// "no checkpoint found" when there is none at all). Never modifies or deletes
// anything: a damaged checkpoint stays on disk for inspection.
// If `root` is itself a step directory (it has a manifest.json or is named
// step_NNNNNNNN), that one is loaded with no fallback: the caller chose it.
Result<LoadedCheckpoint> LoadNewestValidCheckpoint(Env* env, const std::string& root,
                                                   std::vector<std::string>* skipped);

// The step directory that LoadCheckpoint(path) would load (without reading it).
Result<std::string> ResolveCheckpointDir(Env* env, const std::string& path);

// Paths of the complete checkpoints under `root` (step_* directories with a
// manifest.json; *.tmp ignored), by ascending step. Empty if `root` does not
// exist. Does not verify contents.
Result<std::vector<std::string>> ListCheckpoints(Env* env, const std::string& root);

// For `myriad inspect`: prints the manifest summary, each file with its
// verification result (ok / missing / size or checksum mismatch) and a table
// of tensors (name, dtype, shape; mean, std, absmax and non-finite count for
// F32 and BF16) with the parameter total. Prints as much as it can read and
// returns an error if anything failed to verify or parse.
Status InspectCheckpoint(const std::string& path, std::ostream& out,
                         Env* env = Env::Default());

}  // namespace myriad
