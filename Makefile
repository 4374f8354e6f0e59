# Two commands: `make demo` runs the main job, `make test` runs every test.
PY := .venv/bin/python
BUILD := build
# The toolkit's usual home, for a shell whose PATH lacks nvcc.
CUDA_COMPILER := $(firstword $(shell command -v nvcc) $(wildcard /usr/local/cuda/bin/nvcc))
EXECUTORCH_CMAKE = $(shell $(PY) -c "import executorch, os; print(os.path.join(list(executorch.__path__)[0], 'lib', 'cmake', 'executorch'))")

.PHONY: setup build demo test
setup:
	scripts/setup.sh

build: setup
	cmake -S . -B $(BUILD) -G Ninja -Dexecutorch_DIR=$(EXECUTORCH_CMAKE) $(if $(CUDA_COMPILER),-DCMAKE_CUDA_COMPILER=$(CUDA_COMPILER))
	cmake --build $(BUILD)

demo: build
	scripts/demo.sh

test: build
	scripts/test.sh

# The two wheels, kiln-runtime and kiln, audited, into dist/.
.PHONY: wheels
wheels: build
	$(PY) packaging/build_wheels.py --build-dir $(BUILD) --out dist
