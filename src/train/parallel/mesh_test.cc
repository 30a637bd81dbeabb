// The Mesh's coordinates and sub-communicators on LocalComm ranks, checked
// against expected member lists computed here from the documented rank
// formula (mesh.h):
//   rank = tp_r + tp * (cp_r + cp * (ep_r + ep * (dp_r + dp * pp_r)))
#include "train/parallel/mesh.h"

#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "train/comm/local_comm.h"

namespace myriad {
namespace {

ParallelDims Dims(int dp, int tp, int pp, int ep, int cp) {
  ParallelDims d;
  d.dp = dp; d.tp = tp; d.pp = pp; d.ep = ep; d.cp = cp;
  return d;
}

// ---- Mesh on LocalComm.

// Coordinates of world rank r, decoded independently of mesh.cc.
Coords Decode(const ParallelDims& d, int r) {
  Coords c;
  c.tp = r % d.tp; r /= d.tp;
  c.cp = r % d.cp; r /= d.cp;
  c.ep = r % d.ep; r /= d.ep;
  c.dp = r % d.dp; r /= d.dp;
  c.pp = r;
  return c;
}

int Encode(const ParallelDims& d, const Coords& c) {
  return c.tp + d.tp * (c.cp + d.cp * (c.ep + d.ep * (c.dp + d.dp * c.pp)));
}

// Expected members of `me`'s group over the dims in `mask`, in group order
// (the mask's coordinates, innermost first): enumerate every coordinate
// tuple, keep those that agree with `me` outside the mask.
std::vector<int> ExpectedMembers(const ParallelDims& d, int me, unsigned mask) {
  const Coords m = Decode(d, me);
  std::vector<int> out;
  // Loop outermost (pp) to innermost (tp) so the list is in key order.
  for (int pp = 0; pp < d.pp; ++pp)
    for (int dp = 0; dp < d.dp; ++dp)
      for (int ep = 0; ep < d.ep; ++ep)
        for (int cp = 0; cp < d.cp; ++cp)
          for (int tp = 0; tp < d.tp; ++tp) {
            Coords c{tp, cp, ep, dp, pp};
            auto in = [&](Dim x) { return (mask & static_cast<unsigned>(x)) != 0; };
            if (!in(Dim::kTp) && c.tp != m.tp) continue;
            if (!in(Dim::kCp) && c.cp != m.cp) continue;
            if (!in(Dim::kEp) && c.ep != m.ep) continue;
            if (!in(Dim::kDp) && c.dp != m.dp) continue;
            if (!in(Dim::kPp) && c.pp != m.pp) continue;
            out.push_back(Encode(d, c));
          }
  return out;
}

// World ranks of a group, in group-rank order (all-gathered over the group).
std::vector<int> Members(comm::Comm& world, comm::Comm& g) {
  int32_t me = world.rank();
  std::vector<int32_t> all(g.size());
  g.AllGather(&me, all.data(), 1, comm::DType::kI32);
  return std::vector<int>(all.begin(), all.end());
}

struct GroupCase {
  const char* name;
  unsigned mask;
};

void CheckMesh(const ParallelDims& d) {
  std::mutex mu;
  std::vector<std::string> failures;
  comm::RunLocalRanks(d.world(), [&](comm::Comm& world) {
    Mesh mesh(&world, d);
    const int r = world.rank();
    auto fail = [&](const std::string& s) {
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back("rank " + std::to_string(r) + ": " + s);
    };
    const Coords want = Decode(d, r), got = mesh.coords();
    if (got.tp != want.tp || got.cp != want.cp || got.ep != want.ep || got.dp != want.dp || got.pp != want.pp)
      fail("coordinates");
    if (mesh.RankOf(got) != r) fail("RankOf(coords) != rank");
    if (mesh.data_rank() != want.ep + d.ep * want.dp) fail("data_rank");
    if (mesh.data_size() != d.ep * d.dp) fail("data_size");
    // Named groups first, then generic masks; the same order on every rank.
    struct Named {
      const char* name;
      comm::Comm* g;
      unsigned mask;
    };
    const Named named[] = {
        {"dense_data", &mesh.dense_data(), Dim::kDp | Dim::kEp | Dim::kCp},
        {"expert_data", &mesh.expert_data(), Dim::kDp | Dim::kCp},
        {"tp", &mesh.tp(), static_cast<unsigned>(Dim::kTp)},
        {"pp", &mesh.pp(), static_cast<unsigned>(Dim::kPp)},
        {"ep", &mesh.ep(), static_cast<unsigned>(Dim::kEp)},
        {"cp", &mesh.cp(), static_cast<unsigned>(Dim::kCp)},
        {"tp|pp", &mesh.Group(Dim::kTp | Dim::kPp), Dim::kTp | Dim::kPp},
        {"dp", &mesh.Group(static_cast<unsigned>(Dim::kDp)), static_cast<unsigned>(Dim::kDp)},
    };
    for (const Named& n : named) {
      const std::vector<int> exp = ExpectedMembers(d, r, n.mask), have = Members(world, *n.g);
      if (have != exp) {
        std::string s = std::string(n.name) + ": members";
        for (int x : have) s += " " + std::to_string(x);
        s += ", expected";
        for (int x : exp) s += " " + std::to_string(x);
        fail(s);
      }
      // This rank's place in the group is its position in the member list.
      int pos = -1;
      for (size_t i = 0; i < exp.size(); ++i)
        if (exp[i] == r) pos = static_cast<int>(i);
      if (n.g->rank() != pos) fail(std::string(n.name) + ": group rank " + std::to_string(n.g->rank()));
    }
    // Asking again returns the same communicator.
    if (&mesh.dense_data() != named[0].g) fail("dense_data() built twice");
  });
  for (const auto& f : failures) ADD_FAILURE() << d.ToString() << ": " << f;
}

TEST(MeshTest, Dp2Ep2) {
  const ParallelDims d = Dims(2, 1, 1, 2, 1);
  // Spot checks by hand: rank = ep_r + 2 * dp_r.
  EXPECT_EQ(ExpectedMembers(d, 0, Dim::kDp | Dim::kCp), (std::vector<int>{0, 2}));
  EXPECT_EQ(ExpectedMembers(d, 3, Dim::kDp | Dim::kCp), (std::vector<int>{1, 3}));
  EXPECT_EQ(ExpectedMembers(d, 2, static_cast<unsigned>(Dim::kEp)), (std::vector<int>{2, 3}));
  EXPECT_EQ(ExpectedMembers(d, 1, Dim::kDp | Dim::kEp | Dim::kCp), (std::vector<int>{0, 1, 2, 3}));
  CheckMesh(d);
}

TEST(MeshTest, Dp2Tp2Pp2) {
  const ParallelDims d = Dims(2, 2, 2, 1, 1);
  // rank = tp_r + 2 * (dp_r + 2 * pp_r).
  EXPECT_EQ(ExpectedMembers(d, 5, static_cast<unsigned>(Dim::kTp)), (std::vector<int>{4, 5}));
  EXPECT_EQ(ExpectedMembers(d, 5, static_cast<unsigned>(Dim::kPp)), (std::vector<int>{1, 5}));
  EXPECT_EQ(ExpectedMembers(d, 5, Dim::kDp | Dim::kEp | Dim::kCp), (std::vector<int>{5, 7}));
  EXPECT_EQ(ExpectedMembers(d, 2, Dim::kTp | Dim::kPp), (std::vector<int>{2, 3, 6, 7}));
  CheckMesh(d);
}

TEST(MeshTest, Ep4Dp2AndCp2Tp2) {
  CheckMesh(Dims(2, 1, 1, 4, 1));
  CheckMesh(Dims(1, 2, 1, 1, 2));
}

}  // namespace
}  // namespace myriad
