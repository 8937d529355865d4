# The two set-up commands on a fresh Debian 12 machine:
#   make run    install dependencies, build, generate text with the embedded default model
#   make test   install dependencies, build, run every test (release + ASan/UBSan, bounded fuzzing)
# `make` alone builds build/mlxcel.
JOBS ?= $(shell nproc)
FUZZ_SECONDS ?= 30

.PHONY: all deps run test test-release test-asan fuzz clean

all:
	cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build build -j $(JOBS)

deps:
	./scripts/install-deps.sh

run: deps all
	./build/mlxcel generate -p "ROMEO:" -n 64

test: deps test-release test-asan fuzz

test-release: all
	cd build && ctest --output-on-failure -j $(JOBS)

test-asan:
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMLXCEL_SANITIZE=ON >/dev/null
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)

fuzz:
	CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMLXCEL_FUZZ=ON >/dev/null
	cmake --build build-fuzz -j $(JOBS) --target fuzzers
	./scripts/run-fuzz.sh build-fuzz $(FUZZ_SECONDS)

clean:
	rm -rf build build-asan build-fuzz
