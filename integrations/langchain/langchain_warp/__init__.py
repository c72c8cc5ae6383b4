"""LangChain integration of warp-providers: `ChatWarp`, a chat model that runs in-process.

Owns: the package surface (`ChatWarp`). Everything else lives in `chat_models`.
"""

from langchain_warp.chat_models import ChatWarp

__all__ = ["ChatWarp"]
