#!/usr/bin/env bash
# README command 1: on a fresh Debian 12 host (as root), install what AgentENV needs, build the
# guest kernel and the base template if they are missing (progress on stderr), then start the
# node (API + sandbox proxy, default 0.0.0.0:8000) in the foreground; it prints the API URL and
# the API key. Ctrl-C stops it (running sandboxes are killed; see [orchestrator] shutdown_action).
# Environment: AENV_HOME_PATH (data dir, default /var/lib/agentenv), AENV_API_ADDR, AENV_API_KEY,
# AENV_CONFIG_PATH (an operator config file), or pass `--config FILE` / `--addr HOST:PORT`.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "start.sh: run as root (VMs, network namespaces, FUSE)" >&2; exit 1; }
bash scripts/install.sh
export PATH="$PWD/node_modules/.bin:$PWD/.tools/node_modules/.bin:$PATH"
# the builds read the same config: take --config FILE from the arguments for them too
cfg=()
prev=""
for a in "$@"; do
  [ "$prev" = "--config" ] && cfg=(--config "$a")
  case "$a" in --config=*) cfg=(--config "${a#--config=}") ;; esac
  prev="$a"
done
echo "== guest kernel (built once, cached under the data dir)" >&2
bun src/cli/main.ts kernel build "${cfg[@]}" >&2
echo "== base template (built once, cached)" >&2
bun src/cli/main.ts template build-base "${cfg[@]}" >&2
echo "== starting the node" >&2
exec bun src/cli/main.ts server "$@"
