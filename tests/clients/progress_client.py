#!/usr/bin/env python3
"""Progress with the real PyPI `mcp` client: a shell_run that waits inline with a
progress callback; prints one JSON summary line (the progress seen and the result).

Usage: progress_client.py MARSH_MCP_EXE ARGS...
"""

import asyncio
import json
import os
import sys
import time

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client


async def main():
    params = StdioServerParameters(command=sys.argv[1], args=sys.argv[2:],
                                   env={"PATH": "/usr/bin:/bin", "HOME": os.environ["HOME"]})
    seen = []
    start = time.monotonic()

    async def on_progress(progress, total, message):
        seen.append({"progress": progress, "total": total, "message": message,
                     "at_ms": round((time.monotonic() - start) * 1000)})

    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            start = time.monotonic()
            run = await session.call_tool(
                "shell_run", {"command": "sleep 3; echo done", "wait_ms": 10000},
                progress_callback=on_progress)
            answered_ms = round((time.monotonic() - start) * 1000)
            # Nothing for this call may follow its answer.
            count_at_answer = len(seen)
            await asyncio.sleep(1.5)
            print(json.dumps({
                "progress": seen,
                "count_at_answer": count_at_answer,
                "answered_ms": answered_ms,
                "run": run.structured_content,
            }))


asyncio.run(main())
