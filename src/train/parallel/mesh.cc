#include "train/parallel/mesh.h"

#include "core/check.h"

namespace myriad {

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
