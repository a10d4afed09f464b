#!/bin/bash
# Packs this machine's `perf` with the libraries it links (libc's own left out) into
# DIR/perf.tar.xz, for `gpu_decode.sh perf` on the device machine, which has no perf
# (docs/gpu.md). Needs Debian's linux-perf here: apt-get install linux-perf.
set -euo pipefail
dir="${1:-.gpu/perfx}"
bin="$(command -v perf)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/lib" "$dir"
cp "$bin" "$tmp/perf"
ldd "$bin" | awk '/=>/ {print $3}' | while read -r lib; do
  case "$(basename "$lib")" in
  libc.so* | libm.so* | libpthread* | libdl* | ld-linux*) ;;
  *) cp -L "$lib" "$tmp/lib/" ;;
  esac
done
tar -C "$tmp" -cJf "$dir/perf.tar.xz" .
echo "packed $bin into $dir/perf.tar.xz ($(du -h "$dir/perf.tar.xz" | cut -f1))"
