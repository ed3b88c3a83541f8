#!/usr/bin/env python3
"""`make demo`: a real MCP client session (the PyPI `mcp` client) against `marsh-mcp serve`.

Usage: demo.py PREFIX_BIN WORKSPACE SCOPE_ROOT

Starts `PREFIX_BIN/marsh-mcp serve` on stdio with the stand-in marsh/sbx from the same
prefix, exercises the main tools and prints each result readably.
"""

import asyncio
import json
import os
import sys
import textwrap

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client


def show(title, envelope):
    print(f"\n=== {title}")
    if not envelope.get("ok"):
        err = envelope["error"]
        print(f"  error {err['kind']} (retryable={err['retryable']}): {err['message']}")
        return envelope
    data = envelope["data"]
    for key in ("outcome", "state", "exit_code", "operation_id", "stdout_text", "stderr_text", "stdout_text_state",
                "output_complete", "next_seq", "latest_seq", "capped", "healthy", "mode", "runtime_state"):
        if key in data and data[key] not in (None, ""):
            value = data[key]
            if isinstance(value, str) and "\n" in value:
                print(f"  {key}:")
                print(textwrap.indent(value.rstrip("\n"), "    | "))
            else:
                print(f"  {key}: {value}")
    if "stdout_base64" in data and data.get("stdout_text_state") == "lossy":
        print(f"  stdout_base64 (authoritative bytes): {data['stdout_base64']}")
    return envelope


async def call(session, name, args=None):
    result = await session.call_tool(name, args or {})
    envelope = result.structured_content
    if envelope is None:  # older clients: fall back to the text copy
        envelope = json.loads(result.content[0].text)
    return envelope


async def main():
    bin_dir, workspace, root = sys.argv[1:4]
    params = StdioServerParameters(
        command=os.path.join(bin_dir, "marsh-mcp"),
        args=["serve", "--workspace", workspace, "--scope-root", root, "--sbx", os.path.join(bin_dir, "sbx")],
        env={"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")},
        cwd=workspace,
    )
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            print(f"connected to {init.server_info.name} {init.server_info.version} "
                  f"(protocol {init.protocol_version})")
            tools = await session.list_tools()
            print("tools:", ", ".join(t.name for t in tools.tools))

            doctor = show("doctor", await call(session, "doctor"))
            for check in doctor["data"]["checks"]:
                if check["name"] == "isolation":
                    print(f"  sandbox: {check['detail']}")
            show("shell_run: where am I, who am I", await call(session, "shell_run", {"command": "pwd; id -un; uname -s"}))
            show("shell_run: separate streams and a nonzero exit",
                 await call(session, "shell_run", {"command": "echo to-stdout; echo to-stderr >&2; exit 3"}))
            show("shell_run: bytes that are not UTF-8", await call(session, "shell_run", {"command": r"printf 'ok \377\376'"}))
            show("shell_run: the sandbox hides the scope root", await call(session, "shell_run", {"command": f"ls {root} 2>&1; echo exit=$?"}))
            show("shell_run: no host privilege (set-id bits, kernel settings, processes)",
                 await call(session, "shell_run", {"command":
                     "chmod u+s README.txt 2>&1; (echo x > /proc/sys/kernel/core_pattern) 2>&1; "
                     "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; ps -e | wc -l"}))
            show("status", await call(session, "status"))
            listed = show("results_list (newest 3)", await call(session, "results_list", {"limit": 3}))
            for r in listed["data"]["results"]:
                print(f"    {r['id'][:8]}  exit={r['exit_code']}  {r['command']!r}")
            first = listed["data"]["results"][0]["id"]
            got = show(f"result_get {first[:8]}", await call(session, "result_get", {"selector": first[:8]}))
            print(f"    command={got['data']['result']['command']!r} duration_ms={got['data']['result']['duration_ms']}")

            started = show("shell_run: a long command yields (wait_ms=300)",
                           await call(session, "shell_run", {"command": "for i in 1 2 3; do echo tick $i; sleep 0.4; done", "wait_ms": 300}))
            op = started["data"]["operation_id"]
            since = started["data"]["next_seq"]
            show("operation_get wait_ms=5000", await call(session, "operation_get", {"operation_id": op, "wait_ms": 5000}))
            show(f"operation_output since_seq={since}", await call(session, "operation_output", {"operation_id": op, "since_seq": since}))

            long = await call(session, "shell_run", {"command": "sleep 60", "wait_ms": 0})
            show("operation_cancel of a sleeping command",
                 await call(session, "operation_cancel", {"operation_id": long["data"]["operation_id"]}))
            show("shell_run: timeout_ms=200", await call(session, "shell_run", {"command": "sleep 30", "timeout_ms": 200}))
            show("prewarm all", await call(session, "prewarm", {"selection": "all"}))
            show("qualify without --allow-full-sbx-control", await call(session, "qualify", {"gate": "source"}))
            show("invalid argument (unknown field)", await call(session, "shell_run", {"command": "true", "cwd": "/"}))

            started = show("scope_start: a private scope over the same workspace", await call(session, "scope_start"))
            scope = started["data"]["scope_id"]
            print(f"  scope_id: {scope}")
            show("scope_run in the new scope", await call(session, "scope_run", {"scope_id": scope, "command": "echo from the private scope; pwd"}))
            listed = await call(session, "scope_list")
            print("\n=== scope_list")
            for s in listed["data"]["scopes"]:
                print(f"    {s['scope_id']:<36}  {s['state']}")
            show("scope_stop", await call(session, "scope_stop", {"scope_id": scope}))
            show("scope_status after stop", await call(session, "scope_status", {"scope_id": scope}))
            show("scope_run on a stopped scope", await call(session, "scope_run", {"scope_id": scope, "command": "true"}))
            # Reading a stopped scope boots it, reads, then exactly stops it: an operation.
            read = show("scope_results_list of a stopped scope (wait_ms 0: an operation)",
                        await call(session, "scope_results_list", {"scope_id": scope, "wait_ms": 0, "limit": 3}))
            if read.get("ok") and "operation_id" in read["data"]:
                done = await call(session, "operation_get", {"operation_id": read["data"]["operation_id"], "wait_ms": 30000})
                show("operation_get of that read", done)
                receipts = (done.get("data") or {}).get("result", {}).get("results", [])
                print(f"  receipts read: {len(receipts)}; scope afterwards: "
                      f"{(await call(session, 'scope_status', {'scope_id': scope}))['data']['state']}")
            show("scope_remove", await call(session, "scope_remove", {"scope_id": scope}))
    await publish_demo(bin_dir, workspace, os.path.dirname(root))
    print("\ndemo finished: every call above went through a real MCP client session.")


async def publish_demo(bin_dir, workspace, demo_dir):
    """Publish a pipeline from the project shell, load it into a sandbox, and call it
    through the exporter the way the sandbox gateway launches it."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "MARSH_CONTROL_HOME": os.path.join(demo_dir, "control"),
        "SBX_SHIM_STATE": os.path.join(demo_dir, "sbx", "state.json"),
    }
    dev = StdioServerParameters(
        command=os.path.join(bin_dir, "marsh-mcp"),
        args=["serve", "--workspace", workspace, "--home", os.path.join(demo_dir, "home"),
              "--sbx", os.path.join(bin_dir, "sbx")],
        env=env, cwd=workspace,
    )
    async with stdio_client(dev) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            show("shell_run: mcp publish (inside the project shell)",
                 await call(session, "shell_run", {"command": "mcp publish shout --description 'Upper-cases its input' "
                                                             "--sandbox demo-box -- 'tr a-z A-Z'"}))
    gateway = StdioServerParameters(
        command=os.path.join(bin_dir, "sbx"),
        args=["mcp", "gateway-exec", "marsh-pub-shout", "--sandbox", "demo-box"],
        env=env, cwd=demo_dir,
    )
    async with stdio_client(gateway) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = await session.list_tools()
            print("\n=== the sandbox's view of marsh-pub-shout (export-serve)")
            print("  tools:", ", ".join(t.name for t in tools.tools))
            show("shout {input: 'published from the project shell'}",
                 await call(session, "shout", {"input": "published from the project shell"}))
            show("shell_run through the exporter (refused: not published)",
                 await call(session, "shell_run", {"command": "id"}))


if __name__ == "__main__":
    asyncio.run(main())
