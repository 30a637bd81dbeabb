#include "train/comm/world.h"

#include <cstdlib>
#include <mutex>

#include "train/comm/local_comm.h"
#include "train/comm/mpi_comm.h"

namespace myriad::comm {

bool LaunchedByMpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr;
}

std::unique_ptr<Comm> InitWorld(int* argc, char*** argv) {
  if (!LaunchedByMpirun()) return MakeSelfComm();
  static std::once_flag registered;
  InitMpi(argc, argv);
  std::call_once(registered, [] { std::atexit(FinalizeWorld); });
  return MakeMpiWorld();
}

void FinalizeWorld() { FinalizeMpi(); }

}  // namespace myriad::comm
