#!/usr/bin/env bash
# The sanitizer run CI can afford: the `asan` preset (ASan + UBSan, build/asan) without CUDA,
# building only the unit tests of base/, plan/, planner/ and the CLI flag parser, and running
# them (the PlanCommand tests need the whole `stowage` binary and are left to the full
# `make test PRESET=asan`). A full asan build and suite does not fit CI's 20 minutes on 2 cores
# (docs/building.md "Fuzzing"). The fuzz_smoke test of `make test` covers the readers under the same
# sanitizers.
set -euo pipefail
cd "$(dirname "$0")/../.."
targets=(base_json_reader_test base_json_parse_strict_test plan_plan_test plan_plan_reader_test
         planner_cost_model_test planner_hardware_test planner_model_test planner_optimizer_test
         planner_simulator_test planner_report_test planner_profile_test cli_cli_test
         cli_fuzz_regressions_test)
cmake --preset asan -DSTOWAGE_CUDA=OFF >/dev/null
cmake --build --preset asan -j "${JOBS:-2}" --target "${targets[@]}" >/dev/null
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
status=0
for t in "${targets[@]}"; do
  [[ -x build/asan/tests/$t ]] || continue  # a module without that test file
  if ! build/asan/tests/"$t" --gtest_brief=1 >"build/asan/$t.log" 2>&1; then
    echo "asan: $t FAILED"; tail -40 "build/asan/$t.log"; status=1
  else
    echo "asan: $t passed"
  fi
done
exit $status
