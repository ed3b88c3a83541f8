#!/usr/bin/env python3
"""`make demo`: a real MCP client session (the PyPI `mcp` client) against `marsh-mcp serve`.

Usage: demo.py PREFIX_BIN WORKSPACE SCOPE_ROOT

Starts `PREFIX_BIN/marsh-mcp serve` on stdio with the stand-in marsh/sbx from the same
prefix, exercises the main tools and prints each result readably.

Every step says what it expects: most must succeed (some with a given state or exit code),
a few are refusals the demo shows on purpose (marked "expected refusal"). A step that does
not answer as expected, or a crash, is a failure: the demo carries on where it can, then
names every failed step on its last line and exits 1.
"""

import asyncio
import json
import os
import sys
import textwrap
import traceback

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client


# Every step the demo shows, and the ones that did not answer as expected.
STEPS = []
FAILED = []


def fail(title, why):
    print(f"  FAILED: {why}")
    FAILED.append(f"{title} ({why})")


def show(title, envelope, refused=None, **want):
    """Print a step's result and check it: `refused=KIND` expects an `ok:false` of that
    kind (a refusal shown on purpose); otherwise the call must answer `ok:true` and every
    `want` field of `data` must have the given value."""
    print(f"\n=== {title}")
    STEPS.append(title)
    print(textwrap.indent(envelope.get("_text", "").rstrip("\n"), "  | "))
    if not envelope.get("ok"):
        err = envelope.get("error") or {}
        if refused is None:
            fail(title, f"ok:false {err.get('kind')}")
        elif err.get("kind") != refused:
            fail(title, f"refused as {err.get('kind')}, expected {refused}")
        else:
            print("  (expected refusal)")
        return envelope
    data = envelope.get("data") or {}
    if "stdout_base64" in data and data.get("stdout_text_state") == "lossy":
        print(f"  stdout_base64 (authoritative bytes): {data['stdout_base64']}")
    if refused is not None:
        fail(title, f"answered ok:true, expected a {refused} refusal")
    for key, value in want.items():
        if data.get(key) != value:
            fail(title, f"{key} is {data.get(key)!r}, expected {value!r}")
    return envelope


def data(envelope):
    """The `data` of a successful answer, else {} (the step already counted as failed)."""
    return (envelope.get("data") or {}) if envelope.get("ok") else {}


def skip(title, because):
    print(f"\n=== {title}\n  skipped: {because}")


async def call(session, name, args=None):
    result = await session.call_tool(name, args or {})
    envelope = dict(result.structured_content or {"ok": False, "error": {"kind": "no structuredContent"}})
    # The readable text the server writes for whoever shows `content` to a model.
    envelope["_text"] = result.content[0].text if result.content else ""
    return envelope


async def server_demo():
    """The main tools through `serve`; False when the server is not healthy (nothing else would work)."""
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
            print("instructions (what the agent reads first):")
            print(textwrap.indent(textwrap.fill(init.instructions or "", 100), "  | "))

            doctor = show("doctor", await call(session, "doctor"), healthy=True)
            for check in data(doctor).get("checks", []):
                if check.get("name") == "isolation":
                    print(f"  sandbox: {check.get('detail')}")
                if not check.get("ok"):
                    print(f"  FAIL {check.get('name')}: {check.get('detail')}")
            if not data(doctor).get("healthy"):
                print("\nthe server is not healthy (see the failed checks above): stopping here")
                return False
            show("shell_run: where am I, who am I", await call(session, "shell_run", {"command": "pwd; id -un; uname -s"}),
                 state="succeeded")
            show("shell_run: bash, and a $HOME kept per scope (caches survive stop and reset)",
                 await call(session, "shell_run", {"command":
                     "echo \"bash $BASH_VERSION\"; [[ -d $HOME ]] && date +%s > ~/.demo-stamp && ls -A ~"}),
                 state="succeeded")
            show("shell_run: separate streams and a nonzero exit (its own result: state exited)",
                 await call(session, "shell_run", {"command": "echo to-stdout; echo to-stderr >&2; exit 3"}),
                 state="exited", exit_code=3)
            show("shell_run: long output shows its head and its tail (max_bytes=200)",
                 await call(session, "shell_run", {"command": "seq 1 5000; echo the last line >&2", "max_bytes": 200}),
                 state="succeeded")
            show("shell_run: bytes that are not UTF-8", await call(session, "shell_run", {"command": r"printf 'ok \377\376'"}),
                 state="succeeded", stdout_text_state="lossy")
            show("shell_run: the sandbox hides the scope root", await call(session, "shell_run", {"command": f"ls {root} 2>&1; echo exit=$?"}),
                 state="succeeded")
            show("shell_run: no host privilege (set-id bits, kernel settings, processes)",
                 await call(session, "shell_run", {"command":
                     "chmod u+s README.txt 2>&1; (echo x > /proc/sys/kernel/core_pattern) 2>&1; "
                     "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; ps -e | wc -l"}), state="succeeded")
            show("status", await call(session, "status"), state="ready")
            listed = show("results_list (newest 3)", await call(session, "results_list", {"limit": 3}))
            results = data(listed).get("results") or []
            for r in results:
                print(f"    {r['id'][:8]}  exit={r['exit_code']}  {r['command']!r}")
            if results:
                first = results[0]["id"]
                got = show(f"result_get {first[:8]}", await call(session, "result_get", {"selector": first[:8]}))
                result = data(got).get("result") or {}
                print(f"    command={result.get('command')!r} duration_ms={result.get('duration_ms')}")
            elif listed.get("ok"):
                fail("results_list (newest 3)", "no results, though the commands above ran")
                skip("result_get", "results_list returned no result to read")
            else:
                skip("result_get", "results_list failed")

            started = show("shell_run: a long command yields (wait_ms=300)",
                           await call(session, "shell_run", {"command": "for i in 1 2 3; do echo tick $i; sleep 0.4; done", "wait_ms": 300}))
            op = data(started).get("operation_id")
            if op:
                since = data(started).get("next_seq", 0)
                show("operation_get wait_ms=5000", await call(session, "operation_get", {"operation_id": op, "wait_ms": 5000}),
                     state="succeeded")
                show(f"operation_output since_seq={since}", await call(session, "operation_output", {"operation_id": op, "since_seq": since}))
            else:
                skip("operation_get, operation_output", "the long command did not start")

            long = show("shell_run: a sleeping command in the background (wait_ms=0)",
                        await call(session, "shell_run", {"command": "sleep 60", "wait_ms": 0}))
            if data(long).get("operation_id"):
                show("operation_cancel of a sleeping command",
                     await call(session, "operation_cancel", {"operation_id": data(long)["operation_id"]}))
            else:
                skip("operation_cancel", "the sleeping command did not start")
            show("shell_run: timeout_ms=200", await call(session, "shell_run", {"command": "sleep 30", "timeout_ms": 200}),
                 state="timed_out")
            show("operation_list: this session's operations", await call(session, "operation_list", {"limit": 4}))
            show("prewarm all", await call(session, "prewarm", {"selection": "all"}), state="succeeded")
            show("qualify without --allow-full-sbx-control", await call(session, "qualify", {"gate": "source"}),
                 refused="disabled")
            show("invalid argument (unknown field)", await call(session, "shell_run", {"command": "true", "cwd": "/"}),
                 refused="invalid_argument")

            started = show("scope_start: a private scope over the same workspace", await call(session, "scope_start"),
                           state="succeeded")
            scope = data(started).get("scope_id")
            if not scope:
                skip("scope_run, scope_stop, scope_remove", "no scope was started")
                return True
            print(f"  scope_id: {scope}")
            show("scope_run in the new scope", await call(session, "scope_run", {"scope_id": scope, "command": "echo from the private scope; pwd"}),
                 state="succeeded")
            listed = show("scope_list", await call(session, "scope_list"))
            for s in data(listed).get("scopes", []):
                print(f"    {s['scope_id']:<36}  {s['state']}")
            show("scope_stop", await call(session, "scope_stop", {"scope_id": scope}), state="succeeded")
            show("scope_status after stop", await call(session, "scope_status", {"scope_id": scope}), state="stopped")
            show("scope_run on a stopped scope", await call(session, "scope_run", {"scope_id": scope, "command": "true"}),
                 refused="scope_not_ready")
            # Reading a stopped scope boots it, reads, then exactly stops it: an operation.
            read = show("scope_results_list of a stopped scope (wait_ms 0: an operation)",
                        await call(session, "scope_results_list", {"scope_id": scope, "wait_ms": 0, "limit": 3}))
            # Still running: the operation is nested and `results` comes later through operation_get.
            pending = data(read).get("operation") if "results" not in data(read) else None
            if pending:
                print(f"  operation {pending['operation_id']}: {pending['state']}")
                done = show("operation_get of that read",
                            await call(session, "operation_get", {"operation_id": pending["operation_id"], "wait_ms": 30000}),
                            state="succeeded")
                receipts = (data(done).get("result") or {}).get("results", [])
            else:
                receipts = data(read).get("results", [])
            after = await call(session, "scope_status", {"scope_id": scope})
            print(f"  receipts read: {len(receipts)}; scope afterwards: {data(after).get('state')}")
            show("scope_remove", await call(session, "scope_remove", {"scope_id": scope}), state="succeeded")
    return True


async def demo():
    bin_dir, workspace, root = sys.argv[1:4]
    if await server_demo():
        await publish_demo(bin_dir, workspace, os.path.dirname(root))


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
            published = await call(session, "shell_run", {
                "command": "mcp publish shout --description 'Upper-cases its input' "
                           "--sandbox demo-box -- 'tr a-z A-Z'"})
            show("shell_run: mcp publish (inside the project shell)", published, state="succeeded")
    # The stock server's name carries the publisher key of this workspace and home.
    server = json.loads(published["data"]["stdout_text"].strip())["server"]
    gateway = StdioServerParameters(
        command=os.path.join(bin_dir, "sbx"),
        args=["mcp", "gateway-exec", server, "--sandbox", "demo-box"],
        env=env, cwd=demo_dir,
    )
    async with stdio_client(gateway) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = await session.list_tools()
            print(f"\n=== the sandbox's view of {server} (export-serve)")
            print("  tools:", ", ".join(t.name for t in tools.tools))
            show("shout {input: 'published from the project shell'}",
                 await call(session, "shout", {"input": "published from the project shell"}), outcome="success")
            show("shell_run through the exporter (refused: not published)",
                 await call(session, "shell_run", {"command": "id"}), refused="not_found")


def run():
    try:
        asyncio.run(demo())
    except BaseException as e:  # the session or a step crashed: report it with the rest
        traceback.print_exc()
        while getattr(e, "exceptions", None):  # a task group's: name the first cause
            e = e.exceptions[0]
        FAILED.append(f"crash: {type(e).__name__}: {e}")
    if FAILED:
        print(f"\ndemo FAILED: {len(FAILED)} step(s) of {len(STEPS)} did not answer as expected: {'; '.join(FAILED)}")
        sys.exit(1)
    print(f"\ndemo finished: all {len(STEPS)} steps answered as expected, each through a real MCP client session.")


if __name__ == "__main__":
    run()
