#!/usr/bin/env bash
# Regenerates src/cluster/proto/gen/scheduler.ts from scheduler.proto with buf + ts-proto from
# node_modules (no protoc download). Run after editing the .proto; commit the output.
set -euo pipefail
cd "$(dirname "$0")"
export PATH="$PWD/../../../node_modules/.bin:$PATH"
buf generate
