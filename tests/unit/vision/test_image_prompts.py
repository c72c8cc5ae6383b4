"""Images through the token stream and the scheduler, on the fake tower."""

from __future__ import annotations

import base64
import threading

import numpy as np
import pytest

from fake_vision import expected_logits, png, vision_engine
from warp_providers import ChatFormatError, ChatSession, vision


def _url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _msg(*parts, role="user"):
    return {"role": role, "content": [
        {"type": "text", "text": p} if isinstance(p, str) else
        {"type": "image_url",
         "image_url": {"url": _url(p[0]), **({"detail": p[1]} if len(p) > 1 else {})}}
        for p in parts]}


def test_markup_and_one_placeholder_run_per_image():
    eng = vision_engine()
    s = ChatSession(eng)
    tok = eng.tokenizer
    ph = tok.marker_id("<|media_pad|>")
    a, b = png(40, 90, 1), png(300, 200, 2)
    prep = s.prepare([_msg("look <|media_pad|> here", (a,), (b,), "which?")])
    assert [im.n_tokens for im in prep.images] == [
        vision.for_vision(eng.vision_info()).prepare(x).n_tokens for x in (a, b)]
    ids = prep.ids
    assert ids.count(ph) == sum(im.n_tokens for im in prep.images)
    assert ids.count(tok.marker_id("<|media_begin|>")) == 2
    assert ids.count(tok.marker_id("<|media_end|>")) == 2
    starts = vision.image_spans(ids, ph, [im.n_tokens for im in prep.images])
    assert ids[starts[0] - 1] == tok.marker_id("<|media_content|>")
    # the marker spelled in user text stays text: its bytes are there, no extra placeholder
    text_ids = tok.encode_content("<|media_pad|>")
    assert ph not in text_ids
    assert any(ids[i:i + len(text_ids)] == text_ids for i in range(len(ids)))


def test_images_in_earlier_turns_feed_in_order():
    eng = vision_engine()
    s = ChatSession(eng)
    a, b = png(50, 50, 3), png(60, 120, 4)
    conv = [_msg("first", (a,)), {"role": "assistant", "content": "ok"}, _msg((b,), "and this")]
    prep = s.prepare(conv)
    assert len(prep.images) == 2
    res = eng.generate(prep.ids, images=prep.images, max_tokens=1)
    want = int(np.argmax(expected_logits(eng, prep.ids, prep.images)))
    assert res.token_ids[0] == want
    assert eng._ctx.encoded == [im.grid_thw for im in prep.images]  # the tower, in order
    # rows fed in the other order would give another history
    assert not np.array_equal(expected_logits(eng, prep.ids, prep.images[::-1]),
                              expected_logits(eng, prep.ids, prep.images)) or \
        prep.images[0].n_tokens != prep.images[1].n_tokens


@pytest.mark.parametrize("single", [False, True])
def test_image_at_the_very_end_of_a_prompt(single):
    eng = vision_engine(single=single)
    proc = eng.image_processor()
    im = proc.prepare(png(70, 45, 5))
    ph = eng.vision_info()["placeholder_token_id"]
    ids = eng.tokenizer.encode_content("describe:") + [ph] * im.n_tokens
    res = eng.generate(ids, images=[im], max_tokens=1)
    assert res.token_ids[0] == int(np.argmax(expected_logits(eng, ids, [im])))
    assert eng._ctx.pushed and sum(n for _, n in eng._ctx.pushed) == im.n_tokens


def test_chunked_prefill_splits_an_image_run():
    eng = vision_engine(prefill_chunk=7, ctx_kw={"step_seconds": 0.002})
    proc = eng.image_processor()
    ph = eng.vision_info()["placeholder_token_id"]
    ims = [proc.prepare(png(90, 130, 6)), proc.prepare(png(30, 30, 7))]
    prompts = []
    for k, im in enumerate(ims):
        ids = eng.tokenizer.encode_content(f"q{k} ") + [ph] * im.n_tokens
        ids += eng.tokenizer.encode_content(" tail text")
        prompts.append((ids, [im]))
    out = [None, None]
    # both prompts are queued together, after both images are encoded (on a loaded
    # machine the second thread may otherwise start after the first prompt is done)
    together, submit = threading.Barrier(2, timeout=30), eng._sched.submit

    def queued_together(req):
        together.wait()
        return submit(req)

    eng._sched.submit = queued_together

    def run(k):
        out[k] = eng.generate(prompts[k][0], images=prompts[k][1], max_tokens=3)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ctx = eng._ctx
    # some evaluation held only part of an image run: the run crossed chunks
    assert any(0 < toks.count(ph) < max(im.n_tokens for im in ims) for call in ctx.calls
               for _, toks in call)
    assert max(len(c) for c in ctx.calls) == 2  # the two prompts were batched
    for k in range(2):
        ids, images = prompts[k]
        assert out[k].token_ids[0] == int(np.argmax(expected_logits(eng, ids, images)))
    assert all(s.pending_embeds == 0 for s in [ctx.seq0, *ctx.free])


def test_prefix_reuse_keys_on_the_pixels():
    eng = vision_engine()
    s = ChatSession(eng)
    a, b = png(80, 80, 8), png(80, 80, 9)
    long_text = "a shared system prompt " * 4
    def conv(img):
        return [{"role": "system", "content": long_text}, _msg("what is it", (img,))]
    first = s.complete(conv(a))
    prep = s.prepare(conv(a))
    start = vision.image_spans(prep.ids, eng.vision_info()["placeholder_token_id"],
                               [prep.images[0].n_tokens])[0]
    same = s.complete(conv(a))
    assert same.usage.cached_tokens > start + prep.images[0].n_tokens
    other = s.complete(conv(b))
    assert 0 < other.usage.cached_tokens <= start
    # the other image's reply comes from its own rows, not the cached first image
    want = int(np.argmax(expected_logits(eng, prep.ids, s.prepare(conv(b)).images)))
    ids_b = s.prepare(conv(b)).ids
    assert eng.generate(ids_b, images=s.prepare(conv(b)).images, max_tokens=1).token_ids[0] == want
    assert first.message.content == same.message.content


def test_no_tower_refuses_images_and_text_still_runs():
    eng = vision_engine(vision=False)
    s = ChatSession(eng)
    assert not s.vision
    with pytest.raises(ChatFormatError, match="without a vision tower") as info:
        s.prepare([_msg("hi", (png(20, 20),))])
    assert info.value.code == "vision_disabled" and info.value.param == "messages"
    assert s.complete([{"role": "user", "content": "hi"}]).message is not None


def test_placeholders_without_images_are_refused():
    eng = vision_engine()
    ph = eng.vision_info()["placeholder_token_id"]
    with pytest.raises(ValueError, match="placeholder"):
        eng.generate([1, 2, ph, ph], max_tokens=1)
    im = eng.image_processor().prepare(png(60, 60))
    assert im.n_tokens > 1
    with pytest.raises(ValueError, match="placeholder"):
        eng.generate([1, 2, ph], images=[im], max_tokens=1)


def test_detail_low_takes_fewer_positions():
    eng = vision_engine()
    s = ChatSession(eng)
    big = png(900, 1200, 10)
    low = s.prepare([_msg((big, "low"), "x")])
    high = s.prepare([_msg((big, "high"), "x")])
    assert low.images[0].n_tokens < high.images[0].n_tokens
    assert len(low.ids) < len(high.ids)


def test_a_refused_batch_leaves_no_rows_queued():
    # the fake refuses a chunk holding token 5: the batch fails, each request reruns alone,
    # and the good one must get its rows once, not twice
    eng = vision_engine(prefill_chunk=64,
                        ctx_kw={"refuse": frozenset({5}), "step_seconds": 0.002})
    proc = eng.image_processor()
    ph = eng.vision_info()["placeholder_token_id"]
    good, bad = proc.prepare(png(40, 40, 11)), proc.prepare(png(40, 40, 12))
    ids_good = eng.tokenizer.encode_content("ok ") + [ph] * good.n_tokens + [7, 8]
    ids_bad = [5, 6] + [ph] * bad.n_tokens + [7, 8]
    out, errs = {}, {}

    def run(name, ids, im):
        try:
            out[name] = eng.generate(ids, images=[im], max_tokens=1)
        except ValueError as exc:
            errs[name] = exc

    threads = [threading.Thread(target=run, args=a)
               for a in (("good", ids_good, good), ("bad", ids_bad, bad))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert "bad" in errs and "good" in out
    assert out["good"].token_ids[0] == int(np.argmax(expected_logits(eng, ids_good, [good])))
    ctx = eng._ctx
    assert all(s.pending_embeds == 0 for s in [ctx.seq0, *ctx.free])


def test_count_tokens_counts_image_positions():
    eng = vision_engine()
    s = ChatSession(eng)
    conv = [_msg("hi", (png(90, 60, 13),))]
    n = s.count_tokens(conv)
    prep = s.prepare(conv)
    text = [{"role": "user", "content": "hi"}]
    hand_over = len(s.prepare(text).ids) - s.count_tokens(text)
    assert n > prep.images[0].n_tokens
    assert n == len(prep.ids) - hand_over
