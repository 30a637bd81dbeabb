// Shared gtest main: makes sure the BLAS reaches its fast kernel (see
// backend/cpu/blas.h) before any test touches it.
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
