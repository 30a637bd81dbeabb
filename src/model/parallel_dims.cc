#include "model/parallel_dims.h"

#include <utility>
#include <vector>

namespace myriad {
namespace {

// "1, 2, 4": the values of a degree that divide n (at most `limit` of them,
// smallest first), for hints.
std::string DivisorsOf(int64_t n, int64_t limit = 8) {
  std::string s;
  int64_t shown = 0;
  for (int64_t d = 1; d <= n && shown < limit; ++d)
    if (n % d == 0) {
      if (!s.empty()) s += ", ";
      s += std::to_string(d);
      ++shown;
    }
  return s;
}

}  // namespace

std::string ParallelDims::ToString() const {
  if (trivial()) return "single rank";
  std::string s;
  auto add = [&](const char* n, int v) {
    if (v == 1) return;
    if (!s.empty()) s += " x ";
    s += n + std::to_string(v);
  };
  add("dp", dp); add("ep", ep); add("tp", tp); add("pp", pp); add("cp", cp);
  return s;
}

nlohmann::json ParallelDims::ToJson() const {
  return {{"dp", dp}, {"tp", tp}, {"pp", pp}, {"ep", ep}, {"cp", cp}};
}

Result<ParallelDims> ParallelDims::FromJson(const nlohmann::json& j) {
  ParallelDims d;
  try {
    d.dp = j.value("dp", 1); d.tp = j.value("tp", 1); d.pp = j.value("pp", 1);
    d.ep = j.value("ep", 1); d.cp = j.value("cp", 1);
  } catch (const std::exception& e) {
    return Status::Error(std::string("parallel layout: ") + e.what());
  }
  return d;
}

Status ParallelDims::Validate(int world_size, const ModelConfig& m, const LayoutBatch& b) const {
  auto err = [](const std::string& s) { return Status::Error(s); };
  const std::string& P = b.dims_prefix;
  auto key = [&](const char* dim) { return P + dim; };
  for (auto [name, v] : {std::pair{"dp", dp}, {"tp", tp}, {"pp", pp}, {"ep", ep}, {"cp", cp}})
    if (v < 1) return err(key(name) + "=" + std::to_string(v) + " must be >= 1");
  if (world_size > 0 && world() != world_size)
    return err("dp*ep*tp*pp*cp = " + std::to_string(world()) + " (" + ToString() + ") but there are " +
               std::to_string(world_size) + " ranks (hint: start " + std::to_string(world()) +
               " ranks with mpirun -np, or change " + P + "dp/tp/pp/ep/cp)");
  // "what=v is not divisible by by=d (hint: ...)"; `values` adds the degrees that would divide.
  auto divides = [&](const std::string& what, int64_t v, const std::string& by, int64_t d, const std::string& hint,
                     bool values = true) -> Status {
    if (d > 0 && v % d != 0)
      return err(what + "=" + std::to_string(v) + " is not divisible by " + by + "=" + std::to_string(d) +
                 " (hint: " + hint + (values && v > 0 ? "; values that divide " + std::to_string(v) + ": " +
                                                           DivisorsOf(v) : "") + ")");
    return Status::Ok();
  };
  RETURN_IF_ERROR(divides("model.n_heads", m.n_heads, key("tp"), tp, "tp splits attention heads"));
  RETURN_IF_ERROR(divides("model.n_kv_heads", m.n_kv_heads, key("tp"), tp, "tp splits key/value heads"));
  if (m.has_dense_layers())
    RETURN_IF_ERROR(divides("model.d_ff", m.d_ff, key("tp"), tp, "tp splits the FFN width"));
  if (m.n_routed_experts > 0) {
    RETURN_IF_ERROR(divides("model.d_expert", m.d_expert, key("tp"), tp, "tp splits each expert's width"));
    RETURN_IF_ERROR(divides("model.n_routed_experts", m.n_routed_experts, key("ep"), ep,
                            "ep splits the routed experts"));
  } else if (ep > 1) {
    return err(key("ep") + "=" + std::to_string(ep) + " but the model has no routed experts (hint: set " +
               key("ep") + "=1)");
  }
  if (b.interleave < 1) return err("interleave=" + std::to_string(b.interleave) + " must be >= 1");
  if (b.interleave > 1 && pp == 1)
    return err("interleave=" + std::to_string(b.interleave) + " needs " + key("pp") + " > 1 (hint: interleave=1)");
  if (static_cast<int64_t>(pp) * b.interleave > m.n_layers)
    return err(key("pp") + "=" + std::to_string(pp) +
               (b.interleave > 1 ? " x interleave=" + std::to_string(b.interleave) : std::string()) +
               " exceeds model.n_layers=" + std::to_string(m.n_layers) +
               " (hint: every stage needs at least one layer)");
  if (cp > 1)
    RETURN_IF_ERROR(divides(b.seq_len_key, b.seq_len, "2*" + key("cp"), 2 * static_cast<int64_t>(cp),
                            "context parallelism cuts each sequence into 2*cp chunks", false));
  const int64_t data = static_cast<int64_t>(dp) * ep;
  RETURN_IF_ERROR(divides(b.sequences_key, b.sequences, "dp*ep", data,
                          "every data-parallel rank gets the same number of sequences"));
  if (pp > 1)
    RETURN_IF_ERROR(divides("sequences per data rank", b.sequences / data, b.microbatches_key, b.microbatches,
                            "the pipeline splits a rank's sequences into equal micro-batches"));
  if (b.myriad_limits && m.dsa() && (tp > 1 || pp > 1 || cp > 1)) {
    const char* why =
        tp > 1   ? "its indexer learns the attention of all heads, which tp splits across ranks"
        : cp > 1 ? "sparse attention does not run over the context-parallel ring"
                 : "it is not supported under the pipeline, where a stage may hold another's top-k selection";
    std::string dims;
    for (auto [name, v] : {std::pair{"tp", tp}, {"pp", pp}, {"cp", cp}})
      if (v > 1) dims += (dims.empty() ? "" : ", ") + key(name) + "=" + std::to_string(v);
    return err(dims + ": model.attention=\"dsa\" trains with data and expert parallelism only (" + why +
               ") (hint: set " + key("tp") + ", " + key("pp") + " and " + key("cp") + " to 1; use " +
               key("dp") + " and " + key("ep") + ")");
  }
  return Status::Ok();
}

}  // namespace myriad
