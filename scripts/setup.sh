#!/usr/bin/env bash
# Prepare a fresh Debian/Ubuntu machine (or this checkout again, cheaply):
# system packages where missing, a virtual environment in .venv, and the
# project with its dev dependencies installed editable. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

export PIP_CACHE_DIR="${PIP_CACHE_DIR:-$PWD/.cache/pip}"
PYTHON="${PYTHON:-python3}"

apt_install() {
    local missing=()
    for pkg in "$@"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
}

if ! "$PYTHON" -c "import venv, ensurepip" >/dev/null 2>&1; then
    apt_install python3-venv
fi
# Real Redis and mosquitto for the control plane's tests (started on free ports
# by the fixtures; their system services are not needed).
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || missing+=(mosquitto)
# The multi-site rig: iptables for its userspace delays where the kernel lacks netem.
command -v iptables >/dev/null 2>&1 || [ -x /usr/sbin/iptables ] || missing+=(iptables)
# The dashboard's browser test: headless Chromium driven by selenium.
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
# The native gRPC door: libnghttp2's headers and a C compiler.
[ -f /usr/include/nghttp2/nghttp2.h ] || missing+=(libnghttp2-dev)
command -v cc >/dev/null 2>&1 || missing+=(gcc)
if [ ${#missing[@]} -gt 0 ]; then
    apt_install "${missing[@]}"
fi
if [ "${EDGEPLEX_SETUP_BENCH:-0}" = 1 ] && ! command -v wrk >/dev/null 2>&1; then
    apt_install wrk
fi

if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
stamp=".venv/.edgeplex-installed"
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)"  # either changed: again
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    .venv/bin/python -m pip install -q --upgrade pip setuptools wheel
    # --no-compile: Python compiles what is imported, on first import (17 s of the
    # 38 this install took was pip compiling every module of every package).
    .venv/bin/python -m pip install -q --no-compile -e ".[dev]"
    # The tests speak as users' clients do, with Triton's current client. Its metadata
    # asks for protobuf < 7, which edgeplex's generated code (protobuf 7) rules out,
    # yet it works with protobuf 7 (the whole suite runs on it): it goes in without
    # its pins, with the HTTP client library it wants.
    .venv/bin/python -m pip install -q --no-deps "tritonclient==2.73.0"
    .venv/bin/python -m pip install -q "geventhttpclient>=2.3.3,<3"
    echo "$want" > "$stamp"
fi
# The native gRPC door's HTTP/2 session, rebuilt when its source changes.
native_stamp=".venv/.edgeplex-native"
native_want="$(sha256sum agent/frontdoor/_nghttp2.pyx scripts/build_native.py | sha256sum | cut -d' ' -f1)"
if ! ls agent/frontdoor/_nghttp2.*.so >/dev/null 2>&1 || [ ! -f "$native_stamp" ] \
    || [ "$(cat "$native_stamp")" != "$native_want" ]; then
    .venv/bin/python scripts/build_native.py
    echo "$native_want" > "$native_stamp"
fi
if [ "${EDGEPLEX_SETUP_BENCH:-0}" = 1 ] && [ ! -x .venv/bin/py-spy ]; then
    .venv/bin/python -m pip install -q py-spy  # bench/profile_agent.py
fi
