# kvpool: the two commands a person needs. Both run scripts/setup.sh first (idempotent).
JOBS ?= $(shell nproc)

.PHONY: all setup build run plan test asan cuda format format-check clean

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
