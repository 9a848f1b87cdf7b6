# Everything a fresh Debian/Ubuntu machine needs, from nothing: `make run`, `make test`.
# The venv is built from Debian's /usr/bin/python3 when present, because it is readable by
# every user (the unprivileged test leg runs as `nobody`). Found by the shell when the venv
# is made, not by make when it reads this file: on a fresh machine python3 arrives with
# scripts/install-system-deps, in the same recipe (make expands a recipe before running it).
PYTHON ?= "$$(test -x /usr/bin/python3 && echo /usr/bin/python3 || command -v python3 || echo python3)"
VENV   ?= .venv
PY     := $(VENV)/bin/python
# `make run`: plain facts, true wherever the clone lives: each `sandbox$` line is a command,
# then what it printed inside the sandbox. DEMO_FILE is a file `run` makes on the host outside
# every granted root; /usr is in the view, read-only; the only interface is the sandbox's lo,
# and it has no route (no address outside the machine is ever a target, even of a demo).
CMD    ?= sh -c 'show() { printf "sandbox\$$ %s\n" "$$1"; sh -c "$$1" 2>&1; }; \
            show "id -un"; \
            show "cat $$DEMO_FILE"; \
            show "touch /usr/hcp-demo"; \
            show "echo hi > hi.txt && cat hi.txt"; \
            show "cut -d: -f1 /proc/net/dev | tail -n +3"; \
            show "tail -n +2 /proc/net/route | wc -l"; \
            show "echo HCP_SANDBOX=\$$HCP_SANDBOX"'

.PHONY: setup native bytecode run test test-unprivileged lint bench probe clean

setup: $(VENV)/.installed native bytecode

# An editable install does not compile the sources, as a wheel install does: without .pyc
# files (and with PYTHONDONTWRITEBYTECODE set, they are never written) every `hcp-linux run`
# compiles some 40 modules first (+15 ms). Cheap when up to date.
bytecode: $(VENV)/.installed
	@$(PY) -m compileall -q hcp_linux >/dev/null

# The native executor (hcp-exec): built when a C compiler is there, else the ctypes executor
# is used and everything still works. Cheap when up to date.
native: $(VENV)/.installed
	@$(PY) -m hcp_linux.native.build --quiet

# Editable installs map the packages that exist at install time: reinstall when one appears.
$(VENV)/.installed: pyproject.toml setup.py scripts/install-system-deps $(wildcard */__init__.py)
	./scripts/install-system-deps
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $@

# The main job: one command confined under the default policy, in ./jail; before and after
# it, what the host sees (the demo file is removed again).
run: setup
	@mkdir -p jail
	@f=$$(mktemp /var/tmp/hcp-demo.XXXXXX) && echo "made on the host by make run" > "$$f" && \
	  echo "host\$$ cat $$f" && cat "$$f" && \
	  echo "host\$$ hcp-linux run --jail $(CURDIR)/jail --env DEMO_FILE=$$f -- sh -c '...'" && \
	  $(VENV)/bin/hcp-linux run --jail $(CURDIR)/jail --env DEMO_FILE="$$f" -- $(CMD); \
	  status=$$?; rm -f "$$f"; \
	  echo "host\$$ ls /usr/hcp-demo jail/hi.txt"; ls /usr/hcp-demo jail/hi.txt 2>&1; \
	  exit $$status

probe: setup
	$(VENV)/bin/hcp-linux probe

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

# Bugs and dead code, before any test runs: ruff with pyproject.toml's rules on the Python;
# hcp_exec.c compiled with -Wall -Wextra -Werror by each compiler its build may use; its
# layout against .clang-format, when clang-format is installed (scripts/install-system-deps
# installs it; under CI=true its absence is a failure, so a green CI checked it).
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check --no-cache . scripts/policy-table
	$(PY) -m hcp_linux.native.build --lint
	@if command -v clang-format >/dev/null; then \
	  clang-format --dry-run --Werror hcp_linux/native/hcp_exec.c hcp_linux/native/hcp_client.c && \
	  echo "clang-format: hcp_exec.c and hcp_client.c match .clang-format"; \
	else \
	  echo "lint: clang-format not installed: hcp_exec.c's layout not checked" >&2; \
	  [ "$${CI:-}" != true ]; \
	fi

# The same suite as an unprivileged user, from a copy of the tree that user can read.
test-unprivileged:
	./scripts/test-unprivileged $(PYTEST_ARGS)

# The spawn benchmark (docs/performance.md). BENCH_ARGS="--quick": /bin/true only, fewer
# samples; "--runs N": N samples per fast row.
bench: setup
	$(PY) bench/spawn.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) jail build dist *.egg-info hcp_linux/native/_build
