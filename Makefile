# The two Quickstart commands, plus the steps they are made of.
#   make demo   install what the CLI needs (Debian packages only), configure, build the CLI, run
#               `stowage plan` on its default
#   make test   install everything the tests need (Debian and the pinned PyPI packages),
#               configure, build, run every test (GPU tests skip cleanly)
#   make fuzz   build the libFuzzer harnesses with clang and run each for FUZZ_SECONDS
# PRESET picks a CMakePresets.json preset (dev, dev-nocuda, release, asan).
PRESET ?= dev
BUILD_DIR := build/$(PRESET)
JOBS ?= $(shell nproc)

.PHONY: all deps deps-demo configure configure-demo build demo test fuzz format tidy clean

all: build

deps:
	@scripts/setup-deps

deps-demo:
	@scripts/setup-deps --demo

configure: deps
	@cmake --preset $(PRESET) >/dev/null

configure-demo: deps-demo
	@cmake --preset $(PRESET) >/dev/null

build: configure
	@cmake --build --preset $(PRESET) -j $(JOBS)

# The demo builds the CLI alone (not the test binaries) from what deps-demo installs.
demo: configure-demo
	@cmake --build --preset $(PRESET) -j $(JOBS) --target stowage
	$(BUILD_DIR)/cli/stowage plan

test: build
	ctest --preset $(PRESET) -j $(JOBS)

# Builds the libFuzzer harnesses (clang, build/fuzz) and runs each for FUZZ_SECONDS (default 60)
# over its seed corpus in tests/fuzz/corpus/; FUZZERS="plan hardware_profile" picks some.
FUZZ_SECONDS ?= 60
fuzz: deps
	FUZZ_SECONDS=$(FUZZ_SECONDS) tests/fuzz/run_fuzzers.sh $(FUZZERS)

format:
	@git ls-files '*.h' '*.cc' '*.cu' | xargs clang-format -i
	@{ git ls-files '*.py'; git grep -l '^#!/usr/bin/env python3' -- scripts; } | sort -u \
	  | xargs autopep8 -i

tidy: configure
	@git ls-files '*.cc' | xargs clang-tidy -p $(BUILD_DIR) --quiet
	@{ git ls-files '*.py'; git grep -l '^#!/usr/bin/env python3' -- scripts; } | sort -u \
	  | xargs flake8
	@scripts/check-imports

clean:
	rm -rf build
