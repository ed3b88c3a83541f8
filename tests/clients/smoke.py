#!/usr/bin/env python3
"""Black-box check with the real PyPI `mcp` client: prints one JSON summary line.

Usage: smoke.py MARSH_MCP_EXE ARGS...
"""

import asyncio
import json
import os
import sys

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client


async def main():
    params = StdioServerParameters(command=sys.argv[1], args=sys.argv[2:],
                                   env={"PATH": "/usr/bin:/bin", "HOME": os.environ["HOME"]})
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            tools = await session.list_tools()
            run = await session.call_tool("shell_run", {"command": "echo from-python-client"})
            bad = await session.call_tool("shell_run", {"command": "true", "cwd": "/"})
            print(json.dumps({
                "server": init.server_info.name,
                "tools": [t.name for t in tools.tools],
                "run": run.structured_content,
                "bad_is_error": bad.is_error,
                "bad": bad.structured_content,
            }))


asyncio.run(main())
