#!/usr/bin/env bash
# The many-core figures of docs/benchmarks.md in one run, from binaries built beforehand:
#
#   bash benches/many_core.sh prepare        # here: release bench binaries into target/many-core
#   bash benches/many_core.sh run OUT [MIN]  # there: every figure into OUT, in about MIN minutes
#
# `prepare` builds the throughput bench, `examples/msg_cost` and `examples/ping_pong` (release)
# and copies them to target/many-core/, so that a machine with many cores needs nothing but
# that folder and this script: no toolchain, no network. `run` records the machine (nproc,
# lscpu, the kernel), then, interleaved so that cohort and its baselines share the machine's
# moods:
#   - benches/throughput.rs: 1→1, 4→1 and 8→1 at 64 B and 1 KiB, fresh payloads, cohort with
#     `on_message` and `on_message_ref` beside raw TCP (rates and CPU per message), twice;
#   - examples/msg_cost: the process's CPU time per message, 1, 4, 8 and 16 senders, 64 B and
#     1 KiB, both handlers, `send_slice` from a reused buffer, and raw TCP, three rounds;
#   - examples/msg_cost --idle: the CPU and wake-ups of 2 and 9 quiet nodes (the 9 with their
#     links out of step), three rounds (about 40 s more than MIN);
#   - examples/ping_pong: the round trip (min / p50 / p99 / p99.9) with the defaults, with
#     a 50 µs spin, with no spin (`Block`), with the defaults and round trips 200 µs apart,
#     with the defaults and both members journalled (fsync `Never`, then `Interval`),
#     journalled (`Never`) with no spin, and as requests and replies (`--request`) with the
#     defaults, back to back and 200 µs apart, raw TCP beside each, with each member's spin
#     stand-downs and driven turns and where the round trips' time went (`--stages`: the
#     request's way, the reply's send, the reply's way, per band of round-trip time; its
#     notes cost pong two clock readings per round trip, and each request is a payload of
#     its own), three rounds.
# Each step's output goes to its own file in OUT; OUT/summary.txt gathers the summary lines.
# MIN (default 6) scales the criterion measurement time to fit a lent machine's time limit.
# MANY_CORE_SMOKE=1 runs every step once, briefly (criterion's test mode, small counts): what
# CI runs so that the script keeps working between the runs that matter.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=target/many-core

prepare() {
  cargo build --release --example msg_cost --example ping_pong
  local bench
  bench=$(cargo bench --bench throughput --no-run 2>&1 \
    | sed -n 's/.*Executable benches\/throughput.rs (\(.*\))/\1/p' | tail -1)
  [ -n "$bench" ] || { echo "no throughput bench binary found" >&2; exit 1; }
  mkdir -p "$dir"
  cp "$bench" "$dir/throughput"
  local examples="${CARGO_TARGET_DIR:-target}/release/examples"
  cp "$examples/msg_cost" "$examples/ping_pong" "$dir/"
  # Without debug info (symbols stay, for a profile there): a lent machine takes the folder
  # with the working tree, 64 MiB in all.
  if command -v strip >/dev/null; then
    strip --strip-debug "$dir/throughput" "$dir/msg_cost" "$dir/ping_pong"
  fi
  git rev-parse HEAD > "$dir/commit" 2>/dev/null || echo unknown > "$dir/commit"
  ls -l "$dir"
}

run() {
  local out=$1 minutes=${2:-6}
  mkdir -p "$out"
  for b in throughput msg_cost ping_pong; do
    [ -x "$dir/$b" ] || { echo "$dir/$b missing: run 'prepare' first" >&2; exit 1; }
  done
  {
    echo "commit $(cat "$dir/commit")"
    echo "nproc $(nproc)"
    uname -sr
    lscpu 2>/dev/null | grep -E 'Model name|^CPU\(s\)|Thread|Socket|NUMA node\(s\)' || true
    free -g 2>/dev/null | head -2 || true
  } > "$out/machine.txt"
  # Criterion's measurement time per benchmark: 18 benchmarks, twice, in about half of MIN.
  local measure=$(( minutes * 60 / 2 / 36 ))
  [ "$measure" -ge 1 ] || measure=1
  local groups='throughput_(1to1|4to1|8to1)_(64B|1KiB)/(cohort_fresh|cohort_lent_fresh|raw_tcp_fresh)$'
  local timing=(--warm-up-time 1 --measurement-time "$measure") rounds=(1 2 3) scale=1 trips=20000
  local quiet=5
  if [ "${MANY_CORE_SMOKE:-0}" = 1 ]; then
    timing=(--test) rounds=(1) scale=500 trips=200 quiet=0.5
  fi
  for round in "${rounds[@]:0:2}"; do
    "$dir/throughput" --bench "$groups" "${timing[@]}" > "$out/throughput.$round.txt" 2>&1
  done
  local cases=() s n
  for s in 64 1024; do
    for n in 1 4 8 16; do
      cases+=("--senders $n --size $s --fresh" "--senders $n --size $s --fresh --lent" \
        "--senders $n --size $s --slice" "--senders $n --size $s --fresh --raw")
    done
  done
  for round in "${rounds[@]}"; do
    for c in "${cases[@]}"; do
      local count=$(( 10000000 / scale ))
      [[ $c == *"--size 1024"* ]] && count=$(( 2000000 / scale ))
      # shellcheck disable=SC2086 # the case's flags are words
      echo "$round | $c | $("$dir/msg_cost" --count $count $c 2>&1 | tail -1)" >> "$out/msg_cost.txt"
    done
    # A quiet cluster: 2 and 9 nodes left connected with nothing to send.
    for c in "--senders 1" "--senders 8 --stagger"; do
      # shellcheck disable=SC2086 # the case's flags are words
      echo "$round | $c --idle $quiet | $("$dir/msg_cost" --count $(( 1000000 / scale )) $c \
        --idle "$quiet" 2>&1 | grep 'then quiet')" >> "$out/idle.txt"
    done
    # The defaults, a fixed 50 µs spin, no spin at all (every send that finds the IO thread
    # parked drives its turn), the defaults with round trips 200 µs apart (the spins have
    # run out when each request comes: a sporadic sender's case; a quarter of the round
    # trips), the defaults with each member journalled, a journalled pair with no spin
    # (its sends drive turns that append the journal's batch themselves), and requests with
    # their replies (the requester waits for the reply itself), back to back and sporadic.
    for setting in default spin50 block gap200 never interval block-never request request-gap200; do
      local flags=() count=$trips
      case $setting in
        spin50) flags=(--spin-us 50) ;;
        block) flags=(--spin-us 0) ;;
        gap200) flags=(--gap-us 200) count=$(( trips / 4 )) ;;
        never | interval) flags=(--journal "$setting") ;;
        block-never) flags=(--spin-us 0 --journal never) ;;
        request) flags=(--request) ;;
        request-gap200) flags=(--request --gap-us 200) count=$(( trips / 4 )) ;;
      esac
      echo "=== round $round, $setting" >> "$out/ping_pong.txt"
      "$dir/ping_pong" --count "$count" --warmup $(( count / 6 )) --stages "${flags[@]}" \
        >> "$out/ping_pong.txt" 2>&1
    done
  done
  if grep -Ev ' [0-9]+ messages in [0-9.]+' "$out/msg_cost.txt" >&2; then
    echo "the msg_cost runs above failed" >&2
    exit 1
  fi
  if grep -Ev 'then quiet for' "$out/idle.txt" >&2; then
    echo "the quiet runs above failed" >&2
    exit 1
  fi
  grep -h '^summary' "$out"/throughput.*.txt > "$out/summary.txt" || true
  cat "$out/machine.txt" "$out/summary.txt"
}

case "${1:-}" in
  prepare) prepare ;;
  run) shift; run "$@" ;;
  *) sed -n '2,24p' "$0" >&2; exit 2 ;;
esac
