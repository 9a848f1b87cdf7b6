# Everything a fresh Debian/Ubuntu machine needs, from nothing: `make run`, `make test`.
# The venv is built from Debian's /usr/bin/python3 when present, because it is readable by
# every user (the unprivileged test leg runs as `nobody`).
PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
CMD    ?= sh -c 'echo hello > written-in-jail.txt && cat written-in-jail.txt; echo x > /etc/escape 2>&1; ip -brief link 2>/dev/null || cat /proc/net/dev'

.PHONY: setup run test test-unprivileged bench probe clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml scripts/install-system-deps
	./scripts/install-system-deps
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $@

# The main job: one command confined under the default policy, in a fresh jail directory.
run: setup
	mkdir -p jail
	$(VENV)/bin/hcp-linux run --jail jail -- $(CMD)

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
	rm -rf $(VENV) jail build *.egg-info
