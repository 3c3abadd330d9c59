#!/usr/bin/env python3
"""Vendors etcd's v3 API protos into proto/etcd/ from a checkout of etcd at a release tag.

    proto/etcd/vendor.py ETCD_CHECKOUT TAG

Each file keeps etcd's messages, fields, numbers, packages and services exactly, so the wire
format and the gRPC method paths are etcd's. Removed: the gogoproto imports and options (Go
code generation only), the google.api.http options and their import (the JSON gateway). A
header says where the file came from. Other options are refused, so a new kind is looked at
before it is dropped.
"""
import re
import subprocess
import sys
from pathlib import Path

FILES = [
    "api/mvccpb/kv.proto",
    "api/authpb/auth.proto",
    "api/etcdserverpb/rpc.proto",
    "server/etcdserver/api/v3lock/v3lockpb/v3lock.proto",
    "server/etcdserver/api/v3election/v3electionpb/v3election.proto",
]
DROPPED_IMPORTS = {'import "gogoproto/gogo.proto";', 'import "google/api/annotations.proto";'}
GOGO_OPTION = re.compile(r'^\s*option \(gogoproto\.[a-z_]+\) = (true|false);\s*$')
HTTP_OPTION = re.compile(r'^\s*option \(google\.api\.http\) = \{\s*$')


def strip(text, path):
    out, skipping = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if skipping:
            skipping = line.strip() != "};"
            continue
        if line.strip() in DROPPED_IMPORTS or GOGO_OPTION.match(line):
            continue
        if HTTP_OPTION.match(line):
            skipping = True
            continue
        if "option (" in line or "[(" in line:
            sys.exit(f"{path}:{number}: an option this script does not know: {line.strip()}")
        out.append(line)
    if skipping:
        sys.exit(f"{path}: a google.api.http option without its end")
    return "\n".join(out) + "\n"


def header(path, tag, commit):
    return (
        "// Vendored from etcd (https://github.com/etcd-io/etcd):\n"
        f"//   {path}\n"
        f"//   at tag {tag}, commit {commit}.\n"
        "// Copyright The etcd Authors. Licensed under the Apache License, Version 2.0\n"
        "// (http://www.apache.org/licenses/LICENSE-2.0), the license Keel is under too.\n"
        "// Changed for Keel by proto/etcd/vendor.py: the gogoproto and google.api.http imports\n"
        "// and options are removed (Go code generation and the JSON gateway only); messages,\n"
        "// fields, numbers, packages and services are etcd's, so the wire format is.\n\n"
    )


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    checkout, tag = Path(sys.argv[1]), sys.argv[2]
    git = ["git", "-C", str(checkout)]
    commit = subprocess.check_output(git + ["rev-parse", f"{tag}^{{commit}}"], text=True).strip()
    root = Path(__file__).resolve().parent
    for path in FILES:
        text = subprocess.check_output(git + ["show", f"{tag}:{path}"], text=True)
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(header(path, tag, commit) + strip(text, path))
        print(f"wrote {target.relative_to(root.parent.parent)}")


if __name__ == "__main__":
    main()
