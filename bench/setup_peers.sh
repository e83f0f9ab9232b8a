#!/usr/bin/env bash
# Install the proxies bench/proxy_overhead.py compares ragproxy with, each in its
# own environment under a cache directory: never a run-time dependency of ragproxy.
#
#   bash bench/setup_peers.sh              # both, at the pinned versions
#   bash bench/setup_peers.sh litellm      # one of them
#   LITELLM_VERSION=1.91.5 bash bench/setup_peers.sh litellm
#
#   LiteLLM proxy     pip install "litellm[proxy]==$LITELLM_VERSION" into its own venv
#                     ($CACHE/peers/litellm-$LITELLM_VERSION/venv)
#   Portkey gateway   npm install "@portkey-ai/gateway@$PORTKEY_VERSION" into its own prefix
#                     ($CACHE/peers/portkey-$PORTKEY_VERSION), run with node
#
# CACHE is $RAGPROXY_BENCH_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/ragproxy-bench;
# proxy_overhead.py finds the peers there (same variables, same pins) and reports
# a side it cannot find as absent.  Each install writes the version it got to
# $CACHE/peers/<name>.json.  Re-running is quick: an install already there is kept.
#
# The LiteLLM pin is the version the issue-20 table was measured with (LiteLLM
# releases have been compromised on PyPI before: pin, and never install a peer
# into an environment that holds anything of value).
set -euo pipefail

LITELLM_VERSION="${LITELLM_VERSION:-1.91.1}"
PORTKEY_VERSION="${PORTKEY_VERSION:-1.15.2}"
CACHE="${RAGPROXY_BENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ragproxy-bench}"
PYTHON="${PYTHON:-python3}"
PEERS="$CACHE/peers"
mkdir -p "$PEERS"

want="${*:-litellm portkey}"

install_litellm() {
    local dir="$PEERS/litellm-$LITELLM_VERSION"
    local py="$dir/venv/bin/python"
    if [ ! -x "$dir/venv/bin/litellm" ]; then
        echo "installing litellm[proxy]==$LITELLM_VERSION into $dir/venv" >&2
        rm -rf "$dir"
        "$PYTHON" -m venv "$dir/venv"
        "$py" -m pip install --quiet --disable-pip-version-check "litellm[proxy]==$LITELLM_VERSION"
    fi
    # A .pth file runs code at every interpreter start: the way a poisoned
    # release once hid itself.  Say so loudly if one is there beyond the usual.
    "$py" - <<'EOF'
import glob, os, sys, sysconfig
site = sysconfig.get_paths()["purelib"]
usual = {"distutils-precedence.pth", "_virtualenv.pth"}
odd = [p for p in glob.glob(os.path.join(site, "*.pth")) if os.path.basename(p) not in usual]
for p in odd:
    print("WARNING: unexpected .pth file in the LiteLLM venv: " + p, file=sys.stderr)
EOF
    local got
    got="$("$py" -c 'import importlib.metadata as m; print(m.version("litellm"))')"
    printf '{"name": "litellm", "version": "%s", "python": "%s", "exe": "%s", "command": "%s"}\n' \
        "$got" "$("$py" -c 'import platform; print(platform.python_version())')" "$dir/venv/bin/litellm" \
        "$dir/venv/bin/litellm --config CONFIG --port PORT --num_workers 1" > "$PEERS/litellm.json"
    echo "litellm $got: $dir/venv/bin/litellm"
}

install_portkey() {
    local dir="$PEERS/portkey-$PORTKEY_VERSION"
    local entry="$dir/node_modules/@portkey-ai/gateway/build/start-server.js"
    command -v node >/dev/null || { echo "portkey: node is not installed" >&2; return 1; }
    if [ ! -f "$entry" ]; then
        echo "installing @portkey-ai/gateway@$PORTKEY_VERSION into $dir" >&2
        rm -rf "$dir"
        mkdir -p "$dir"
        npm install --prefix "$dir" --no-audit --no-fund --silent "@portkey-ai/gateway@$PORTKEY_VERSION"
    fi
    local got
    got="$(node -p "require('$dir/node_modules/@portkey-ai/gateway/package.json').version")"
    printf '{"name": "portkey", "version": "%s", "node": "%s", "exe": "%s", "command": "%s"}\n' \
        "$got" "$(node --version)" "$entry" "node $entry --port=PORT --headless" > "$PEERS/portkey.json"
    echo "portkey gateway $got: node $entry"
}

for name in $want; do
    case "$name" in
        litellm) install_litellm ;;
        portkey) install_portkey ;;
        *) echo "unknown peer: $name (litellm, portkey)" >&2; exit 2 ;;
    esac
done
