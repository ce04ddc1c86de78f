#!/usr/bin/env python3
"""Checks the declared minimum Rust version (`rust-version` in Cargo.toml) against what the
code and its dependencies need, on a machine with one (newer) toolchain:

- the dependencies: every package the library builds with (all its public features, on
  Linux) declares a `rust-version` no newer than ours, as the lockfile resolves them;
- the standard library: clippy's `incompatible_msrv` lint (on in CI's clippy runs) flags any
  std item stabilised after our `rust-version`.

What neither covers is syntax stabilised after it; the crate uses edition 2021 and nothing
newer than what the lint knows. Tests, benches and examples may need a newer toolchain (their
dev-dependencies): that figure is printed, not enforced.

Usage: python3 .ci/msrv.py   (from the repository root)
"""
import json
import subprocess
import sys

FEATURES = "tls,serde,metrics,codec"  # every feature a user may turn on


def version(v):
    return tuple(int(x) for x in v.split(".")) + (0,) * (3 - len(v.split(".")))


def show(v):
    return ".".join(map(str, v)).removesuffix(".0") if v[2] == 0 else ".".join(map(str, v))


def metadata():
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked",
         "--filter-platform", "x86_64-unknown-linux-gnu", "--features", FEATURES],
        check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(out)


def closure(m, root, with_dev):
    nodes = {n["id"]: n for n in m["resolve"]["nodes"]}
    seen, stack = set(), [root]
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        for d in nodes[i]["deps"]:
            kinds = [k["kind"] for k in d["dep_kinds"]]
            dev_only = all(k == "dev" for k in kinds)
            if dev_only and not (with_dev and i == root):
                continue
            stack.append(d["pkg"])
    return seen


def main():
    m = metadata()
    pkgs = {p["id"]: p for p in m["packages"]}
    root = next(p for p in m["packages"] if p["name"] == "cohort-net")
    ours = version(root["rust_version"])
    worst = {}
    for with_dev in (False, True):
        need = max(
            (version(pkgs[i]["rust_version"]), pkgs[i]["name"], pkgs[i]["version"])
            for i in closure(m, root["id"], with_dev)
            if i != root["id"] and pkgs[i].get("rust_version")
        )
        worst[with_dev] = need
    lib, dev = worst[False], worst[True]
    print(f"declared rust-version: {show(ours)}")
    print(f"the library (features: {FEATURES}) needs {show(lib[0])} ({lib[1]} {lib[2]})")
    print(f"tests, benches and examples need {show(dev[0])} ({dev[1]} {dev[2]})")
    if lib[0] > ours:
        print(f"rust-version {show(ours)} is not true: {lib[1]} {lib[2]} needs {show(lib[0])}",
              file=sys.stderr)
        return 1
    if lib[0] < ours:
        print(f"note: the dependencies allow {show(lib[0])}; the code's own needs set {show(ours)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
