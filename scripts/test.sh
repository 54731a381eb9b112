#!/usr/bin/env bash
# Runs the whole test suite (README command 2). Installs what the tests need first
# (apt packages, npm packages), then runs `bun test` and ends with one line
# `N passed, N failed` (a skipped or todo test counts as failed: the suite has none). Extra arguments go to `bun test` (e.g. a path filter).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --test || { echo "0 passed, 1 failed"; exit 1; }
export PATH="$PWD/node_modules/.bin:$PATH" NODE_ENV=test
# VM tests boot the guest kernel and the base template: build both once per machine into a fixed
# cache dir (no-ops when cached; progress on stderr). A failure here shows up as failing VM tests.
vm_home="${AENV_TEST_HOME_PATH:-/var/lib/agentenv-test}"
mkdir -p "$vm_home"
flock "$vm_home/.build.lock" sh -c 'AENV_HOME_PATH="$1" bun src/cli/main.ts kernel build >/dev/null && AENV_HOME_PATH="$1" bun src/cli/main.ts template build-base >/dev/null' _ "$vm_home" \
  || echo "warning: guest kernel / base template build failed; VM tests will fail" >&2
log=$(mktemp)
bun test --timeout 60000 "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
num() { grep -E "^ *[0-9]+ $1\$" "$log" | tail -1 | awk '{print $1}'; }
p=$(num pass); f=$(num fail); s=$(num skip); t=$(num todo)
# a run that dies before its summary still counts as a failure
if [ -z "$p$f" ]; then f=1; fi
[ "$rc" -ne 0 ] && [ "${f:-0}" -eq 0 ] && f=1
rm -f "$log"
echo "${p:-0} passed, $(( ${f:-0} + ${s:-0} + ${t:-0} )) failed"
exit $rc
