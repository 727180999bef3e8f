# The two Quick start commands: `make demo` and `make test`. Each installs what it needs.
# `make demo` installs memplan without extras and runs the installed copy from outside the checkout.
PY ?= python3
PIP = $(PY) -m pip install -q --disable-pip-version-check --root-user-action=ignore
# pip builds in ./build; the install targets remove it so that no stale copy of the tree stays in the checkout.

.PHONY: install install-test demo test bench

install:
	$(PIP) -e .
	rm -rf build

# PyPI's torchvision does not import beside the CPU wheel of torch 2.13.0, and transformers imports any
# torchvision it finds: install-test takes the pair whose torchvision imports, else torch without torchvision.
install-test: install
	$(PIP) -e ".[test]"
	$(PIP) torch==2.14.1 torchvision==0.29.1 || $(PIP) torch==2.13.0 || echo "PyTorch could not be installed: the exporter tests will be skipped"
	$(PIP) transformers onnxscript timm || echo "transformers, onnxscript or timm could not be installed: the export tests that need them will be skipped"
	$(PY) -c "import torchvision" 2>/dev/null || ! $(PY) -m pip show -q torchvision 2>/dev/null || \
		($(PY) -m pip uninstall -y -q torchvision timm && echo "torchvision does not import beside this torch: removed with timm, the vision export tests will be skipped")
	command -v dot >/dev/null || apt-get install -y -qq graphviz >/dev/null || \
		(apt-get update -qq && apt-get install -y -qq graphviz >/dev/null) || \
		echo "Graphviz could not be installed: the picture tests will be skipped"

demo:
	$(PIP) .
	rm -rf build
	cd "$${TMPDIR:-/tmp}" && $(PY) -m planner.cli report

test: install-test
	$(PY) -m pytest -q -n 2

bench: install-test
	$(PIP) onnx-tool matplotlib
	$(PY) benchmarks/load_time.py
	$(PY) benchmarks/plan_quality.py
	$(PY) benchmarks/plan_time.py
	$(PY) benchmarks/run_latency.py cpu
	$(PY) benchmarks/train_memory.py --device cpu
	$(PY) benchmarks/attention_memory.py --plot docs/attention_memory.png
