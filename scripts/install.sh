#!/usr/bin/env bash
# Idempotent install of everything AgentENV needs on a Debian 12 host: Debian packages
# (QEMU, iproute2, iptables, kernel build tools, mmdebstrap, docker-registry, ...) and the
# npm packages (Bun itself comes from npm, pinned in package.json).
#   --test   also install what only the tests need
set -euo pipefail
cd "$(dirname "$0")/.."
want_test=0
[ "${1:-}" = "--test" ] && want_test=1

# Debian packages, one list per purpose; each subsystem adds its own.
pkgs=(iproute2 iptables ca-certificates)
# VMM + guest kernel + base template (src/vmm, src/template): QEMU microvm, Debian kernel source
# and its build tools, mmdebstrap, ext4 tools, nsenter (util-linux).
pkgs+=(qemu-system-x86 linux-source-6.1 build-essential bc bison flex libelf-dev libssl-dev mmdebstrap e2fsprogs xz-utils util-linux)
[ "$want_test" = 1 ] && pkgs+=()
# overlaybd tests (test/storage/overlaybd): a real OCI registry, openssl for its token cert, XFS for reflinks.
[ "$want_test" = 1 ] && pkgs+=(docker-registry openssl xfsprogs)
# Template builds from registry images (src/image): skopeo pulls, umoci unpacks, zstd layers.
pkgs+=(skopeo umoci zstd)
# The tools drive (src/tools): static busybox, ss (iproute2, above) and curl with their
# libraries, rewritten to the drive's loader by patchelf.
pkgs+=(busybox-static curl patchelf)
# Tests: procps (ps, pgrep). The kernel boot test rootfs uses the static busybox above.
[ "$want_test" = 1 ] && pkgs+=(procps)
# cluster tests (test/services): the scheduler's shared Redis store against a real redis-server.
[ "$want_test" = 1 ] && pkgs+=(redis-server)
# egress tests (test/e2e/egress.test.ts): a SOCKS5 server with username/password auth.
[ "$want_test" = 1 ] && pkgs+=(microsocks)
# disk benchmark (bench/disk.ts): fio.
[ "$want_test" = 1 ] && pkgs+=(fio)
# console browser tests (test/console): Debian's Chromium, driven by playwright-core (no browser download);
# zsh for the shell completion tests (test/cli).
[ "$want_test" = 1 ] && pkgs+=(chromium zsh)

# npm installs Bun itself (below); Debian's nodejs/npm when the host has no npm yet.
command -v npm >/dev/null 2>&1 || pkgs+=(nodejs npm)

missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing Debian packages: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

# Bun from npm (its postinstall links the real binary), then the rest with bun from bun.lock.
if ! .tools/node_modules/.bin/bun --version >/dev/null 2>&1; then
  echo "installing bun from npm" >&2
  mkdir -p .tools
  echo '{"private":true,"allowScripts":{"bun":true}}' > .tools/package.json
  npm install --prefix .tools --no-audit --no-fund --silent bun@1.4.4 >&2
fi
.tools/node_modules/.bin/bun install --frozen-lockfile >&2
# `bun run agentenv ...` (README) needs bun on PATH: link the pinned one unless a bun is there.
if ! command -v bun >/dev/null 2>&1; then
  ln -sf "$PWD/.tools/node_modules/.bin/bun" /usr/local/bin/bun 2>/dev/null \
    && echo "linked /usr/local/bin/bun -> $PWD/.tools/node_modules/.bin/bun" >&2 \
    || echo "note: bun is not on PATH; use $PWD/node_modules/.bin/bun" >&2
fi
