#!/usr/bin/env bash
# Builds the libFuzzer harnesses (the `fuzz` preset: clang, ASan + UBSan, build/fuzz) and runs
# each for a chosen time over its seed corpus in tests/fuzz/corpus/<name>/. New inputs go to a
# scratch directory, never into the repo; a crash leaves its input in build/fuzz/artifacts/ and
# fails the run (add it to the corpus and a regression test once fixed). The JSON harnesses use
# the dictionary tests/fuzz/json.dict (JSON's tokens and deep nesting of arrays and objects).
#   tests/fuzz/run_fuzzers.sh [--seconds N] [name ...]     (default: FUZZ_SECONDS or 60, all)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
seconds=${FUZZ_SECONDS:-60}
names=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    *) names+=("$1"); shift ;;
  esac
done
if [[ ${#names[@]} -eq 0 ]]; then
  for f in "$root"/tests/fuzz/*_fuzz.cc; do names+=("$(basename "$f" _fuzz.cc)"); done
fi

cd "$root"
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz --target stowage_fuzzers -j "${JOBS:-2}" >/dev/null
artifacts="$root/build/fuzz/artifacts"
mkdir -p "$artifacts"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

status=0
printf '%-18s %10s %8s %8s %8s  %s\n' harness runs cov ft corpus result
for name in "${names[@]}"; do
  bin="$root/build/fuzz/tests/fuzz/${name}_fuzz"
  mkdir -p "$scratch/$name"
  log="$scratch/$name.log"
  result=ok
  dict=()
  [[ $name == cli_flags ]] || dict=(-dict="$root/tests/fuzz/json.dict")
  # -timeout: one input taking 10 s is a hang; -rss_limit_mb: a runaway allocation is a bug.
  if ! "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      "${dict[@]}" -artifact_prefix="$artifacts/${name}-" "$scratch/$name" "$root/tests/fuzz/corpus/$name" \
      >"$log" 2>&1; then
    result="FAILED (see below; input in $artifacts)"
    status=1
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  cov=$(grep -o 'cov: [0-9]*' <<<"$last" | grep -o '[0-9]*' || echo '?')
  ft=$(grep -o 'ft: [0-9]*' <<<"$last" | grep -o '[0-9]*' || echo '?')
  corp=$(grep -o 'corp: [0-9]*' <<<"$last" | grep -o '[0-9]*' || echo '?')
  printf '%-18s %10s %8s %8s %8s  %s\n' "$name" "${runs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$result"
  if [[ $result != ok ]]; then grep -v '^#' "$log" | tail -40; fi
done
exit $status
