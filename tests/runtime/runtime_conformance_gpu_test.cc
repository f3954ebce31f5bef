// The runtime conformance suite on the CUDA backend (label `gpu`; skips without a GPU).
#include "tests/runtime/runtime_conformance.h"

namespace stowage::testing {
namespace {
INSTANTIATE_TYPED_TEST_SUITE_P(Cuda, RuntimeConformance, CudaBackendTraits);
}  // namespace
}  // namespace stowage::testing
