#!/usr/bin/env bash
# Build the wiki-18 indexes the papers used (21M passages of 100 words) from files downloaded on your
# side (see recipes/retriever/README.md): BM25 (bm25s, no Java) and dense e5-base-v2 (Search-R1's
# prebuilt faiss Flat index imported as is, or encoded here with ENCODE=1 on GPUs).
# Environment: WIKI18_DIR [$HOME/data/wiki18] holds wiki-18.jsonl (and e5_Flat.index);
# INDEX_DIR [$HOME/indexes] receives bm25/ and e5/; KINDS ["bm25 dense"].
set -euo pipefail
PYTHON=${PYTHON:-python3}
WIKI18_DIR=${WIKI18_DIR:-$HOME/data/wiki18}
INDEX_DIR=${INDEX_DIR:-$HOME/indexes}
KINDS=${KINDS:-bm25 dense}
corpus=$WIKI18_DIR/wiki-18.jsonl
[ -f "$corpus" ] || { echo "build_wiki18: $corpus is missing: download it first (recipes/retriever/README.md)" >&2; exit 1; }

for kind in $KINDS; do
  case $kind in
    bm25)
      "$PYTHON" -m retriever_server build --kind bm25 --corpus "$corpus" --out "$INDEX_DIR/bm25" ;;
    dense)
      if [ "${ENCODE:-0}" = 1 ]; then
        "$PYTHON" -m retriever_server build --kind dense --corpus "$corpus" --out "$INDEX_DIR/e5" \
          --encoder intfloat/e5-base-v2 --family e5 --index-type flat --batch-size 512 --device cuda
      else
        [ -f "$WIKI18_DIR/e5_Flat.index" ] || { echo "build_wiki18: $WIKI18_DIR/e5_Flat.index is missing: download it or set ENCODE=1" >&2; exit 1; }
        "$PYTHON" -m retriever_server build --kind dense --corpus "$corpus" --out "$INDEX_DIR/e5" \
          --encoder intfloat/e5-base-v2 --family e5 --prebuilt-faiss "$WIKI18_DIR/e5_Flat.index"
      fi ;;
    *) echo "build_wiki18: unknown kind $kind (bm25 or dense)" >&2; exit 1 ;;
  esac
done
