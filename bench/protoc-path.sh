#!/usr/bin/env bash
# Prints the path of the protoc binary that the protoc-bin-vendored crate ships for this
# machine (the one keel-proto builds with), so that etcd-client's build script can use it:
#   PROTOC=$(bench/protoc-path.sh) cargo build -p keel-bench --features etcd
# Needs only cargo and python3; fetches the crate if it is not in the cargo cache yet.
set -euo pipefail
cd "$(dirname "$0")/.."
case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) suffix=linux-x86_64 ;;
  Linux-aarch64) suffix=linux-aarch_64 ;;
  Darwin-arm64) suffix=macos-aarch_64 ;;
  Darwin-x86_64) suffix=macos-x86_64 ;;
  *) echo "protoc-path.sh: no vendored protoc for $(uname -s)-$(uname -m); install protoc and set PROTOC" >&2; exit 1 ;;
esac
cargo metadata --format-version 1 2>/dev/null | python3 -c '
import json, os, sys
suffix = sys.argv[1]
for package in json.load(sys.stdin)["packages"]:
    if package["name"] == "protoc-bin-vendored-" + suffix:
        path = os.path.join(os.path.dirname(package["manifest_path"]), "bin", "protoc")
        if os.path.exists(path):
            os.chmod(path, 0o755)
            print(path)
            sys.exit(0)
sys.exit("protoc-path.sh: protoc-bin-vendored-%s is not in the cargo cache; run cargo fetch" % suffix)
' "$suffix"
