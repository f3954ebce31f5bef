// stowage_agree_nccl over a real NCCL communicator (gpu label: skips without a GPU, without NCCL
// in the build, or without an NCCL library to load). NCCL is loaded, not linked, as the runtime
// does (offload/cuda/nccl_api.h, Note [NCCL from the process]): the test binary stays small
// enough to carry to a GPU machine, which has its own NCCL.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "stowage/plan.h"
#include "stowage/stowage.h"
#include "tests/runtime/test_plans.h"
#include "tests/test_util.h"

#ifdef STOWAGE_HAVE_NCCL
#include <nccl.h>
#endif

namespace {

TEST(PlanAgreementGpu, AgreesOverAnNcclCommunicator) {
  STOWAGE_REQUIRE_GPU();
#ifndef STOWAGE_HAVE_NCCL
  GTEST_SKIP() << "built without NCCL";
#else
  // Global: stowage_agree_nccl finds the functions of the communicator's library in the process.
  void* nccl = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
  if (nccl == nullptr) GTEST_SKIP() << "no libnccl.so.2 to load: " << dlerror();
  auto init_all = reinterpret_cast<decltype(&ncclCommInitAll)>(dlsym(nccl, "ncclCommInitAll"));
  auto destroy = reinterpret_cast<decltype(&ncclCommDestroy)>(dlsym(nccl, "ncclCommDestroy"));
  ASSERT_NE(init_all, nullptr);
  ASSERT_NE(destroy, nullptr);
  const std::string json = stowage::PlanToJson(stowage::testing::MakeTestPlan(2, 1 << 20));
  stowage_options options;
  stowage_options_init(&options);
  options.backend = STOWAGE_BACKEND_CUDA;
  options.metrics_address = "";
  stowage_runtime* rt = nullptr;
  ASSERT_EQ(stowage_create(json.data(), json.size(), &options, &rt), STOWAGE_OK)
      << stowage_last_error();
  ncclComm_t comm = nullptr;
  int devices[] = {0};
  ASSERT_EQ(init_all(&comm, 1, devices), ncclSuccess);
  EXPECT_EQ(stowage_agree_nccl(rt, comm), STOWAGE_OK) << stowage_last_error();
  destroy(comm);
  EXPECT_EQ(stowage_destroy(rt), STOWAGE_OK);
#endif
}

}  // namespace
