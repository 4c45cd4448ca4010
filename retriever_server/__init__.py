"""A retrieval service for search agents: BM25 and dense search over HTTP, speaking Search-R1's
`POST /retrieve` and MemSearcher's `POST /search` / `POST /batch_search`.

A separate service: it imports neither verl nor verl_memagent. Run `python -m retriever_server build`
to make an index directory and `python -m retriever_server serve --index DIR` to serve it.
"""
