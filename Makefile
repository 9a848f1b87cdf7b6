# Everything a fresh Debian/Ubuntu machine needs, from nothing: `make run`, `make test`.
# The venv is built from Debian's /usr/bin/python3 when present, because it is readable by
# every user (the unprivileged test leg runs as `nobody`).
PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
CMD    ?= sh -c 'echo hello > in-jail.txt && echo "write in the jail: ok ($$(cat in-jail.txt))"; \
            (echo x > ../beside-jail.txt) 2>/dev/null && echo "write beside the jail: ALLOWED" || echo "write beside the jail: denied"; \
            echo "network interfaces: $$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d " " | tr "\n" " ")"; \
            echo "HCP_SANDBOX=$$HCP_SANDBOX"'

.PHONY: setup native bytecode run test test-unprivileged bench probe clean

setup: $(VENV)/.installed native bytecode

# An editable install does not compile the sources, as a wheel install does: without .pyc
# files (and with PYTHONDONTWRITEBYTECODE set, they are never written) every `hcp-linux run`
# compiles some 40 modules first (+15 ms). Cheap when up to date.
bytecode: $(VENV)/.installed
	@$(PY) -m compileall -q hcp_linux landlock seccomp_profiles >/dev/null

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

# The main job: one command confined under the default policy, in a fresh jail directory.
run: setup
	mkdir -p jail
	$(VENV)/bin/hcp-linux run --jail $(CURDIR)/jail -- $(CMD)

probe: setup
	$(VENV)/bin/hcp-linux probe

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

# The same suite as an unprivileged user, from a copy of the tree that user can read.
test-unprivileged:
	./scripts/test-unprivileged $(PYTEST_ARGS)

bench: setup
	$(PY) bench/spawn.py

clean:
	rm -rf $(VENV) jail build dist *.egg-info hcp_linux/native/_build
