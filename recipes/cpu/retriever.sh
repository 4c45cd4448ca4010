# Sourced by the CPU recipes: serve a BM25 index on a free loopback port for this run.
#   start_retriever INDEX_DIR WORK_DIR
# Waits until GET /health answers (verl_memagent/search/endpoint.py's probe), stops the server when
# the calling script exits, and exports MEMAGENT_RETRIEVER_URL for the agent loops. The numpy scoring backend starts at once; numba's
# compile warm-up (tens of seconds) pays off only on corpora far larger than the bundled one.

start_retriever() {
  local index=$1 work=$2
  rm -f "$work/retriever.port"
  python -m retriever_server serve --index "$index" --port 0 --port-file "$work/retriever.port" \
    --bm25-backend numpy >"$work/retriever.log" 2>&1 &
  RETRIEVER_PID=$!
  trap 'kill "$RETRIEVER_PID" 2>/dev/null || true' EXIT
  local _
  for _ in $(seq 240); do
    if [ -s "$work/retriever.port" ] &&
      python -m verl_memagent.search.endpoint --quiet --timeout 2 "http://127.0.0.1:$(cat "$work/retriever.port")"; then
      export MEMAGENT_RETRIEVER_URL="http://127.0.0.1:$(cat "$work/retriever.port")"
      return 0
    fi
    kill -0 "$RETRIEVER_PID" 2>/dev/null || { cat "$work/retriever.log" >&2; exit 1; }
    sleep 0.5
  done
  echo "retriever on $index did not become healthy in 120 s: see $work/retriever.log" >&2
  exit 1
}
