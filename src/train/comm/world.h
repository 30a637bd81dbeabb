// The process's world communicator: real MPI ranks when started by mpirun,
// otherwise a communicator of one rank with MPI left uninitialised (so
// `myriad train` runs with no mpirun and no MPI runtime at all).
#pragma once

#include <memory>

#include "train/comm/comm.h"

namespace myriad::comm {

// True when this process was started by mpirun (OMPI_COMM_WORLD_SIZE or
// PMIX_RANK in the environment).
bool LaunchedByMpirun();

// Under mpirun: initialises MPI (MPI_Init_thread asking for
// MPI_THREAD_MULTIPLE; see mpi_comm.h for what happens with less) and returns
// the world ("mpi world N", its own duplicate of MPI_COMM_WORLD). Otherwise
// returns MakeSelfComm() ("local self 1"). argc/argv may be null. May be
// called more than once (each call returns a new communicator).
std::unique_ptr<Comm> InitWorld(int* argc, char*** argv);

// Frees every MPI communicator still alive (their queued async work runs
// first; later ops on them abort) and calls MPI_Finalize, once. Also
// registered with atexit by InitWorld; harmless when MPI was never started.
void FinalizeWorld();

}  // namespace myriad::comm
