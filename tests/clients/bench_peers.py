#!/usr/bin/env python3
"""`make bench-peers`: marsh-mcp against an unsandboxed peer, with the same clients, in one run.

Usage: bench_peers.py MARSH_BIN_DIR PEER_EXE WORKDIR [--calls N] [--warmup N] [--cold N]

MARSH_BIN_DIR holds release `marsh-mcp`, `marsh`, `marshd`, `sbx`; PEER_EXE is the
`mcp-yieldshell` 1.1.2 console script (it runs `sh -c` from Python asyncio, without a
sandbox or receipts); WORKDIR is an empty private directory for workspaces and homes.

Figures, printed and never asserted (the machines are noisy; quote ratios of one run):
1. raw JSON-RPC client: `echo hello` round trips, the two servers interleaved A B A B
   after a warm-up; p50/p90/p99 and the ratios marsh-mcp / peer;
2. the PyPI `mcp` client (this venv's), same interleaving;
3. cold spawn -> `initialize` result, interleaved;
4. the relay: a cheap read-only call (`scope_list`) through `connect` to the resident
   broker against `serve` on its own root; the p50 difference is what the relay adds.
"""

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

PROTOCOL = "2025-06-18"


def pct(samples, p):
    ordered = sorted(samples)
    return ordered[round((len(ordered) - 1) * p)]


class Raw:
    """A line-delimited JSON-RPC client over a child's pipes, nothing else in between."""

    def __init__(self, argv, env, cwd):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=env, cwd=cwd)
        self.next_id = 1

    def request(self, method, params):
        rid = self.next_id
        self.next_id += 1
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method,
                                          "params": params}).encode() + b"\n")
        self.proc.stdin.flush()
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{method}: the server closed its output")
            msg = json.loads(line)
            if msg.get("id") == rid:
                return msg

    def initialize(self):
        reply = self.request("initialize", {"protocolVersion": PROTOCOL, "capabilities": {},
                                            "clientInfo": {"name": "bench-peers", "version": "0"}})
        self.proc.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        self.proc.stdin.flush()
        return reply

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Target:
    def __init__(self, name, argv, env, cwd, tool, arguments, expect):
        self.name, self.argv, self.env, self.cwd = name, argv, env, cwd
        self.tool, self.arguments, self.expect = tool, arguments, expect

    def check(self, result):
        text = json.dumps(result)
        if self.expect not in text:
            raise RuntimeError(f"{self.name}: unexpected result {text[:300]}")


def interleaved(targets, calls, warmup, one_call):
    """Runs `one_call(i, target)` alternately; returns per-target seconds."""
    for _ in range(warmup):
        for i, t in enumerate(targets):
            one_call(i, t)
    times = [[] for _ in targets]
    for _ in range(calls):
        for i, t in enumerate(targets):
            start = time.perf_counter()
            one_call(i, t)
            times[i].append(time.perf_counter() - start)
    return times


def table(title, names, times):
    print(f"\n{title}")
    print(f"  {'server':<34} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8}")
    for name, t in zip(names, times):
        print(f"  {name:<34} {pct(t, .5)*1e3:>8.3f} {pct(t, .9)*1e3:>8.3f} {pct(t, .99)*1e3:>8.3f}")
    if len(times) == 2:
        a, b = times
        print(f"  {'ratio (first / second)':<34} {pct(a, .5)/pct(b, .5):>8.2f} "
              f"{pct(a, .9)/pct(b, .9):>8.2f} {pct(a, .99)/pct(b, .99):>8.2f}")


def raw_interleaved(targets, calls, warmup):
    """Per-target seconds of `calls` raw `tools/call`s, interleaved after a warm-up."""
    clients = [Raw(t.argv, t.env, t.cwd) for t in targets]
    for c in clients:
        c.initialize()

    def call(i, t):
        reply = clients[i].request("tools/call", {"name": t.tool, "arguments": t.arguments})
        t.check(reply.get("result"))

    times = interleaved(targets, calls, warmup, call)
    for c in clients:
        c.close()
    return times


def raw_round_trips(targets, calls, warmup):
    times = raw_interleaved(targets, calls, warmup)
    table(f"raw JSON-RPC client: {calls} calls each after {warmup} warm-up, interleaved",
          [t.name for t in targets], times)


def cold_starts(targets, n):
    times = [[] for _ in targets]
    for _ in range(n):
        for i, t in enumerate(targets):
            start = time.perf_counter()
            c = Raw(t.argv, t.env, t.cwd)
            reply = c.initialize()
            times[i].append(time.perf_counter() - start)
            if "result" not in reply:
                raise RuntimeError(f"{t.name}: initialize failed: {reply}")
            c.close()
    table(f"cold spawn -> initialize result ({n} each, interleaved)", [t.name for t in targets], times)


async def sdk_round_trips(targets, calls, warmup):
    async def run():
        def params(t):
            return StdioServerParameters(command=t.argv[0], args=t.argv[1:], env=t.env, cwd=t.cwd)

        with open(os.devnull, "w") as quiet:
            async with stdio_client(params(targets[0]), errlog=quiet) as (r0, w0), \
                    stdio_client(params(targets[1]), errlog=quiet) as (r1, w1):
                return await measure(r0, w0, r1, w1)

    async def measure(r0, w0, r1, w1):
        times = [[] for _ in targets]
        async with ClientSession(r0, w0) as s0, ClientSession(r1, w1) as s1:
            sessions = [s0, s1]
            for s in sessions:
                await s.initialize()
            for round_no in range(warmup + calls):
                for i, t in enumerate(targets):
                    start = time.perf_counter()
                    result = await sessions[i].call_tool(t.tool, t.arguments)
                    took = time.perf_counter() - start
                    t.check(result.model_dump(mode="json"))
                    if round_no >= warmup:
                        times[i].append(took)
        return times

    times = await run()
    table(f"PyPI mcp client: {calls} calls each after {warmup} warm-up, interleaved",
          [t.name for t in targets], times)


def relay(bin_dir, work, env, calls, warmup):
    workspace = os.path.join(work, "relay-ws")
    os.makedirs(workspace, exist_ok=True)
    marsh_mcp = os.path.join(bin_dir, "marsh-mcp")
    sbx = os.path.join(bin_dir, "sbx")
    broker_root = os.path.join(work, "relay-broker-root")
    direct_root = os.path.join(work, "relay-direct-root")
    common = ["--workspace", workspace, "--sbx", sbx]
    started = subprocess.run([marsh_mcp, "broker-start", "--scope-root", broker_root] + common,
                             env=env, cwd=workspace, capture_output=True, text=True)
    if started.returncode != 0:
        raise RuntimeError(f"broker-start failed: {started.stderr}")
    try:
        targets = [
            Target("connect -> broker (scope_list)", [marsh_mcp, "connect", "--scope-root", broker_root] + common,
                   env, workspace, "scope_list", {}, '"ok": true'),
            Target("serve direct (scope_list)", [marsh_mcp, "serve", "--scope-root", direct_root] + common,
                   env, workspace, "scope_list", {}, '"ok": true'),
        ]
        times = raw_interleaved(targets, calls, warmup)
        table(f"relay: {calls} scope_list calls each, interleaved", [t.name for t in targets], times)
        added = (pct(times[0], .5) - pct(times[1], .5)) * 1e6
        print(f"  the relay adds {added:.0f} us at p50")
    finally:
        subprocess.run([marsh_mcp, "broker-stop", "--scope-root", broker_root] + common,
                       env=env, cwd=workspace, capture_output=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("peer")
    ap.add_argument("work")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--cold", type=int, default=10)
    opts = ap.parse_args()
    opts.bin_dir, opts.peer = os.path.abspath(opts.bin_dir), os.path.abspath(opts.peer)

    work = opts.work
    ws_marsh = os.path.join(work, "ws-marsh")
    ws_peer = os.path.join(work, "ws-peer")
    home = os.path.join(work, "home")
    for d in (ws_marsh, ws_peer):
        os.makedirs(d, exist_ok=True)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"),
           "SBX_SHIM_STATE": os.path.join(work, "sbx-state.json"),
           "XDG_RUNTIME_DIR": os.path.join(work, "run")}
    os.makedirs(env["XDG_RUNTIME_DIR"], mode=0o700, exist_ok=True)
    peer_env = dict(env, YIELDSHELL_ALLOWED_CWDS=ws_peer)
    marsh = Target("marsh-mcp serve (bwrap sandbox)",
                   [os.path.join(opts.bin_dir, "marsh-mcp"), "serve", "--workspace", ws_marsh, "--home", home,
                    "--sbx", os.path.join(opts.bin_dir, "sbx")],
                   env, ws_marsh, "shell_run", {"command": "echo hello"}, "hello")
    peer = Target("mcp-yieldshell 1.1.2 (unsandboxed)", [opts.peer], peer_env, ws_peer, "execute",
                  {"command": "echo hello", "side_effects": ["NONE"], "cwd": ws_peer}, "hello")
    targets = [marsh, peer]
    print(f"marsh-mcp from {opts.bin_dir}; peer {opts.peer}; {os.cpu_count()} CPUs")
    try:
        raw_round_trips(targets, opts.calls, opts.warmup)
        asyncio.run(sdk_round_trips(targets, opts.calls, opts.warmup))
        cold_starts(targets, opts.cold)
        relay(opts.bin_dir, work, env, opts.calls, opts.warmup)
    finally:
        stop = subprocess.run([os.path.join(opts.bin_dir, "marsh"), "stop", "--json"],
                              env=dict(env, MARSH_HOME=home), cwd=ws_marsh, capture_output=True)
        if stop.returncode != 0:
            print(f"note: marsh stop: {stop.stderr.decode().strip()}", file=sys.stderr)


if __name__ == "__main__":
    main()
