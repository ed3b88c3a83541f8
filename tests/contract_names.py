#!/usr/bin/env python3
"""Every test that contract/CONTRACT.md names must exist.

Reads the last column of each contract row and resolves each backticked name against
the test lists of the built test binaries (each binary's own `--list`), so a renamed
or deleted test fails `make test` instead of leaving a case without proof. Names:
  crate_name::module::tests::test   a unit test of that crate's library
  module::test                      the black-box suite (`suite::module::test` of
                                    marsh-tests' single test binary)
  path/to/tests/file.rs [name ...]  an integration test binary, then tests in it
Usage: contract_names.py [CARGO]   (run from the repository root, after a build)
"""
import json
import re
import subprocess
import sys

cargo = sys.argv[1] if len(sys.argv) > 1 else "cargo"
built = subprocess.run(
    [cargo, "test", "--workspace", "--no-run", "--message-format=json"],
    check=True, capture_output=True, text=True,
).stdout

# (kind, key) -> set of test names: ("lib", crate_name) or ("file", src path suffix).
binaries = {}
for line in built.splitlines():
    msg = json.loads(line)
    if msg.get("reason") != "compiler-artifact" or not msg.get("profile", {}).get("test"):
        continue
    exe, target = msg.get("executable"), msg["target"]
    if not exe:
        continue
    listed = subprocess.run([exe, "--list", "--format", "terse"], check=True,
                            capture_output=True, text=True).stdout
    names = {l[: -len(": test")] for l in listed.splitlines() if l.endswith(": test")}
    if "lib" in target["kind"]:
        binaries[("lib", target["name"].replace("-", "_"))] = names
    else:
        binaries[("file", target["src_path"])] = names

libs = {key for kind, key in binaries if kind == "lib"}
suite = next((names for (kind, key), names in binaries.items()
              if kind == "file" and key.endswith("tests/tests/all.rs")), set())


def file_binary(path):
    for (kind, key), names in binaries.items():
        if kind == "file" and key.endswith("/" + path):
            return names
    return None


resolved, missing = 0, []
with open("contract/CONTRACT.md", encoding="utf-8") as contract:
    for line in contract:
        if not line.startswith("|") or line.startswith(("| #", "| ---")):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        case, current = cells[0], None
        for name in re.findall(r"`([^`]+)`", cells[-1]):
            if "/" in name:
                current = file_binary(name)
                ok = current is not None
            elif "::" in name:
                crate, _, rest = name.partition("::")
                ok = (rest in binaries[("lib", crate)]) if crate in libs else (
                    "suite::" + name in suite)
            else:
                ok = current is not None and name in current
            if ok:
                resolved += 1
            else:
                missing.append(f"case {case}: {name}")

for m in missing:
    print(f"contract names a test that does not exist: {m}", file=sys.stderr)
print(f"contract: {resolved} test names resolve, {len(missing)} do not")
sys.exit(1 if missing else 0)
