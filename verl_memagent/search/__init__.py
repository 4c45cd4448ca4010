"""Search client for the agent loops: talks HTTP to the retriever service, formats results for prompts."""

from verl_memagent.search.client import RetrieverClient, RetrieverError
from verl_memagent.search.documents import Document, format_documents

__all__ = ["Document", "RetrieverClient", "RetrieverError", "format_documents"]
