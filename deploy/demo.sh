#!/usr/bin/env bash
# The main job: real TCP and UDP traffic from a client through xlb to three real servers on the
# namespace testbed (docs/testbed.md), with the counts to prove it. Run as root: `make demo`.
# Everything it starts is torn down on exit, failure or Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
P=${XLB_DEMO_PREFIX:-xlbdemo}
# The binary `make demo` built (cargo puts it under $CARGO_TARGET_DIR when that is set).
XLB=${XLB_BIN:-${CARGO_TARGET_DIR:-target}/release/xlb}
SOCK=/run/xlb-demo-$P.sock
LOG=$(mktemp /tmp/xlb-demo-XXXXXX.log)
N=${XLB_DEMO_REQUESTS:-30}

[ "$(id -u)" -eq 0 ] || { echo "demo: needs root (network namespaces, XDP)" >&2; exit 1; }
[ -x "$XLB" ] || { echo "demo: $XLB is missing: run 'make demo' (it builds it)" >&2; exit 1; }

XLB_PID=
cleanup() {
  if [ -n "$XLB_PID" ] && kill -0 "$XLB_PID" 2>/dev/null; then
    kill -TERM "$XLB_PID" 2>/dev/null || true
    wait "$XLB_PID" 2>/dev/null || true
  fi
  bash deploy/testbed.sh down "$P" >/dev/null 2>&1 || true
  rm -f "$SOCK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== xlb check: what deploy/examples/testbed.yaml programs"
"$XLB" check --config deploy/examples/testbed.yaml | head -12
echo "   ..."
echo
echo "== testbed up ($P)"
bash deploy/testbed.sh up "$P"
C=(ip netns exec "$P-client")

echo "== starting xlb in $P-lb (log: $LOG)"
ip netns exec "$P-lb" "$XLB" run --config deploy/examples/testbed.yaml --admin-socket "$SOCK" >"$LOG" 2>&1 &
XLB_PID=$!
for _ in $(seq 50); do
  [ -S "$SOCK" ] && break
  kill -0 "$XLB_PID" 2>/dev/null || { cat "$LOG"; echo "demo: xlb exited" >&2; exit 1; }
  sleep 0.1
done
[ -S "$SOCK" ] || { cat "$LOG"; echo "demo: xlb did not come up" >&2; exit 1; }
grep -E "socket bound|worker started|steering attached" "$LOG" | sed 's/^[^ ]* */   /'

declare -A COUNT
fails=0
tally() { # tally LABEL CMD...: run CMD N times, count which backend answered
  local label=$1; shift
  local i out
  for i in $(seq "$N"); do
    if out=$("$@" 2>/dev/null) && [[ $out =~ (be[0-9]) ]]; then
      COUNT["$label ${BASH_REMATCH[1]}"]=$(( ${COUNT["$label ${BASH_REMATCH[1]}"]:-0} + 1 ))
    else
      fails=$((fails + 1))
    fi
  done
}

echo
echo "== driving traffic: $N requests per row"
tally "HTTP  ClusterIP 10.250.100.1:80 (DNAT, client IP kept)" "${C[@]}" curl -s -m 2 http://10.250.100.1/
tally "HTTP  NodePort 10.250.1.1:30080 (SNAT)" "${C[@]}" curl -s -m 2 http://10.250.1.1:30080/
tally "HTTP  LoadBalancer 10.250.100.2:80 (eTP Local)" "${C[@]}" curl -s -m 2 http://10.250.100.2/
tally "HTTP  ClientIP affinity 10.250.100.4:80 (mh)" "${C[@]}" curl -s -m 2 http://10.250.100.4/
tally "HTTP  DSR IPIP 10.250.100.10:80" "${C[@]}" curl -s -m 2 http://10.250.100.10/
tally "HTTP  IPv6 [fd00:250:100::1]:80" "${C[@]}" curl -s -m 2 "http://[fd00:250:100::1]/"
tally "UDP   ClusterIP 10.250.100.1:53" bash -c "echo q | ${C[*]} socat -t1 - UDP:10.250.100.1:53"
tally "UDP   NodePort 10.250.1.1:30053 (SNAT)" bash -c "echo q | ${C[*]} socat -t1 - UDP:10.250.1.1:30053"
tally "UDP   IPv6 [fd00:250:100::1]:53" bash -c "echo q | ${C[*]} socat -t1 - UDP6:[fd00:250:100::1]:53"
tally "HTTP  routed pod CIDRs 10.250.100.20:80 (kernel routes)" "${C[@]}" curl -s -m 2 http://10.250.100.20/
tally "HTTP  multipath route 10.250.100.21:80" "${C[@]}" curl -s -m 2 http://10.250.100.21/
tally "HTTP  pod on the xlb node 10.250.100.32:80 (eTP Local)" "${C[@]}" curl -s -m 2 http://10.250.100.32/
tally "HTTP  pod on the xlb node NodePort 10.250.1.1:30085" "${C[@]}" curl -s -m 2 http://10.250.1.1:30085/
tally "HTTP  direct to pod 10.250.2.11:80 (replies punted)" "${C[@]}" curl -s -m 2 http://10.250.2.11/

printf '\n%-58s %6s %6s %6s %6s\n' "requests per backend (be4: pod on the xlb node)" be1 be2 be3 be4
for row in "HTTP  ClusterIP 10.250.100.1:80 (DNAT, client IP kept)" "HTTP  NodePort 10.250.1.1:30080 (SNAT)" \
  "HTTP  LoadBalancer 10.250.100.2:80 (eTP Local)" "HTTP  ClientIP affinity 10.250.100.4:80 (mh)" \
  "HTTP  DSR IPIP 10.250.100.10:80" "HTTP  IPv6 [fd00:250:100::1]:80" "UDP   ClusterIP 10.250.100.1:53" \
  "UDP   NodePort 10.250.1.1:30053 (SNAT)" "UDP   IPv6 [fd00:250:100::1]:53" \
  "HTTP  routed pod CIDRs 10.250.100.20:80 (kernel routes)" "HTTP  multipath route 10.250.100.21:80" \
  "HTTP  pod on the xlb node 10.250.100.32:80 (eTP Local)" "HTTP  pod on the xlb node NodePort 10.250.1.1:30085" \
  "HTTP  direct to pod 10.250.2.11:80 (replies punted)"; do
  printf '%-58s %6s %6s %6s %6s\n' "$row" "${COUNT["$row be1"]:-0}" "${COUNT["$row be2"]:-0}" "${COUNT["$row be3"]:-0}" "${COUNT["$row be4"]:-0}"
done
echo "failed requests: $fails"

echo
echo "== a service with no endpoints is refused at once (ICMP port unreachable)"
start=$(date +%s%N)
if "${C[@]}" curl -s -m 5 http://10.250.100.5/ >/dev/null 2>&1; then echo "   unexpected answer"; fails=$((fails + 1)); else
  echo "   curl http://10.250.100.5/ failed after $(( ($(date +%s%N) - start) / 1000000 )) ms (connection refused)"; fi

echo
echo "== HTTP load with wrk through the ClusterIP (5 s, 2 connections)"
"${C[@]}" wrk -t1 -c2 -d5s http://10.250.100.1/ 2>&1 | sed 's/^/   /' | grep -E "Requests/sec|requests in|Socket errors|Non-2xx" || true

echo
echo "== what the backends saw (client addresses in nginx logs)"
for i in 1 2 3 4; do
  printf '   be%s: %s\n' "$i" "$(awk '{print $1}' "/run/xlb-testbed/$P/be$i/access.log" 2>/dev/null | sort | uniq -c | tr '\n' ' ')"
done

echo
echo "== xlb's counters (xlb stats)"
"$XLB" stats --admin-socket "$SOCK" | grep -v " packets 0 new_flows 0$" | sed 's/^/   /'
echo
echo "== xlb services (ipvsadm -Ln layout), first lines"
"$XLB" services --admin-socket "$SOCK" | head -8 | sed 's/^/   /'

kill -TERM "$XLB_PID"; wait "$XLB_PID" || true; XLB_PID=
if ip -n "$P-lb" -d link show eth0 | grep -q xdp; then echo "demo: an XDP program is still attached" >&2; exit 1; fi
if ip -n "$P-lb" link show xlb0 >/dev/null 2>&1; then echo "demo: the punt device xlb0 is still there" >&2; exit 1; fi
if ip -n "$P-lb" rule show | grep -q "lookup 7892066"; then echo "demo: a reply rule is still there" >&2; exit 1; fi
echo
echo "== xlb stopped; no XDP program left on eth0, no punt device, no reply rule"
[ "$fails" -eq 0 ] || { echo "demo: $fails request(s) failed" >&2; exit 1; }
echo "demo: ok"
