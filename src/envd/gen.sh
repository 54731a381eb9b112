#!/usr/bin/env bash
# Regenerates src/envd/gen/*_pb.ts from src/envd/proto/*.proto with buf + protoc-gen-es from
# node_modules (no protoc download). Run after editing a .proto; commit the output.
set -euo pipefail
cd "$(dirname "$0")"
export PATH="$PWD/../../node_modules/.bin:$PATH"
buf generate
