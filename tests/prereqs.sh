#!/bin/sh
# First run: what `make demo` and `make test` need from the system, checked
# before anything is built.
#   bubblewrap       the stand-in project shell runs every command under bwrap
#   python3-venv     python3 with venv and ensurepip (Debian ships them apart) for the
#                    PyPI `mcp` client in target/py-venv
#   npm              `make test` only: the real Codex and Claude Code CLIs
# As root the missing packages are installed with apt-get; otherwise this stops at once
# with the one command to run.
# Usage: prereqs.sh demo|test  (any other goal checks nothing)
# PREREQS_BWRAP_DIRS (for the tests) replaces the directories searched for bwrap.
set -u
goal=${1:-}
case $goal in
  demo | test) ;;
  *) exit 0 ;;
esac

have_bwrap() {
  for dir in ${PREREQS_BWRAP_DIRS-/usr/bin /usr/local/bin /bin}; do
    [ -f "$dir/bwrap" ] && [ -x "$dir/bwrap" ] && return 0
  done
  return 1
}

# `import venv` alone passes on Debian without python3-venv; ensurepip (and its bundled
# pip wheel) is what `python3 -m venv` then lacks.
have_venv() {
  command -v python3 >/dev/null 2>&1 &&
    python3 -c 'import venv, ensurepip; ensurepip.version()' >/dev/null 2>&1
}

have_npm() {
  command -v npm >/dev/null 2>&1
}

check() {
  missing=
  have_bwrap || missing="$missing bubblewrap"
  have_venv || missing="$missing python3-venv"
  if [ "$goal" = test ]; then
    have_npm || missing="$missing npm"
  fi
  missing=${missing# }
}

check
[ -z "$missing" ] && exit 0

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "marsh-mcp: make $goal needs $missing; installing (apt-get, as root)" >&2
  export DEBIAN_FRONTEND=noninteractive
  # shellcheck disable=SC2086 # one word per package
  if ! { apt-get update && apt-get install -y $missing; }; then
    echo "marsh-mcp: apt-get install -y $missing failed; install them, then run make $goal again" >&2
    exit 1
  fi
  check
  [ -z "$missing" ] && exit 0
  echo "marsh-mcp: still missing after apt-get: $missing (bwrap must be in /usr/bin, /usr/local/bin or /bin; python3 is the first on PATH)" >&2
  exit 1
fi

if command -v apt-get >/dev/null 2>&1; then
  echo "marsh-mcp: make $goal needs missing packages ($missing); run: sudo apt-get install -y $missing" >&2
else
  echo "marsh-mcp: make $goal needs missing packages ($missing); install them with your system's package manager" >&2
fi
exit 1
