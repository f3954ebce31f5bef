// The runtime conformance suite on the host backend (runs everywhere, CPU-only CI included).
#include "tests/runtime/runtime_conformance.h"

namespace stowage::testing {
namespace {
INSTANTIATE_TYPED_TEST_SUITE_P(Host, RuntimeConformance, HostBackendTraits);
}  // namespace
}  // namespace stowage::testing
