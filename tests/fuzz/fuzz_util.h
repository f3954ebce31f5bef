// Shared by the libFuzzer harnesses: a check that crashes (so libFuzzer records the input) when
// an invariant the code promises does not hold. Sanitizers catch memory errors and UB; this
// catches wrong answers that are not UB (a read-back plan that no longer validates, ...).
#ifndef STOWAGE_TESTS_FUZZ_FUZZ_UTIL_H_
#define STOWAGE_TESTS_FUZZ_FUZZ_UTIL_H_

#include <cstdio>
#include <cstdlib>

#define STOWAGE_FUZZ_CHECK(cond, ...)                                                         \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "fuzz invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      std::fprintf(stderr, __VA_ARGS__);                                                      \
      std::fprintf(stderr, "\n");                                                             \
      std::abort();                                                                           \
    }                                                                                         \
  } while (0)

#endif  // STOWAGE_TESTS_FUZZ_FUZZ_UTIL_H_
