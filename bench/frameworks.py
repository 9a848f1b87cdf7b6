"""What a framework's sandbox call costs, hcp-linux against each framework's local backend.

    python bench/frameworks.py [--runs N] [--eval N] [--json FILE]

Needs the frameworks (scripts/test-frameworks's venv, or FRAMEWORKS_VENV). Rows, median and
p95 wall ms over ``--runs`` calls, in one event loop:

- Inspect AI (hcp-linux with a session per sample, the default, and with a confinement per
  command, ``HcpLinuxConfig(session=False)``): a sample's setup and cleanup
  (``sample_init`` + ``sample_cleanup``); the same with one ``exec(["true"])`` in between
  (hcp-linux starts the sample's session in a thread at its setup: the first command waits for
  it); the first ``exec(["true"])`` 0.2 s after the setup (a model call's worth: the session
  has started by then); ``exec(["true"])`` in a live sample; ``write_file`` + ``read_file``
  of 1 KiB.
- OpenAI Agents SDK: ``create()`` + one ``exec("true")`` + ``delete``; ``exec("true")`` in a
  live session.

``--eval N``: ``inspect eval`` of N samples (mockllm, one bash() call each, max_samples 1)
with each provider, end to end in a fresh interpreter. Docker, Inspect's other built-in
provider, is not measured where its daemon does not answer. Timing only: nothing asserted.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Awaitable, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


async def measure(fn: Callable[[], Awaitable[Any]], runs: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        await fn()
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        await fn()
        out.append((time.perf_counter() - t0) * 1000.0)
    return out


def row(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {"median": statistics.median(s), "p95": s[min(len(s) - 1, int(len(s) * 0.95))]}


async def inspect_rows(runs: int) -> dict[str, dict[str, float]]:
    from inspect_ai.util._sandbox.local import LocalSandboxEnvironment
    from hcp_linux.integrations.inspect import HcpLinuxSandbox
    from hcp_linux.integrations.inspect import HcpLinuxConfig
    out = {}
    for name, cls, config in (
            ("hcp-linux", HcpLinuxSandbox, None),
            ("hcp-linux session=False", HcpLinuxSandbox, HcpLinuxConfig(session=False)),
            ("local", LocalSandboxEnvironment, None)):
        async def setup(first_exec: bool = False) -> None:
            envs = await cls.sample_init("bench", config, {})
            if first_exec:
                await envs["default"].exec(["true"])
            await cls.sample_cleanup("bench", config, envs, False)

        out[f"inspect {name}: sample setup+cleanup"] = row(await measure(setup, runs))
        out[f"inspect {name}: sample setup+exec+cleanup"] = row(
            await measure(lambda: setup(True), runs))
        firsts: list[float] = []
        for _ in range(max(5, runs // 3)):  # the first exec after a model call's worth of time
            envs = await cls.sample_init("bench", config, {})
            await asyncio.sleep(0.2)
            t0 = time.perf_counter()
            await envs["default"].exec(["true"])
            firsts.append((time.perf_counter() - t0) * 1000.0)
            await cls.sample_cleanup("bench", config, envs, False)
        out[f"inspect {name}: first exec, 0.2 s after setup"] = row(firsts)
        envs = await cls.sample_init("bench", config, {})
        env = envs["default"]

        async def files() -> None:
            await env.write_file("f.txt", "x" * 1024)
            await env.read_file("f.txt")

        out[f"inspect {name}: exec true"] = row(await measure(lambda: env.exec(["true"]), runs))
        out[f"inspect {name}: write_file+read_file 1 KiB"] = row(await measure(files, runs))
        await cls.sample_cleanup("bench", config, envs, False)
    return out


async def agents_rows(runs: int) -> dict[str, dict[str, float]]:
    from agents.sandbox.sandboxes.unix_local import UnixLocalSandboxClient
    from hcp_linux.integrations.openai_agents import HcpSandboxClient
    out = {}
    for name, client in (("hcp-linux", HcpSandboxClient()), ("unix_local",
                                                             UnixLocalSandboxClient())):
        async def lifecycle() -> None:
            s = await client.create()
            async with s:
                await s.exec("true")
            await client.delete(s)

        out[f"agents {name}: create+exec+delete"] = row(await measure(lifecycle, runs))
        s = await client.create()
        async with s:
            out[f"agents {name}: exec true"] = row(await measure(lambda: s.exec("true"), runs))
        await client.delete(s)
    return out


EVAL = r'''
import sys, time
from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import bash
sandbox, n = sys.argv[1], int(sys.argv[2])
outputs = []
for _ in range(n):
    outputs += [ModelOutput.for_tool_call("mockllm/model", "bash", {"command": "echo hi"}),
                ModelOutput.from_content("mockllm/model", "done")]
for o in outputs:
    o.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
task = Task(dataset=[Sample(input=str(i)) for i in range(n)],
            solver=[use_tools(bash()), generate()], sandbox=sandbox)
t0 = time.perf_counter()
log = eval(task, model=get_model("mockllm/model", custom_outputs=outputs), display="none",
           log_dir=sys.argv[3], max_samples=1)[0]
print(log.status, (time.perf_counter() - t0) * 1000.0)
'''


def eval_rows(n: int) -> dict[str, dict[str, float]]:
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "bench_eval.py")
        with open(script, "w") as f:
            f.write(EVAL)
        for sandbox in ("hcp-linux", "local"):
            # HOME: an empty directory, so that local's `bash --login` does not read this
            # host's own profile (root's here starts pyenv: ~370 ms a call)
            home = os.path.join(tmp, "home")
            os.makedirs(home, exist_ok=True)
            r = subprocess.run([sys.executable, script, sandbox, str(n), tmp],
                               capture_output=True, text=True, timeout=1800,
                               env={**os.environ, "HOME": home})
            status, ms = r.stdout.split()[-2:]
            assert status == "success", r.stderr[-2000:]
            out[f"inspect eval {n} samples, {sandbox}"] = {"total": float(ms),
                                                          "per sample": float(ms) / n}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--eval", type=int, default=0, metavar="N")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = asyncio.run(inspect_rows(args.runs))
    rows.update(asyncio.run(agents_rows(args.runs)))
    if args.eval:
        rows.update(eval_rows(args.eval))
    for name, r in rows.items():
        print(f"{name:50s} " + "  ".join(f"{k} {v:8.1f} ms" for k, v in r.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
