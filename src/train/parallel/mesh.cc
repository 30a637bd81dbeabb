#include "train/parallel/mesh.h"

#include "core/check.h"

namespace myriad {

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

Status ParallelDims::Validate(int world_size, const ModelConfig& m, int64_t global_batch, int64_t seq_len,
                              int64_t microbatches) const {
  auto err = [](const std::string& s) { return Status::Error("parallel: " + s); };
  for (auto [name, v] : {std::pair{"dp", dp}, {"tp", tp}, {"pp", pp}, {"ep", ep}, {"cp", cp}})
    if (v < 1) return err(std::string(name) + "=" + std::to_string(v) + " must be >= 1");
  if (world() != world_size)
    return err("dp*ep*tp*pp*cp = " + std::to_string(world()) + " (" + ToString() + ") but there are " +
               std::to_string(world_size) + " ranks (hint: start " + std::to_string(world()) +
               " ranks with mpirun -np, or change parallel.*)");
  auto divides = [&](const char* what, int64_t v, const char* by, int64_t d, const char* hint) -> Status {
    if (d > 0 && v % d != 0)
      return err(std::string(what) + "=" + std::to_string(v) + " is not divisible by " + by + "=" +
                 std::to_string(d) + " (hint: " + hint + ")");
    return Status::Ok();
  };
  RETURN_IF_ERROR(divides("model.n_heads", m.n_heads, "parallel.tp", tp, "tp splits attention heads"));
  RETURN_IF_ERROR(divides("model.n_kv_heads", m.n_kv_heads, "parallel.tp", tp, "tp splits key/value heads"));
  if (m.n_dense_layers > 0 || m.n_routed_experts == 0)
    RETURN_IF_ERROR(divides("model.d_ff", m.d_ff, "parallel.tp", tp, "tp splits the FFN width"));
  if (m.n_routed_experts > 0) {
    RETURN_IF_ERROR(divides("model.d_expert", m.d_expert, "parallel.tp", tp, "tp splits each expert's width"));
    RETURN_IF_ERROR(divides("model.n_routed_experts", m.n_routed_experts, "parallel.ep", ep,
                            "ep splits the routed experts"));
  } else if (ep > 1) {
    return err("parallel.ep=" + std::to_string(ep) + " but the model has no routed experts (hint: set ep=1)");
  }
  if (pp > m.n_layers)
    return err("parallel.pp=" + std::to_string(pp) + " exceeds model.n_layers=" + std::to_string(m.n_layers) +
               " (hint: every stage needs at least one layer)");
  if (cp > 1)
    RETURN_IF_ERROR(divides("train.seq_len", seq_len, "2*parallel.cp", 2 * cp,
                            "context parallelism cuts each sequence into 2*cp chunks"));
  const int64_t data = static_cast<int64_t>(dp) * ep;
  RETURN_IF_ERROR(divides("global batch (train.batch_size*train.grad_accum)", global_batch, "dp*ep", data,
                          "every data-parallel rank gets the same number of sequences"));
  if (pp > 1) {
    RETURN_IF_ERROR(divides("sequences per data rank", global_batch / data, "parallel.microbatches", microbatches,
                            "the pipeline splits a rank's sequences into equal micro-batches"));
  }
  return Status::Ok();
}

Mesh::Mesh(comm::Comm* world, const ParallelDims& dims) : world_(world), dims_(dims) {
  CHECK_MSG(world->size() == dims.world(), "mesh %s needs %d ranks, world has %d", dims.ToString().c_str(),
            dims.world(), world->size());
  int r = world->rank();
  coords_.tp = r % dims.tp; r /= dims.tp;
  coords_.cp = r % dims.cp; r /= dims.cp;
  coords_.ep = r % dims.ep; r /= dims.ep;
  coords_.dp = r % dims.dp; r /= dims.dp;
  coords_.pp = r;
}

int Mesh::RankOf(const Coords& c) const {
  return c.tp + dims_.tp * (c.cp + dims_.cp * (c.ep + dims_.ep * (c.dp + dims_.dp * c.pp)));
}

comm::Comm& Mesh::Group(unsigned mask) {
  auto it = groups_.find(mask);
  if (it != groups_.end()) return *it->second;
  // Color: the coordinates outside the mask; key: those inside (innermost first).
  const int v[5] = {coords_.tp, coords_.cp, coords_.ep, coords_.dp, coords_.pp};
  const int n[5] = {dims_.tp, dims_.cp, dims_.ep, dims_.dp, dims_.pp};
  int color = 0, key = 0, cmul = 1, kmul = 1;
  for (int i = 0; i < 5; ++i) {
    if (mask & (1u << i)) { key += v[i] * kmul; kmul *= n[i]; }
    else { color += v[i] * cmul; cmul *= n[i]; }
  }
  auto c = world_->Split(color, key);
  auto& ref = *c;
  groups_[mask] = std::move(c);
  return ref;
}

}  // namespace myriad
