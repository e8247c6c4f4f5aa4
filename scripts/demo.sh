#!/usr/bin/env bash
# prefix-router seed demo: 3 pods, Envoy with the prefix-routing filter, and a real
# Prometheus, all on 127.0.0.1. Installs what is missing, builds, runs, and stops everything it
# started on exit, Ctrl-C or failure.
#
#   scripts/demo.sh            the reference scenario (+ the short-prompt case)
#   scripts/demo.sh different  the opposite scenario: 30 different prompts, no reuse
#   scripts/demo.sh all        both
#
# Ports are free ones unless set: POD_PORTS="8001 8002 8003" ENVOY_PORT=10000 ADMIN_PORT=9901
# PROM_PORT=9090. The pods run the real SmolLM2-135M on CPU (ENGINE=gguf, the default; each
# send takes about a second on 2 cores) or the latency simulator (ENGINE=sim: modelled on the
# real engine's latencies, without running the model).
#
# BACKEND=llama-cpp runs the same scenarios against three llama.cpp `llama-server` pods (built
# once by scripts/setup.sh) serving the same GGUF: they have no cache events, so the filter
# follows them through /health and /metrics, and the per-pod counter read back from Prometheus
# is llama.cpp's own llamacpp:prompt_tokens_cached_total.
#
# BACKEND=vllm runs them against three vLLM pods (the CPU build scripts/setup.sh installs,
# serving SmolLM2 in the Hugging Face layout), each with a kv-events sidecar that turns vLLM's
# own KV-cache events into the page the filter polls; the per-pod counter is vLLM's
# vllm:prefix_cache_hits_total. vLLM takes a minute or two to start.
# At the end it prints where to look (Prometheus, with the project's rules loaded) and the
# queries it used; HOLD=1 keeps everything running until Ctrl-C.
# Exits non-zero if what it shows is not what it claims.
set -euo pipefail
MODE=${1:-seed}
case "$MODE" in seed|different|all) ;; *) echo "usage: $0 [seed|different|all]" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."
ROOT=$PWD

BACKEND=${BACKEND:-model-server}
case "$BACKEND" in model-server|llama-cpp|vllm) ;; *) echo "BACKEND must be model-server, llama-cpp or vllm" >&2; exit 2 ;; esac
case "$BACKEND" in
  llama-cpp) SETUP_PEERS=0 SETUP_VLLM=0 scripts/setup.sh >/dev/null ;;
  vllm) SETUP_PEERS=0 SETUP_LLAMA_CPP=0 scripts/setup.sh >/dev/null ;;
  *) SETUP_LLAMA_CPP=0 SETUP_PEERS=0 SETUP_VLLM=0 scripts/setup.sh >/dev/null ;;
esac
echo "building (cached after the first run)..."
cargo build -q -p model-server -p prefix-router-config -p kv-events --bins
WASM="$ROOT/$(scripts/build-filter.sh)"

RUN=$(mktemp -d /tmp/prefix-router-demo.XXXXXX)
PIDS=()
cleanup() {
  # vLLM pods lead process groups of their own (their engine is a child process)
  for p in "${PIDS[@]}"; do kill -- "-$p" 2>/dev/null || kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  echo "stopped everything; logs in $RUN"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'; }
fail() { echo "DEMO FAILED: $*" >&2; exit 1; }
READY_STEPS=300 # tenths of a second a process may take to be ready (vLLM: more, below)
ready_or_gone() { # url pid → 0 once url answers; 1 if pid exits first or READY_STEPS pass
  for _ in $(seq 1 "$READY_STEPS"); do
    curl -sf -m 2 -o /dev/null "$1" && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
# A port free_port picks is free when picked, not when bound: anything on the machine (an
# outgoing connection's ephemeral port, another run) can take it in between, and the pods'
# start leaves seconds for that. So ports are picked right before their process starts, and a
# process that lost its port is started again on a fresh one (up to 3 times). Ports set by
# the caller are used as given.
lost_port() { grep -qiE 'address already in use|cannot bind|couldn.t bind' "$1"; }
started() { # what url pid log pinned → 0 ready, 1 lost its port (retry), else fails the demo
  ready_or_gone "$2" "$3" && return 0
  kill "$3" 2>/dev/null || true
  if [ -z "$5" ] && lost_port "$4"; then echo "($1 lost its port to another process; again on a fresh one)"; return 1; fi
  fail "$1 did not become ready ($2); see $4"
}
start_ready() { # what pinned start-function [args]: the function picks its ports (unless
  # pinned), starts one process and sets URL (its readiness), PID and LOG; run until that
  # process is ready, again on fresh ports while it loses one
  for _ in 1 2 3; do
    "${@:3}"
    started "$1" "$URL" "$PID" "$LOG" "$2" && return 0
  done
  fail "$1 lost its port three times; see $RUN"
}

read -r -a POD_PORTS <<<"${POD_PORTS:-}"
PODS_PINNED=${POD_PORTS[*]:+1}
ENVOY_GIVEN=${ENVOY_PORT:-} ADMIN_GIVEN=${ADMIN_PORT:-}
ENVOY_PINNED=$ENVOY_GIVEN$ADMIN_GIVEN
PROM_PINNED=${PROM_PORT:+1}
MODEL=SmolLM2-135M-Instruct
ENGINE=${ENGINE:-gguf}
case "$ENGINE" in sim|gguf|candle) ;; *) echo "ENGINE must be sim or gguf (candle: its old name)" >&2; exit 2 ;; esac
echo "run directory (logs, configs): $RUN"

# --- pods -------------------------------------------------------------------------------------
# What differs between the backends: how a pod starts, how it counts tokens, which Prometheus
# series holds its prefix-cache reuse, and which label names the pod in that series.
if [ "$BACKEND" = llama-cpp ]; then
  LLAMA_SERVER=$(scripts/build-llama-server.sh)
  GGUF=${PREFIX_ROUTER_DATA:-$ROOT/data}/models/$MODEL/$MODEL.Q4_1.gguf
  POD_LABEL=instance                               # llama-server sets no pod label: its address
  HITS='sum by (instance) (llamacpp:prompt_tokens_cached_total)'
  HITS_TOTAL='sum(llamacpp:prompt_tokens_cached_total)'
  COMPUTED='sum by (instance) (llamacpp:prompt_tokens_total)'
elif [ "$BACKEND" = vllm ]; then
  VLLM_PY=$(scripts/install-vllm.sh)/bin/python
  HF_DIR=${PREFIX_ROUTER_DATA:-$ROOT/data}/models/$MODEL-hf
  POD_LABEL=pod                                    # Prometheus labels each target with its address
  HITS='sum by (pod) (vllm:prefix_cache_hits_total)'
  HITS_TOTAL='sum(vllm:prefix_cache_hits_total)'
  READY_STEPS=4000                                 # three vLLMs starting at once on 2 cores: ~2 min
  SIDECARS=()
else
  POD_LABEL=pod
  HITS='sum by (pod) (vllm:prefix_cache_hits_total)'
  HITS_TOTAL='sum(vllm:prefix_cache_hits_total)'
fi
start_pod() { # index address
  if [ "$BACKEND" = llama-cpp ]; then
    # one slot and one thread each: three of them share 2 cores
    "$LLAMA_SERVER" -m "$GGUF" --alias "$MODEL" --host 127.0.0.1 --port "${2##*:}" --metrics \
      --no-webui --parallel 1 --threads 1 --ctx-size 4096 --cache-ram 256 >"$RUN/pod-$1.log" 2>&1 &
  elif [ "$BACKEND" = vllm ]; then
    # events on ipc sockets in the run directory (vLLM binds them); one thread each
    local kv="$RUN/pod-$1-kv"
    mkdir -p "$kv"
    VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 \
      VLLM_NO_USAGE_STATS=1 setsid "$VLLM_PY" -m vllm.entrypoints.openai.api_server \
      --model "$HF_DIR" --served-model-name "$MODEL" --host 127.0.0.1 --port "${2##*:}" \
      --max-model-len 2048 --block-size 128 --enforce-eager --dtype bfloat16 --max-num-seqs 8 \
      --enable-prompt-tokens-details --kv-events-config \
      "{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"ipc://$kv/pub\",\"replay_endpoint\":\"ipc://$kv/replay\",\"topic\":\"kv\"}" \
      >"$RUN/pod-$1.log" 2>&1 &
    PIDS+=($!)
    POD_PIDS[$1]=$!
    "$ROOT/target/debug/kv-events" --events "ipc://$kv/pub" --replay "ipc://$kv/replay" \
      --pod "http://$2" --model "$MODEL" --block-size 128 --listen 127.0.0.1:0 \
      >"$RUN/pod-$1-kv-events.log" 2>&1 &
    PIDS+=($!)
    return
  else
    "$ROOT/target/debug/model-server" --listen "$2" --pod-name "pod-$1" --block-size 128 \
      --engine "$ENGINE" >"$RUN/pod-$1.log" 2>&1 &
  fi
  PIDS+=($!)
  POD_PIDS[$1]=$!
}
count_tokens() { # prompt → its token count, as the pods count them
  if [ "$BACKEND" = llama-cpp ]; then
    jq -n --arg p "$1" '{content: $p}' | curl -s "http://${PODS[0]}/tokenize" -H 'content-type: application/json' -d @- | jq '.tokens | length'
  else
    jq -n --arg m "$MODEL" --arg p "$1" '{model: $m, prompt: $p}' | curl -s "http://${PODS[0]}/tokenize" -H 'content-type: application/json' -d @- | jq .count
  fi
}
PODS=()
POD_PIDS=()
for i in 0 1 2; do
  PODS+=("127.0.0.1:${POD_PORTS[$i]:-$(free_port)}")
  start_pod "$i" "${PODS[$i]}"
done
pod_again() { # index: on a fresh port
  PODS[$1]="127.0.0.1:$(free_port)"
  start_pod "$1" "${PODS[$1]}"
  URL="http://${PODS[$1]}/health" PID=${POD_PIDS[$1]} LOG="$RUN/pod-$1.log"
}
for i in "${!PODS[@]}"; do # started together, then waited for one by one
  started "pod-$i" "http://${PODS[$i]}/health" "${POD_PIDS[$i]}" "$RUN/pod-$i.log" "$PODS_PINNED" ||
    start_ready "pod-$i" "" pod_again "$i"
done
if [ "$BACKEND" = vllm ]; then # each sidecar prints its address, and serves once subscribed
  for i in "${!PODS[@]}"; do
    for _ in $(seq 1 300); do
      addr=$(sed -n 's/^kv-events listening on //p' "$RUN/pod-$i-kv-events.log" 2>/dev/null)
      [ -n "$addr" ] && curl -sf -m 2 -o /dev/null "http://$addr/health" && break
      sleep 0.1
    done
    curl -sf -m 2 -o /dev/null "http://$addr/health" || fail "pod-$i's kv-events sidecar is not serving; see $RUN/pod-$i-kv-events.log"
    SIDECARS+=("${PODS[$i]}=$addr")
  done
fi
case "$BACKEND" in
  llama-cpp) what="llama.cpp llama-server" ;;
  vllm) what="vLLM, kv-events sidecars: ${SIDECARS[*]}" ;;
  *) what="model-server, engine $ENGINE" ;;
esac
echo "pods:       $(for i in "${!PODS[@]}"; do printf 'pod-%s=%s ' "$i" "${PODS[$i]}"; done)($what)"

# --- Envoy with the filter ----------------------------------------------------------------------
start_envoy() {
  ENVOY_PORT=${ENVOY_GIVEN:-$(free_port)} ADMIN_PORT=${ADMIN_GIVEN:-$(free_port)}
  # the filter carries no vocabulary: Envoy serves it the model's tokenizer files on a
  # loopback port (the default model's installed directory unless --tokenizer-dir says)
  local vllm_args=(--assets-port "$(free_port)")
  if [ "$BACKEND" = vllm ]; then # the tokenizer vLLM serves, and where each pod's events are
    vllm_args+=(--tokenizer-dir "$HF_DIR" --events-addresses "$(IFS=,; echo "${SIDECARS[*]}")")
  fi
  "$ROOT/target/debug/render-envoy-config" --pods "$(IFS=,; echo "${PODS[*]}")" \
    --listen-port "$ENVOY_PORT" --admin-port "$ADMIN_PORT" --wasm "$WASM" --debug-headers "${vllm_args[@]}" \
    -o "$RUN/envoy.yaml"
  # validated once: a start again differs only in its ports
  [ -e "$RUN/envoy-validate.log" ] || "$ROOT/.venv/bin/envoy" --mode validate --disable-hot-restart \
    -c "$RUN/envoy.yaml" >"$RUN/envoy-validate.log" 2>&1 || fail "envoy config did not validate; see $RUN/envoy-validate.log"
  "$ROOT/.venv/bin/envoy" -c "$RUN/envoy.yaml" --concurrency 2 --disable-hot-restart \
    --log-level warn --component-log-level wasm:info >"$RUN/envoy.log" 2>&1 &
  PID=$! URL="http://127.0.0.1:$ADMIN_PORT/ready" LOG="$RUN/envoy.log"
  PIDS+=("$PID")
}
start_ready envoy "$ENVOY_PINNED" start_envoy
# each of Envoy's filter VMs (2 workers, the main thread) fetches the tokenizer just after
# start; requests are balanced by load until then
tokenizer_loads() {
  curl -s "http://127.0.0.1:$ADMIN_PORT/stats/prometheus" |
    awk '$1 == "prefix_router_tokenizer_loads" || index($1, "prefix_router_tokenizer_loads{") == 1 { s += $2 } END { printf "%d", s }'
}
for _ in $(seq 1 300); do [ "$(tokenizer_loads)" -ge 3 ] && break; sleep 0.1; done
[ "$(tokenizer_loads)" -ge 3 ] || fail "the filter never loaded the tokenizer; see $RUN/envoy.log"
echo "envoy:      listener 127.0.0.1:$ENVOY_PORT, admin 127.0.0.1:$ADMIN_PORT"

# --- Prometheus -----------------------------------------------------------------------------------
targets=$(printf "'%s', " "${PODS[@]}")
cat >"$RUN/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: ['$ROOT/deploy/kubernetes/base/prometheus-rules.yml']
scrape_configs:
- job_name: pods
  honor_labels: true        # keep each pod's own pod="pod-N" label (model-server pods)
  static_configs:
  - targets: [${targets%, }]
  relabel_configs:          # and label the others' (llama.cpp) with their address
  - source_labels: [__address__]
    target_label: pod
- job_name: envoy
  metrics_path: /stats/prometheus
  static_configs:
  - targets: ['127.0.0.1:$ADMIN_PORT']
YAML
start_prometheus() {
  [ -n "$PROM_PINNED" ] || PROM_PORT=$(free_port)
  prometheus --config.file="$RUN/prometheus.yml" --storage.tsdb.path="$RUN/prometheus-data" \
    --web.listen-address="127.0.0.1:$PROM_PORT" --log.level=warn >"$RUN/prometheus.log" 2>&1 &
  PID=$! URL="http://127.0.0.1:$PROM_PORT/-/ready" LOG="$RUN/prometheus.log"
  PIDS+=("$PID")
}
start_ready prometheus "$PROM_PINNED" start_prometheus
echo "prometheus: http://127.0.0.1:$PROM_PORT"

promql() { curl -s --get "http://127.0.0.1:$PROM_PORT/api/v1/query" --data-urlencode "query=$1"; }
scalar() { promql "$1" | jq -r '.data.result[0].value[1] // "0"'; }
series_count() { promql "$1" | jq '.data.result | length'; }
table() { # promql; prints pod<TAB>value
  promql "$1" | jq -r --arg l "$POD_LABEL" '.data.result | sort_by(.metric[$l]) | .[] | "  \(.metric[$l])\t\(.value[1])"'
}
wait_prom() { # promql expected-value: poll until Prometheus has scraped it
  for _ in $(seq 1 150); do [ "$(scalar "$1")" = "$2" ] && return 0; sleep 0.2; done
  fail "Prometheus never showed $1 = $2 (got $(scalar "$1"))"
}
for _ in $(seq 1 150); do [ "$(series_count "$HITS")" = "${#PODS[@]}" ] && break; sleep 0.2; done
[ "$(series_count "$HITS")" = "${#PODS[@]}" ] || fail "Prometheus did not scrape every pod"

pods_sum() { # counter → its sum over every pod, read from the pods themselves
  for p in "${PODS[@]}"; do curl -s "http://$p/metrics"; done |
    awk -v m="$1" 'index($1, m) == 1 && (length($1) == length(m) || substr($1, length(m) + 1, 1) == "{") { s += $2 } END { printf "%d", s }'
}

send() { # prompt max_tokens → prints "pod cached reason latency text"
  local hdr="$RUN/last-headers" body
  body=$(jq -n --arg m "$MODEL" --arg p "$1" --argjson n "$2" '{model: $m, prompt: $p, max_tokens: $n}')
  local out
  out=$(curl -s -D "$hdr" -w '\n%{time_total}' "http://127.0.0.1:$ENVOY_PORT/v1/completions" \
    -H 'content-type: application/json' -d "$body")
  local latency=${out##*$'\n'} json=${out%$'\n'*}
  local pod reason
  # the pod that answered, as Prometheus labels it: the model server names itself in
  # x-inference-pod; llama-server and vLLM do not, so the address the filter sent it to
  if [ "$BACKEND" != model-server ]; then
    pod=$(grep -i '^x-prefix-router-pod:' "$hdr" | cut -d' ' -f2 | tr -d '\r')
  else
    pod=$(grep -i '^x-inference-pod:' "$hdr" | cut -d' ' -f2 | tr -d '\r')
  fi
  reason=$(grep -i '^x-prefix-router-reason:' "$hdr" | cut -d' ' -f2 | tr -d '\r')
  jq -r --arg pod "$pod" --arg lat "$latency" --arg reason "$reason" \
    '"\($pod)\t\(.usage.prompt_tokens_details.cached_tokens)\t\($reason)\t\(($lat|tonumber)*1000|floor) ms\t\(.choices[0].text | gsub("\\s+"; " ") | .[0:48])"' <<<"$json"
}

seed_scenario() {
  echo
  echo "== Step 1: per-pod prefix-cache hits before anything is sent"
  echo "   PromQL: $HITS"
  table "$HITS"
  [ "$(scalar "$HITS_TOTAL")" = "0" ] || fail "hits were not all zero at the start"
  echo "   all zero: no pod has cached anything yet."

  echo
  echo "== Step 2: a runbook lead-in, sent 6 times through Envoy with curl + jq"
  export RUNBOOK_PROMPT="You are the on-call assistant for the payments platform. Before answering, read the incident context carefully. Confirm the affected service, the region, the time the alert fired and the current error rate. Check the deployment history for changes in the last two hours, and compare latency percentiles against the weekly baseline. If a rollback is possible and the change correlates with the incident, recommend it first. Escalate to the database team when replication lag exceeds thirty seconds. Never restart stateful services without a snapshot. Summarise your findings as: impact, probable cause, next action, owner.
Incident: the checkout API returns HTTP 502 for 12% of requests in eu-west-1 since 09:14 UTC."
  local tokens
  tokens=$(count_tokens "$RUNBOOK_PROMPT")
  echo "   the prompt is $tokens tokens: $((tokens / 128)) full 128-token block(s) can be cached"
  [ "$tokens" -gt 128 ] || fail "the runbook prompt must be longer than one block"
  printf '   send\tpod\tcached\treason\tlatency\tanswer\n'
  local pods_seen="" expected=0 first_cached="" line
  for i in 1 2 3 4 5 6; do
    line=$(send "$RUNBOOK_PROMPT" 16)
    printf '   %s\t%s\n' "$i" "$line"
    pods_seen="$pods_seen $(cut -f1 <<<"$line")"
    local c; c=$(cut -f2 <<<"$line")
    if [ "$i" = 1 ]; then first_cached=$c; else expected=$((expected + c)); fi
  done
  local owner; owner=$(tr ' ' '\n' <<<"$pods_seen" | sed '/^$/d' | sort -u)
  [ "$(wc -l <<<"$owner")" = 1 ] || fail "the six sends were answered by more than one pod: $owner"
  [ "$first_cached" = 0 ] || fail "the first send should be a miss"
  [ "$expected" -gt 0 ] || fail "the repeats did not hit the cache"

  echo
  echo "== Step 3: Prometheus after the sends (waiting for the scrape)"
  wait_prom "$HITS_TOTAL" "$expected"
  echo "   PromQL: $HITS"
  table "$HITS"
  local risen; risen=$(promql "$HITS" | jq '[.data.result[] | select(.value[1] != "0")] | length')
  [ "$risen" = 1 ] || fail "expected exactly one pod with hits, got $risen"
  [ "$(promql "$HITS" | jq -r --arg l "$POD_LABEL" --arg o "$owner" '.data.result[] | select(.metric[$l] == $o) | .value[1]')" = "$expected" ] \
    || fail "the hits are not on $owner"
  echo "   $owner's counter rose to $expected tokens; the others are still 0."
  echo "   Send 1 was a miss that seeded $owner's cache; sends 2-6 were routed back to $owner and hit."

  [ "$BACKEND" = llama-cpp ] && { short_llama; return; }
  echo
  echo "== Short prompt (under one block), sent 6 times"
  local short="Is the checkout API healthy right now?" q0 q1 st
  q0=$(scalar 'sum(vllm:prefix_cache_queries_total)')
  st=$(count_tokens "$short")
  printf '   send\tpod\tcached\treason\tlatency\tanswer\n'
  for i in 1 2 3 4 5 6; do printf '   %s\t%s\n' "$i" "$(send "$short" 4)"; done
  q1=$((q0 + 6 * st))
  wait_prom 'sum(vllm:prefix_cache_queries_total)' "$q1"
  table "$HITS"
  [ "$(scalar 'sum(vllm:prefix_cache_hits_total)')" = "$expected" ] || fail "a short prompt produced hits"
  echo "   $st tokens < 128: nothing to cache, no counter moved."
}

ticket() { # i → the i-th of the 30 different prompts: longer than one block, different from their first token
  echo "Ticket #$(($1 * 7919)) from customer $1: our invoices for order batch $1 are missing tax lines. Please review the billing pipeline logs, the tax service configuration, the currency conversion step and the PDF renderer, and explain which component most likely dropped the tax lines, with evidence from each log you checked and a proposed fix. Include the exact log queries you would run, the dashboards you would open, and who should approve the fix. The customer is on the enterprise plan, invoices are generated nightly at 02:00 UTC, and the last successful run with tax lines was three days ago, before the tax service was upgraded."
}

different_llama() { # the opposite scenario on llama.cpp pods
  local line pods="" c max=0 c0
  c0=$(scalar "$HITS_TOTAL")
  for i in $(seq 1 30); do
    line=$(send "$(ticket "$i")" 4)
    pods="$pods $(cut -f1 <<<"$line")"
    c=$(cut -f2 <<<"$line"); [ "$c" -gt "$max" ] && max=$c
    [ "$(cut -f3 <<<"$line")" = cold ] || fail "a different prompt was not routed as cold: $line"
  done
  echo "   requests per pod (from the filter's x-prefix-router-pod header):"
  tr ' ' '\n' <<<"$pods" | sed '/^$/d' | sort | uniq -c | awk '{print "  " $2 "\t" $1}'
  echo "   prompt tokens each server computed (PromQL: $COMPUTED):"
  local direct # what the servers say now; Prometheus shows it once it has scraped them all
  direct=$(for p in "${PODS[@]}"; do curl -s "http://$p/metrics"; done |
    awk '$1 == "llamacpp:prompt_tokens_total" { s += $2 } END { printf "%d", s }')
  wait_prom 'sum(llamacpp:prompt_tokens_total)' "$direct"
  table "$COMPUTED"
  echo "   cached tokens per server (PromQL: $HITS), $c0 before:"
  table "$HITS"
  [ "$max" -lt 128 ] || fail "a different prompt reused a whole block ($max cached tokens)"
  local used; used=$(tr ' ' '\n' <<<"$pods" | sed '/^$/d' | sort -u | wc -l)
  [ "$used" -gt 1 ] || fail "the 30 prompts all went to one pod"
  echo "   no block reused (at most $max cached tokens: the shared words 'Ticket #' that llama.cpp"
  echo "   reuses from its slot); every prompt is cold and rendezvous hashing spread them over $used pods."
}

short_llama() { # the short-prompt case on llama.cpp pods: routed by load, not by prefix
  echo
  echo "== Short prompt (under one block), sent 6 times"
  local short="Is the checkout API healthy right now?" st line
  st=$(count_tokens "$short")
  printf '   send\tpod\tcached\treason\tlatency\tanswer\n'
  for i in 1 2 3 4 5 6; do
    line=$(send "$short" 4)
    printf '   %s\t%s\n' "$i" "$line"
    [ "$(cut -f3 <<<"$line")" = short-prompt ] || fail "a short prompt was routed for its prefix"
  done
  echo "   $st tokens < 128: no full block, so the filter routes it by load (reason short-prompt)."
  echo "   Unlike vLLM and the project's server, llama.cpp reuses any common prefix its slot still"
  echo "   holds, not only whole blocks, so a repeat that lands on the same server may report a few"
  echo "   cached tokens; the router neither seeks nor counts them."
}

different_scenario() {
  echo
  echo "== Opposite scenario: 30 different prompts across the fleet"
  local tt; tt=$(count_tokens "$(ticket 1)")
  [ "$tt" -gt 128 ] || fail "the different prompts must be longer than one block ($tt tokens)"
  echo "   each prompt is about $tt tokens (a full 128-token block) and differs from the others from its first token"
  [ "$BACKEND" = llama-cpp ] && { different_llama; return; }
  local h0 r0 REQS='sum by (pod) (vllm:e2e_request_latency_seconds_count)'
  # the starting counts as the pods have them now (Prometheus may not have scraped the end of
  # the last request yet), and Prometheus caught up with them
  r0=$(pods_sum vllm:e2e_request_latency_seconds_count)
  wait_prom 'sum(vllm:e2e_request_latency_seconds_count)' "$r0"
  h0=$(scalar 'sum(vllm:prefix_cache_hits_total)')
  for i in $(seq 1 30); do
    send "$(ticket "$i")" 4 >/dev/null
  done
  wait_prom 'sum(vllm:e2e_request_latency_seconds_count)' "$((r0 + 30))"
  echo "   requests per pod (PromQL: $REQS):"
  table "$REQS"
  echo "   prefix-cache hits per pod (PromQL: $HITS):"
  table "$HITS"
  [ "$(scalar 'sum(vllm:prefix_cache_hits_total)')" = "$h0" ] || fail "different prompts produced cache hits"
  local used; used=$(promql "$REQS" | jq '[.data.result[] | select(.value[1] != "0")] | length')
  [ "$used" -gt 1 ] || fail "the 30 prompts all went to one pod"
  echo "   no reuse: every prompt differs from its first block, so each one is a cold miss;"
  echo "   cold prompts are spread by rendezvous hashing over $used pods."
}

case "$MODE" in
  seed) seed_scenario ;;
  different) different_scenario ;;
  all) seed_scenario; different_scenario ;;
esac
echo
echo "== look for yourself: Prometheus http://127.0.0.1:$PROM_PORT/graph"
echo "   (rules: deploy/kubernetes/base/prometheus-rules.yml, loaded; Grafana dashboard:"
echo "   deploy/kubernetes/base/grafana-dashboard.json). The queries, and what they answer now:"
for q in "$HITS" 'sum by (reason) (prefix_router_decisions)' 'prefix_router:prefix_hit_ratio:rate5m' \
         'max by (pod) (prefix_router_pod_healthy)' 'ALERTS{alertstate="firing"}'; do
  printf '   %s\n      → %s\n' "$q" "$(promql "$q" | jq -c '[.data.result[] | {key: (.metric.reason // .metric.pod // .metric.instance // .metric.alertname // "value"), value: .value[1]}] | from_entries')"
done
echo
echo "DEMO OK"
if [ "${HOLD:-0}" = 1 ]; then
  echo "HOLD=1: pods, Envoy and Prometheus keep running until Ctrl-C"
  wait
fi
