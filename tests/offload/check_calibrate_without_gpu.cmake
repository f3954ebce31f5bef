# Runs `stowage calibrate` (and its --help and a bad flag) and checks the exit codes and messages.
# Invoked by ctest with -DSTOWAGE=<path of the stowage binary>.
function(run expected_rc)
  execute_process(COMMAND ${STOWAGE} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err TIMEOUT 100)
  if(NOT rc STREQUAL "${expected_rc}")
    message(FATAL_ERROR "stowage ${ARGN}: exit ${rc}, expected ${expected_rc}\n"
                        "stdout:\n${out}\nstderr:\n${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
  set(err "${err}" PARENT_SCOPE)
endfunction()

function(expect_in text needle what)
  string(FIND "${text}" "${needle}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${what} does not mention '${needle}':\n${text}")
  endif()
endfunction()

run(3 calibrate)
expect_in("${err}" "no GPU" "stderr of `stowage calibrate`")
expect_in("${err}" "preset" "stderr of `stowage calibrate`")
if(NOT out STREQUAL "")
  message(FATAL_ERROR "`stowage calibrate` without a GPU wrote to stdout:\n${out}")
endif()

run(3 calibrate --out calibrate-should-not-exist.json --device 1)
if(EXISTS calibrate-should-not-exist.json)
  message(FATAL_ERROR "`stowage calibrate --out` wrote a profile without a GPU")
endif()

run(0 calibrate --help)
foreach(flag --device --base --out --min-chunk --max-chunk --setup-bytes --torch-grouped-mm)
  expect_in("${out}" "${flag}" "`stowage calibrate --help`")
endforeach()

run(2 calibrate --no-such-flag)
expect_in("${err}" "no-such-flag" "stderr for an unknown flag")
run(2 calibrate --base not-a-gpu)
run(2 calibrate --min-chunk 1M --max-chunk 64K)

# bench/bench_grouped_mm.py's file is read and checked before any measuring: a bad one is a usage
# error naming the flag and the field, GPU or not; a missing one names the path.
file(WRITE bad-torch-grouped-mm.json
     "{\"kernel\": \"torch._grouped_mm\", \"points\": [{\"rows_per_expert\": 512, "
     "\"routing\": \"routed\", \"flops_per_second\": -1}]}")
run(2 calibrate --torch-grouped-mm bad-torch-grouped-mm.json)
expect_in("${err}" "--torch-grouped-mm bad-torch-grouped-mm.json" "stderr for a bad rates file")
expect_in("${err}" "points[0].flops_per_second" "stderr for a bad rates file")
run(2 calibrate --torch-grouped-mm no-such-rates.json)
expect_in("${err}" "cannot open 'no-such-rates.json'" "stderr for a missing rates file")
