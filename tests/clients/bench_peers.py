#!/usr/bin/env python3
"""`make bench-peers`: marsh-mcp against sandboxed and unsandboxed peers, one client, one run.

Usage: bench_peers.py MARSH_BIN_DIR PEER_EXE WORKDIR [--codex-mcp EXE --codex-sandbox EXE]
                      [--hares EXE] [--calls N] [--warmup N] [--cold N]

MARSH_BIN_DIR holds release `marsh-mcp`, `marsh`, `marshd`, `sbx`; PEER_EXE is the
`mcp-yieldshell` 1.1.2 console script (it runs `sh -c` from Python asyncio, without a
sandbox or receipts); WORKDIR is an empty private directory for workspaces and homes.
The optional peers: `@openai/codex-shell-tool-mcp` 0.97.0 (`--codex-mcp`, its launcher)
with the `codex-linux-sandbox` of `@openai/codex` 0.97.0 (`--codex-sandbox`), sent the
`codex/sandbox-state/update` request the Codex client sends (workspace-write, the
workspace the only writable root, no network, Landlock rather than bubblewrap); `hares`
0.5.2 (`--hares`, bubblewrap per call, `HARES_RSS_POLL_INTERVAL_SEC=0.01`). Every server
gets an empty `HOME`.

Figures, printed and never asserted (the machines are noisy; quote ratios of one run):
1. raw JSON-RPC client: `echo hello` round trips, all servers interleaved A B C D after a
   warm-up; p50/p90/p99, the ratios marsh-mcp / each peer, and each server's resident
   memory (its whole process tree) after the run;
2. the PyPI `mcp` client (this venv's), marsh-mcp and yieldshell interleaved;
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

    def initialize(self, setup=None):
        reply = self.request("initialize", {"protocolVersion": PROTOCOL, "capabilities": {},
                                            "clientInfo": {"name": "bench-peers", "version": "0"}})
        self.proc.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        self.proc.stdin.flush()
        if setup is not None:
            method, params = setup
            answer = self.request(method, params)
            if "result" not in answer:
                raise RuntimeError(f"{method} failed: {answer}")
        return reply

    def tree_rss_kib(self):
        """Resident memory of the server and every descendant, in KiB."""
        total, pending = 0, [self.proc.pid]
        while pending:
            pid = pending.pop()
            try:
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith("VmRSS:"):
                            total += int(line.split()[1])
                with open(f"/proc/{pid}/task/{pid}/children") as f:
                    pending.extend(int(c) for c in f.read().split())
            except (FileNotFoundError, ProcessLookupError):
                continue
        return total

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Target:
    def __init__(self, name, argv, env, cwd, tool, arguments, expect, setup=None):
        self.name, self.argv, self.env, self.cwd = name, argv, env, cwd
        self.tool, self.arguments, self.expect = tool, arguments, expect
        # A request sent after `initialize` (the Codex client's sandbox state).
        self.setup = setup

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
    first = times[0]
    for name, other in zip(names[1:], times[1:]):
        label = f"ratio {names[0].split()[0]} / {name.split()[0]}"
        print(f"  {label:<34} {pct(first, .5)/pct(other, .5):>8.2f} "
              f"{pct(first, .9)/pct(other, .9):>8.2f} {pct(first, .99)/pct(other, .99):>8.2f}")


def raw_interleaved(targets, calls, warmup):
    """Per-target seconds of `calls` raw `tools/call`s, interleaved after a warm-up."""
    clients = [Raw(t.argv, t.env, t.cwd) for t in targets]
    for c, t in zip(clients, targets):
        c.initialize(t.setup)

    def call(i, t):
        reply = clients[i].request("tools/call", {"name": t.tool, "arguments": t.arguments})
        t.check(reply.get("result"))

    times = interleaved(targets, calls, warmup, call)
    rss = [c.tree_rss_kib() for c in clients]
    for c in clients:
        c.close()
    return times, rss


def raw_round_trips(targets, calls, warmup):
    times, rss = raw_interleaved(targets, calls, warmup)
    table(f"raw JSON-RPC client: {calls} calls each after {warmup} warm-up, interleaved",
          [t.name for t in targets], times)
    print("  resident memory after the run (server process tree, MB):")
    for t, kib in zip(targets, rss):
        print(f"    {t.name:<32} {kib / 1024:>8.1f}")


def cold_starts(targets, n):
    times = [[] for _ in targets]
    for _ in range(n):
        for i, t in enumerate(targets):
            start = time.perf_counter()
            c = Raw(t.argv, t.env, t.cwd)
            reply = c.initialize(t.setup)
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
        times, _ = raw_interleaved(targets, calls, warmup)
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
    ap.add_argument("--codex-mcp")
    ap.add_argument("--codex-sandbox")
    ap.add_argument("--hares")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--cold", type=int, default=10)
    opts = ap.parse_args()
    opts.bin_dir, opts.peer = os.path.abspath(opts.bin_dir), os.path.abspath(opts.peer)

    work = opts.work
    ws_marsh = os.path.join(work, "ws-marsh")
    ws_peer = os.path.join(work, "ws-peer")
    ws_codex = os.path.join(work, "ws-codex")
    ws_hares = os.path.join(work, "ws-hares")
    home = os.path.join(work, "home")
    empty_home = os.path.join(work, "empty-home")
    for d in (ws_marsh, ws_peer, ws_codex, ws_hares, empty_home):
        os.makedirs(d, exist_ok=True)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": empty_home,
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
    targets = [marsh]
    if opts.codex_mcp and opts.codex_sandbox:
        state = {"sandboxPolicy": {"type": "workspace-write", "writable_roots": [ws_codex],
                                   "network_access": False, "exclude_tmpdir_env_var": False,
                                   "exclude_slash_tmp": False},
                 "codexLinuxSandboxExe": os.path.abspath(opts.codex_sandbox),
                 "sandboxCwd": ws_codex, "useLinuxSandboxBwrap": False}
        targets.append(Target("codex-shell-tool-mcp 0.97.0 (landlock)", [os.path.abspath(opts.codex_mcp)],
                              env, ws_codex, "shell", {"command": "echo hello", "workdir": ws_codex},
                              "hello", setup=("codex/sandbox-state/update", state)))
    targets.append(peer)
    if opts.hares:
        targets.append(Target("hares 0.5.2 (bwrap per call)", [os.path.abspath(opts.hares)],
                              dict(env, HARES_RSS_POLL_INTERVAL_SEC="0.01"), ws_hares, "execute_command",
                              {"command": "echo hello", "cwd": ws_hares}, "hello"))
    print(f"marsh-mcp from {opts.bin_dir}; peer {opts.peer}; {os.cpu_count()} CPUs")
    try:
        raw_round_trips(targets, opts.calls, opts.warmup)
        asyncio.run(sdk_round_trips([marsh, peer], opts.calls, opts.warmup))
        cold_starts(targets, opts.cold)
        relay(opts.bin_dir, work, env, opts.calls, opts.warmup)
    finally:
        stop = subprocess.run([os.path.join(opts.bin_dir, "marsh"), "stop", "--json"],
                              env=dict(env, MARSH_HOME=home), cwd=ws_marsh, capture_output=True)
        if stop.returncode != 0:
            print(f"note: marsh stop: {stop.stderr.decode().strip()}", file=sys.stderr)


if __name__ == "__main__":
    main()
