// MpiComm: Comm over OpenMPI, one MPI communicator per Comm (the world is a
// duplicate of MPI_COMM_WORLD, splits get their own), so ops on different
// communicators from different threads are legal under MPI_THREAD_MULTIPLE.
//
// - Collectives map to MPI_Allreduce (in place), MPI_Reduce_scatter_block,
//   MPI_Allgather (MPI_IN_PLACE when send aliases its own block of recv),
//   MPI_Alltoallv, MPI_Bcast, MPI_Barrier; p2p to MPI_Isend/MPI_Irecv (the
//   blocking forms wait on them); Split to MPI_Comm_split; SplitShared to
//   MPI_Comm_split_type(MPI_COMM_TYPE_SHARED).
// - Counts, displacements and per-rank sizes must fit in an int (MPI's count
//   type); a larger one aborts with a [comm] message naming the op.
// - Async collectives run the blocking MPI op on the communicator's progress
//   thread. When the library grants less than MPI_THREAD_MULTIPLE they run
//   at issue on the calling thread instead (logged once at info level), and
//   only one thread may use MPI at a time.
// - Reductions follow the MPI library's order: results are equal on every
//   rank, but float sums may differ in the last bits from LocalComm's rank
//   order.
// - A Request of an ISend/IRecv is waited on (or tested) by one thread at a
//   time; wait on every one before destroying the communicator.
// - Errors are fatal (MPI_ERRORS_ARE_FATAL).
#pragma once

#include <memory>

#include "train/comm/comm.h"

namespace myriad::comm {

// MPI_Init_thread asking for MPI_THREAD_MULTIPLE, unless MPI is already
// initialised. Most callers want InitWorld (world.h) instead.
void InitMpi(int* argc, char*** argv);

// True when the library granted MPI_THREAD_MULTIPLE (after InitMpi).
bool MpiThreadMultiple();

// A new communicator over a duplicate of MPI_COMM_WORLD ("mpi world N").
std::unique_ptr<Comm> MakeMpiWorld();

// Frees every live MpiComm's MPI communicator (after its queued work), then
// MPI_Finalize, once. No-op when MPI was never initialised.
void FinalizeMpi();

}  // namespace myriad::comm
