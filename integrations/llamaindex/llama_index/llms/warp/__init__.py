"""`from llama_index.llms.warp import Warp`: warp_providers models as a LlamaIndex LLM."""

from llama_index.llms.warp.base import Warp

__all__ = ["Warp"]
