#!/usr/bin/env bash
# Tests the README's first command, `make demo` (tests/demo.sh), as a user runs it:
#   1. with --exit-when-ready: it reaches "ready", prints the KUBECONFIG line and the plugin's
#      Events (Loaded 0.1.0, then Swapped naming 0.2.0), and exits 0;
#   2. left running: Ctrl-C (SIGINT to its whole process group, as a terminal sends it) at
#      "ready" ends it at once;
#   3. SIGTERM to the script alone, mid-way, ends it at once.
# After each, no process it started may be left: every process the demo starts inherits a
# marker variable, and /proc is searched for it.
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/demo-test
mkdir -p "$out"
marker=demo-test-$$-$RANDOM
# A build on a fresh machine can take long; the runs themselves take seconds.
limit=${DEMO_TEST_TIMEOUT:-1500}
failures=0
passed=0

fail() { echo "demo-test: FAILED: $*" >&2; failures=$((failures + 1)); }
pass() { echo "demo-test: ok: $*"; passed=$((passed + 1)); }

# Pids of live processes carrying the marker (none of this script's own: it does not export it).
marked() {
  grep -lsa "WASMOP_DEMO_MARK=$marker" /proc/[0-9]*/environ 2>/dev/null |
    sed -E 's#/proc/([0-9]+)/environ#\1#' || true
}

leftovers() {
  local what=$1 pids
  # Stopped components get a short grace period from their parents; allow for it.
  for _ in $(seq 1 50); do
    pids=$(marked)
    [ -z "$pids" ] && { pass "$what: no process left behind"; return; }
    sleep 0.2
  done
  fail "$what: processes left running:"
  for p in $pids; do ps -o pid=,args= -p "$p" >&2 || true; done
  kill -KILL $pids 2>/dev/null || true
}

# Job control gives each demo a process group of its own (so a group signal reaches only it
# and its children) and leaves SIGINT as a terminal would: without it, bash starts background
# jobs with SIGINT ignored, and a script cannot trap a signal ignored at its start.
set -m

# start LOG ARGS...: the demo, with the marker; sets $demo_pid (also its process group).
start() {
  local log=$1
  shift
  # With SIGINT as a terminal leaves it even when this script inherited it ignored (started
  # in the background of a non-interactive shell): bash could not trap it otherwise.
  WASMOP_DEMO_MARK=$marker env --default-signal=INT tests/demo.sh "$@" >"$log" 2>&1 </dev/null &
  demo_pid=$!
}

# await LOG PATTERN SECONDS: until LOG has a line matching PATTERN, or the demo exits.
await() {
  local log=$1 pattern=$2 deadline=$((SECONDS + $3))
  until grep -qs -- "$pattern" "$log"; do
    kill -0 "$demo_pid" 2>/dev/null || return 1
    [ $SECONDS -ge $deadline ] && return 1
    sleep 0.2
  done
}

# stops_within SECONDS: waits for the demo to exit; sets $rc (or fails and kills it).
stops_within() {
  local deadline=$((SECONDS + $1))
  while kill -0 "$demo_pid" 2>/dev/null; do
    if [ $SECONDS -ge $deadline ]; then
      rc=timeout
      kill -KILL -- "-$demo_pid" 2>/dev/null || true
      return 1
    fi
    sleep 0.1
  done
  rc=0
  wait "$demo_pid" || rc=$?
}

# The plugin's Events, in the order `kubectl describe` shows them.
check_events() {
  local text=$1 what=$2 loaded swapped
  loaded=$(grep -n 'Loaded.*loaded memcached 0\.1\.0 (sha256:' <<<"$text" | head -1 | cut -d: -f1)
  swapped=$(grep -n 'Swapped.*swapped in memcached 0\.2\.0 (sha256:.*replacing memcached 0\.1\.0' <<<"$text" | head -1 | cut -d: -f1)
  if [ -n "$loaded" ] && [ -n "$swapped" ] && [ "$loaded" -lt "$swapped" ]; then
    pass "$what: describe lists Loaded 0.1.0, then Swapped to 0.2.0"
  else
    fail "$what: describe does not list Loaded 0.1.0 then Swapped to 0.2.0:"
    echo "$text" >&2
  fi
}

echo "demo-test: 1. tests/demo.sh --exit-when-ready"
log=$out/exit-when-ready.log
start "$log" --exit-when-ready
if stops_within "$limit" && [ "$rc" = 0 ]; then
  pass "exits 0 by itself"
else
  fail "exit status $rc, expected 0"
  tail -n 40 "$log" >&2
fi
grep -q '==> ready' "$log" && pass "reached ready" || fail "never reached ready"
grep -q '^export KUBECONFIG=/' "$log" && pass "prints the KUBECONFIG line" || fail "no KUBECONFIG line"
check_events "$(sed -n '/^Events:/,/==> ready/p' "$log")" "--exit-when-ready"
leftovers "--exit-when-ready"

# interrupt WHAT TARGET SIGNAL CODE: sends SIGNAL to TARGET (a pid, or -pgid for the whole
# group) and expects the demo to exit with CODE within 30 s.
interrupt() {
  local what=$1 target=$2 signal=$3 code=$4
  kill "-$signal" -- "$target"
  if stops_within 30; then
    [ "$rc" = "$code" ] && pass "$what ends it (exit $code)" || fail "$what: exit status $rc, expected $code"
  else
    fail "still running 30 s after $what"
  fi
}

# gave_up WHAT: the demo never got where the test waited for.
gave_up() {
  fail "never $1"
  tail -n 40 "$log" >&2
  kill -KILL -- "-$demo_pid" 2>/dev/null || true
}

echo "demo-test: 2. Ctrl-C at ready"
log=$out/ctrl-c.log
start "$log"
if await "$log" '==> ready' "$limit"; then
  pass "reached ready"
  kubeconfig=$(sed -n 's/^export KUBECONFIG=//p' "$log")
  kubectl=$(sed -n 's/^kubectl: //p' "$log")
  check_events "$(KUBECONFIG=$kubeconfig "$kubectl" -n wasmop-system describe configmap memcached)" "Ctrl-C run"
  interrupt "Ctrl-C" "-$demo_pid" INT 0
  grep -q '^demo: stopped' "$log" && pass "says it stopped everything" || fail "no line saying it stopped"
else
  gave_up "reached ready"
fi
leftovers "Ctrl-C"

echo "demo-test: 3. SIGTERM while the host starts"
log=$out/sigterm.log
start "$log"
if await "$log" '==> starting the host' "$limit"; then
  interrupt "SIGTERM" "$demo_pid" TERM 143
else
  gave_up "started the host"
fi
leftovers "SIGTERM"

echo "demo-test: $passed passed, $failures failed"
[ "$failures" = 0 ]
