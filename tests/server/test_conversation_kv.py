"""Conversations keep their KV: earlier answers come back as the ids the server generated, the prefix cache
reuses the history to the token, and `prefix_cache: true` says why a prompt missed."""

from __future__ import annotations

import time

import httpx
import pytest

from tokenseam.chat_formats import CHATML
from tokenseam.engine.chat_template import ChatTemplate
from tokenseam.engine.turn_memory import make_answer

from .sse import stream_events

pytestmark = [pytest.mark.model, pytest.mark.server]


def char_ids(state, text: str) -> list[int]:
    """One id per character: a tokenization the text never re-tokenizes to (it merges into longer tokens)."""
    out = []
    for ch in text:
        ids = state.tokenizer.encode(ch, add_special=False, parse_special=False)
        assert len(ids) == 1, ch
        out += ids
    return out


def chat(
    url: str, messages: list[dict], force: list[int] | None = None, key: str | None = None, **kw
) -> dict:
    body = {"messages": messages, "temperature": 0, "prefix_cache": True, **kw}
    if force is not None:
        body["_force_ids"] = force
        body.setdefault("max_tokens", len(force) + 1)
    headers = {"authorization": f"Bearer {key}"} if key else {}
    r = httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def cached(r: dict) -> int:
    return r["usage"]["prompt_tokens_details"]["cached_tokens"]


def context(r: dict) -> int:
    return r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"]


def test_generated_ids_come_back_and_the_whole_history_is_reused(server):
    """The answer is generated one id per character; re-tokenizing its text would merge them, so only the
    generated ids make turn 2's prompt continue turn 1's prompt + answer, and the cache reuse all of it."""
    st = server.state
    text = "Hello there, world"
    m1 = [{"role": "user", "content": "Greet me, please."}]
    r1 = chat(server.url, m1, char_ids(st, text))
    assert r1["choices"][0]["message"]["content"] == text
    p1 = st.chat.encode(m1)
    m2 = m1 + [{"role": "assistant", "content": text}, {"role": "user", "content": "Once more."}]
    ids2 = st.chat.encode_prompt(m2, memory=st.turns).ids
    assert ids2[: len(p1) + len(text)] == p1 + char_ids(st, text)
    assert st.chat.encode(m2) != ids2  # plain re-tokenization merges the characters
    r2 = chat(server.url, m2, char_ids(st, "Hi"))
    # the whole previous context: prompt, answer, and its end-of-turn token (decoded after the answer)
    assert cached(r2) >= context(r1) - 1
    report = r2["prefix_cache"]
    assert report["answers_reused"] == 1 and report["answers_cut"] == 0
    assert report["matched_tokens"] == cached(r2)
    # turn 3: both earlier answers come back, and the cache holds the whole of turn 2's context
    m3 = m2 + [{"role": "assistant", "content": "Hi"}, {"role": "user", "content": "Bye."}]
    r3 = chat(server.url, m3, max_tokens=2)
    assert r3["prefix_cache"]["answers_reused"] == 2
    assert cached(r3) >= context(r2) - 1


@pytest.fixture
def gemma3_chatml(gemma3_server, monkeypatch):
    """The Gemma server rendering ChatML (`--chat-template chatml`), whose markers are plain text in Gemma's
    vocabulary."""
    st = gemma3_server.state
    monkeypatch.setattr(st, "chat", ChatTemplate(CHATML, st.vocab, st.tokenizer))
    st.turns.clear()
    yield gemma3_server
    st.turns.clear()


def test_a_whole_answer_keeps_its_last_id_before_plain_template_text(gemma3_chatml):
    """ChatML on Gemma is plain text: re-tokenizing "Done." + "<|im_end|>" merges "." with "<". The whole
    answer is still given back as generated; the template text after it is tokenized on its own, the same way
    every turn."""
    gemma3_server = gemma3_chatml
    st = gemma3_server.state
    text = "All done."
    ids = st.tokenizer.encode(text, add_special=False)
    merged = st.tokenizer.encode(text + "<|im_end|>", add_special=False)
    assert merged[: len(ids)] != ids  # the seam the test is about
    m1 = [{"role": "user", "content": "Finish up."}]
    r1 = chat(gemma3_server.url, m1, ids)
    m2 = m1 + [{"role": "assistant", "content": text}, {"role": "user", "content": "Thanks."}]
    enc = st.chat.encode_prompt(m2, memory=st.turns)
    assert st.vocab.decode_bytes(enc.ids) == st.vocab.decode_bytes(st.chat.encode(m2))
    assert len(enc.spliced) == 1 and not enc.spliced[0].cut and enc.spliced[0].n_ids == len(ids)
    r2 = chat(gemma3_server.url, m2, max_tokens=2)
    assert r2["prefix_cache"]["answers_cut"] == 0
    assert cached(r2) >= context(r1) - 1
    # text the client appended to the answer is its own: the seam is checked, and the answer counts as cut
    more = next(
        x
        for x in ("..", "!!", ")", '"')
        if st.tokenizer.encode(text + x, add_special=False)[: len(ids)] != ids
    )
    m3 = m1 + [{"role": "assistant", "content": text + more}, {"role": "user", "content": "Thanks."}]
    enc3 = st.chat.encode_prompt(m3, memory=st.turns)
    assert enc3.spliced[0].cut and enc3.spliced[0].n_ids < len(ids)
    assert st.vocab.decode_bytes(enc3.ids) == st.vocab.decode_bytes(st.chat.encode(m3))


def test_without_the_memory_the_history_is_re_tokenized(server):
    """The same conversation with the memory cleared: the prefix cache misses at the re-tokenized answer,
    and the report names the cause."""
    st = server.state
    text = "Good morning to you"
    m1 = [{"role": "user", "content": "Say good morning."}]
    r1 = chat(server.url, m1, char_ids(st, text))
    st.turns.clear()
    m2 = m1 + [{"role": "assistant", "content": text}, {"role": "user", "content": "Thanks."}]
    r2 = chat(server.url, m2, max_tokens=2)
    rep = r2["prefix_cache"]
    assert rep["answers_reused"] == 0
    assert cached(r2) < context(r1) - 1
    assert rep["cause"] == "retokenized", rep
    assert rep["at_token"] == rep["matched_tokens"] == cached(r2)


def test_an_edited_answer_is_reused_up_to_the_change(smollm2_server):
    st = smollm2_server.state
    text = "The capital of France is Paris, a large city."
    m1 = [{"role": "user", "content": "What is the capital of France?"}]
    chat(smollm2_server.url, m1, char_ids(st, text))
    edited = "The capital of France is Lyon, a large city."
    m2 = m1 + [{"role": "assistant", "content": edited}, {"role": "user", "content": "Sure?"}]
    enc = st.chat.encode_prompt(m2, memory=st.turns)
    assert len(enc.spliced) == 1 and enc.spliced[0].cut
    # the ids are a tokenization of the edited text: they decode to the rendered prompt
    assert st.vocab.decode_bytes(enc.ids) == st.vocab.decode_bytes(st.chat.encode(m2))
    assert "Lyon" in st.chat.render(m2)
    # the generated ids are used up to the change (at most a healed token or two before it)
    p1 = st.chat.encode(m1)
    kept = enc.spliced[0].n_ids
    assert enc.ids[: len(p1) + kept] == p1 + char_ids(st, text)[:kept]
    assert len("The capital of France is ") - 3 <= kept <= len("The capital of France is ")
    r2 = chat(smollm2_server.url, m2, max_tokens=2)
    assert r2["prefix_cache"]["answers_cut"] == 1
    assert r2["prefix_cache"]["cause"] == "edited"


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.mark.parametrize("arguments", ['{"city":"Paris"}', '{"city":"Par\\u00eds \\/ 1e2"}'])
def test_a_tool_call_sent_back_comes_back_as_its_ids(smollm2_server, arguments):
    """The client sends the call back as the `tool_calls` it got (arguments as JSON text, an escape kept as
    generated) with the tool's result: the call re-renders to the generated bytes, so its generated ids
    (one per character here) come back whole and the cache holds all of the previous context."""
    st = smollm2_server.state
    st.turns.clear()
    call = '<tool_call>{"name":"get_weather","arguments":' + arguments + "}</tool_call>"
    m1 = [{"role": "user", "content": "Weather in Paris?"}]
    r1 = chat(smollm2_server.url, m1, char_ids(st, call), tools=[WEATHER], tool_choice="required")
    msg = r1["choices"][0]["message"]
    assert r1["choices"][0]["finish_reason"] == "tool_calls"
    assert msg["tool_calls"][0]["function"]["arguments"] == arguments
    m2 = m1 + [
        {"role": "assistant", "content": msg["content"], "tool_calls": msg["tool_calls"]},
        {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "sunny, 21 C"},
    ]
    r2 = chat(smollm2_server.url, m2, char_ids(st, "Sunny."), tools=[WEATHER], tool_choice="none")
    rep = r2["prefix_cache"]
    assert rep["answers_reused"] == 1 and rep["answers_cut"] == 0, rep
    assert cached(r2) >= context(r1) - 1


def test_a_tool_call_that_copies_the_prompts_example_comes_back_too(smollm2_server):
    """The model wrote the system prompt's example call word for word: the call's text occurs earlier in the
    prompt, and its later occurrence, where the answer is, is the one given back as the generated ids."""
    from tokenseam.toolcalls import example_call

    st = smollm2_server.state
    st.turns.clear()
    call = example_call(WEATHER)
    m1 = [{"role": "user", "content": "Weather, please."}]
    r1 = chat(smollm2_server.url, m1, char_ids(st, call), tools=[WEATHER], tool_choice="required")
    msg = r1["choices"][0]["message"]
    m2 = m1 + [
        {"role": "assistant", "content": msg["content"], "tool_calls": msg["tool_calls"]},
        {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "rain"},
    ]
    enc = st.chat.encode_prompt(m2, True, [WEATHER], memory=st.turns)
    assert len(enc.spliced) == 1 and not enc.spliced[0].cut
    assert st.vocab.decode_bytes(enc.ids) == st.vocab.decode_bytes(st.chat.encode(m2, True, [WEATHER]))
    r2 = chat(smollm2_server.url, m2, char_ids(st, "Rain."), tools=[WEATHER], tool_choice="none")
    assert r2["prefix_cache"]["answers_reused"] == 1 and cached(r2) >= context(r1) - 1


def test_tenants_do_not_share_answers(smollm2_server):
    st = smollm2_server.state
    text = "Secret plan alpha"
    m1 = [{"role": "user", "content": "Tell me the plan."}]
    chat(smollm2_server.url, m1, char_ids(st, text), key="tenant-a-key")
    m2 = m1 + [{"role": "assistant", "content": text}, {"role": "user", "content": "And?"}]
    other = chat(smollm2_server.url, m2, max_tokens=2, key="tenant-b-key")
    assert other["prefix_cache"]["answers_reused"] == 0
    same = chat(smollm2_server.url, m2, max_tokens=2, key="tenant-a-key")
    assert same["prefix_cache"]["answers_reused"] == 1


def test_stripped_reasoning_is_named(smollm2_server):
    """The cache holds an answer with a reasoning block; the next prompt's history leaves the block out (as a
    thinking model's template does): the report says the prompt dropped text the cache holds."""
    st = smollm2_server.state
    st.turns.clear()
    thought = "<think>Let me count the letters one by one.</think>"
    answer = "It has five letters."
    m1 = [{"role": "user", "content": "How many letters in apple?"}]
    chat(smollm2_server.url, m1, char_ids(st, thought + answer))
    m2 = m1 + [{"role": "assistant", "content": answer}, {"role": "user", "content": "Thanks."}]
    r2 = chat(smollm2_server.url, m2, max_tokens=2)
    rep = r2["prefix_cache"]
    assert rep["cause"] == "template", rep
    assert rep["removed_from"] == "prompt" and rep["removed_bytes"] == len(thought)


def test_eviction_is_named():
    from .conftest import RunningServer

    s = RunningServer("smollm2", n_ctx=512, parallel=1, prefix_cache_tokens=160, prefix_block=16)
    try:
        a = [{"role": "user", "content": "First conversation: " + "alpha " * 40}]
        chat(s.url, a, max_tokens=2)
        for k in range(3):  # push it out of the 160-token cache
            chat(
                s.url, [{"role": "user", "content": f"Other conversation {k}: " + "beta " * 40}], max_tokens=2
            )
        r = chat(s.url, a, max_tokens=2)
        assert r["prefix_cache"]["cause"] == "evicted", r["prefix_cache"]
        assert r["prefix_cache"]["evicted_match_tokens"] > r["prefix_cache"]["matched_tokens"]
        again = chat(s.url, a, max_tokens=2)
        assert again["prefix_cache"]["cause"] == "hit"
    finally:
        s.stop()


def test_the_report_is_streamed_and_absent_unless_asked(smollm2_server):
    url = smollm2_server.url
    m = [{"role": "user", "content": "A short question?"}]
    events, done = stream_events(
        url + "/v1/chat/completions",
        {"messages": m, "max_tokens": 3, "temperature": 0, "stream": True, "prefix_cache": True},
    )
    assert done
    reports = [e["prefix_cache"] for e in events if "prefix_cache" in e]
    assert len(reports) == 1 and reports[0]["prompt_tokens"] > 0
    plain = httpx.post(url + "/v1/chat/completions", json={"messages": m, "max_tokens": 3}, timeout=60).json()
    assert "prefix_cache" not in plain
    for bad in ("yes", 1, [True]):
        r = httpx.post(
            url + "/v1/chat/completions",
            json={"messages": m, "max_tokens": 1, "prefix_cache": bad},
            timeout=60,
        )
        assert r.status_code == 400 and "prefix_cache" in r.text


def test_answers_with_special_text_or_odd_bytes_stay_exact(smollm2_server):
    """Korean and emoji answers (multi-byte characters split across tokens) and an answer the client sends
    back with special-token text: the prompt's ids always decode to the rendered text."""
    st = smollm2_server.state
    text = "안녕하세요 😀 반가워요"
    ids = st.tokenizer.encode(text, add_special=False)
    m1 = [{"role": "user", "content": "Say hello in Korean."}]
    r1 = chat(smollm2_server.url, m1, ids)
    assert r1["choices"][0]["message"]["content"] == text
    for reply in (text, text[:4], text + " more", "<|im_end|>" + text):
        m2 = m1 + [{"role": "assistant", "content": reply}, {"role": "user", "content": "Again"}]
        enc = st.chat.encode_prompt(m2, memory=st.turns)
        assert st.vocab.decode_bytes(enc.ids) == st.vocab.decode_bytes(st.chat.encode(m2)), reply


def test_a_continuing_prompt_is_decoded_in_the_slot_that_holds_it(smollm2_server):
    """The next turn finds its history still in the slot that answered it (nothing restored); after
    clear_cache() nothing is cached. Outputs are forced: greedy text after a prefix decoded in other batch
    shapes may differ in the last bits of the logits."""
    st = smollm2_server.state
    eng = st.engine
    m1 = [{"role": "user", "content": "Name three colours."}]
    r1 = chat(smollm2_server.url, m1, char_ids(st, "Red, green, blue."))
    m2 = m1 + [
        {"role": "assistant", "content": r1["choices"][0]["message"]["content"]},
        {"role": "user", "content": "And three animals?"},
    ]
    hits = eng.resident_hits
    warm = chat(smollm2_server.url, m2, char_ids(st, "Cat, dog, cow."))
    assert eng.resident_hits == hits + 1
    assert cached(warm) >= context(r1) - 1
    assert eng.clear_cache()
    cold = chat(smollm2_server.url, m2, char_ids(st, "Cat, dog, cow."))
    assert cached(cold) == 0 and cold["prefix_cache"]["cause"] == "new"


def test_metrics_export_the_turn_memory_and_resident_slots(smollm2_server):
    st = smollm2_server.state
    before = st.engine.stats.upkeep_decode_seconds
    chat(smollm2_server.url, [{"role": "user", "content": "Count."}], char_ids(st, "1 2 3"))
    deadline = time.monotonic() + 30
    while st.engine.stats.upkeep_decode_seconds == before and time.monotonic() < deadline:
        time.sleep(0.02)  # the answer's last token is decoded once the engine has had nothing else to do
    text = httpx.get(smollm2_server.url + "/metrics", timeout=30).text
    values = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line and not line.startswith("#") and " " in line
    }
    assert values["tokenseam_turn_memory_budget_bytes"] == 64 * 1024 * 1024
    assert values["tokenseam_turn_memory_bytes"] <= values["tokenseam_turn_memory_budget_bytes"]
    assert "tokenseam_turn_memory_hits_total" in values and "tokenseam_prefix_resident_hits_total" in values
    assert values["tokenseam_prefix_resident_tokens"] >= 0
    # the answer's last token was decoded for the cache alone, after it went out: part of decode time
    upkeep = values["tokenseam_engine_upkeep_decode_seconds_total"]
    assert 0 < upkeep <= values["tokenseam_engine_decode_seconds_total"]


def test_a_long_hostile_history_is_handled_in_one_pass(smollm2_server):
    """Thousands of assistant messages (found, or missing from the rendered text): the prompt is keyed and
    scanned in one pass, and its ids are still the rendered text."""
    st = smollm2_server.state
    st.turns.put(st.turns.key("", b"warm"), make_answer([300], st.vocab.token_bytes, st.vocab.is_special))
    msgs = []
    for i in range(3000):
        msgs += [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"answer {i}"}]
    msgs.append({"role": "user", "content": "last"})
    enc = st.chat.encode_prompt(msgs, memory=st.turns)
    assert st.vocab.decode_bytes(enc.ids) == st.vocab.decode_bytes(st.chat.encode(msgs))
    assert enc.spliced == []


def test_an_answer_with_bytes_that_are_no_utf8_comes_back_as_its_ids(smollm2_server):
    """A byte-level model can generate bytes that are no UTF-8 (a lone continuation byte); the client gets
    U+FFFD in their place and sends that back. The memory knows the answer by that text, so the generated
    ids (bad byte included) still come back and the cache reuses the whole history."""
    st = smollm2_server.state
    bad = st.vocab.token_bytes.index(b"\x80")
    head, tail = (
        st.tokenizer.encode("Hello", add_special=False),
        st.tokenizer.encode(" world", add_special=False),
    )
    m1 = [{"role": "user", "content": "Say something odd."}]
    r1 = chat(smollm2_server.url, m1, head + [bad] + tail)
    text = r1["choices"][0]["message"]["content"]
    assert text == "Hello\ufffd world"
    m2 = m1 + [{"role": "assistant", "content": text}, {"role": "user", "content": "Again."}]
    enc = st.chat.encode_prompt(m2, memory=st.turns)
    assert len(enc.spliced) == 1 and not enc.spliced[0].cut
    assert bad in enc.ids
    r2 = chat(smollm2_server.url, m2, max_tokens=2)
    assert r2["prefix_cache"]["answers_reused"] == 1 and r2["prefix_cache"]["answers_cut"] == 0
    assert cached(r2) >= context(r1) - 1
    # the client's own U+FFFD, where the model wrote a valid character, is text like any other
    m3 = m1 + [{"role": "assistant", "content": "Hello\ufffd there"}, {"role": "user", "content": "Again."}]
    enc3 = st.chat.encode_prompt(m3, memory=st.turns)
    assert enc3.spliced and enc3.spliced[0].cut and bad in enc3.ids


def test_an_answer_cut_inside_a_character_is_known_by_the_text_sent():
    """The streamed text leaves out an incomplete last character; the answer's bytes do too, and each id's
    end is counted in that text."""
    from array import array

    parts = [
        b"ab",
        b"\xe4\xb8",
        b"\xad",
        b"\x80",
        b"c",
        b"\xf0\x9f",
    ]  # "ab", "中" split, a bad byte, a cut emoji
    token_bytes = parts + [b""]
    ans = make_answer(list(range(len(parts))), token_bytes, [False] * len(token_bytes))
    assert ans.data == "ab中\ufffdc".encode()
    assert ans.ends == array("i", [2, 2, 5, 8, 9, 9])
    assert list(ans.ids) == list(range(len(parts)))


def test_a_long_prompt_that_begins_like_a_recent_one_reuses_its_ids(smollm2_server):
    """Two completions of a 600-word document with different questions: the second takes the document's ids
    from the tokenization memo (the metrics say how many), and its prompt has exactly the ids of a whole
    tokenization (its token count, and its echoed ids through the llama-server route)."""
    from tokenseam.bench.prefix_cache import document

    st = smollm2_server.state
    doc = document(600, 31)  # about 3.7 KB, 830 tokens: inside the shared server's 1,024-token context

    def metric(name: str) -> float:
        text = httpx.get(smollm2_server.url + "/metrics", timeout=30).text
        return next(float(x.split()[1]) for x in text.splitlines() if x.startswith(name + " "))

    before = metric("tokenseam_tokenize_memo_reused_tokens_total")
    prompts = [doc + "\n\nQuestion: which river? Answer:", doc + "\n\nQuestion: which city is it? Answer:"]
    for prompt in prompts:
        r = httpx.post(
            smollm2_server.url + "/v1/completions",
            json={"prompt": prompt, "max_tokens": 1, "temperature": 0, "token_healing": False},
            timeout=300,
        )
        assert r.status_code == 200, r.text
        want = st.tokenizer._encode(prompt.encode(), False, True)
        assert r.json()["usage"]["prompt_tokens"] == len(want)
    reused = metric("tokenseam_tokenize_memo_reused_tokens_total") - before
    assert reused > len(st.tokenizer._encode(doc.encode(), False)) - 40
    assert metric("tokenseam_tokenize_memo_bytes") <= metric("tokenseam_tokenize_memo_budget_bytes")
    # the ids themselves, through a route that tokenizes the same way and returns them
    r = httpx.post(smollm2_server.url + "/tokenize", json={"content": prompts[1]}, timeout=60)
    assert r.status_code == 200
    assert r.json()["tokens"] == st.tokenizer._encode(prompts[1].encode(), False, False)


def test_an_answer_ended_by_gemmas_own_end_token_misses_it_and_says_so(gemma3_chatml):
    """Under ChatML, an answer that ends with Gemma's `<end_of_turn>` comes back in the next prompt as the
    template's `<|im_end|>` text instead. That one token cannot be reused (the model must read what the
    template wrote), and the report names why."""
    gemma3_server = gemma3_chatml
    st = gemma3_server.state
    eot = 106
    assert st.vocab.token_bytes[eot] == b"<end_of_turn>" and eot in st.backend.eog_ids
    text = "Hello there, friend"
    m1 = [{"role": "user", "content": "Greet me, please, in four words."}]
    r1 = chat(gemma3_server.url, m1, char_ids(st, text) + [eot], max_tokens=40)
    assert r1["choices"][0]["message"]["content"] == text and r1["choices"][0]["finish_reason"] == "stop"
    m2 = m1 + [{"role": "assistant", "content": text}, {"role": "user", "content": "Once more."}]
    r2 = chat(gemma3_server.url, m2, max_tokens=2)
    report = r2["prefix_cache"]
    assert report["answers_reused"] == 1
    assert cached(r2) == context(r1) - 1  # all but the end token
    assert report["cause"] == "end_of_turn" and report["end_token_in"] == "cache"
    assert report["cached"]["ids"][0] == eot


def test_gemmas_own_turns_keep_an_answer_and_its_end_token(gemma3_server):
    """The bundled Gemma GGUF has no chat template: the server renders Gemma's own turns, whose end of turn
    is the model's end token. An answer that ends with `<end_of_turn>` then comes back whole, end token
    included, and the next turn reuses everything the previous one held."""
    st = gemma3_server.state
    assert st.chat.builtin == "gemma"
    st.turns.clear()
    eot = 106
    text = "Hello there, friend"
    m1 = [{"role": "system", "content": "Be warm."}, {"role": "user", "content": "Greet me in three words."}]
    r1 = chat(gemma3_server.url, m1, char_ids(st, text) + [eot], max_tokens=40)
    assert r1["choices"][0]["message"]["content"] == text and r1["choices"][0]["finish_reason"] == "stop"
    m2 = m1 + [{"role": "assistant", "content": text}, {"role": "user", "content": "Once more."}]
    enc = st.chat.encode_prompt(m2, memory=st.turns)
    at = len(st.chat.encode(m1))
    # the answer as generated, and its end token
    assert enc.ids[at : at + len(text) + 1] == char_ids(st, text) + [eot]
    r2 = chat(gemma3_server.url, m2, max_tokens=2)
    assert r2["prefix_cache"]["answers_reused"] == 1
    assert cached(r2) >= context(r1)


def test_an_answer_ended_by_another_end_token_still_comes_back_whole(gemma3_server):
    """Gemma's turns close an answer with `<end_of_turn>`, but the model may end one with `<eos>`, which the
    client never sees. Once the answer went out, the server decodes the template's `<end_of_turn>` at that
    position instead of the `<eos>`, so the next turn's prompt, which holds `<end_of_turn>` there, is reused
    whole."""
    st = gemma3_server.state
    st.turns.clear()
    eos = 1
    assert st.vocab.token_bytes[eos] == b"<eos>" and eos in st.backend.eog_ids and st.chat.turn_end_id == 106
    text = "Hello there, friend"
    m1 = [{"role": "user", "content": "Greet me in three words."}]
    sent_back_whole(gemma3_server, m1, char_ids(st, text) + [eos], text)


def sent_back_whole(server, m1: list[dict], force: list[int], want: str) -> None:
    """The answer `force` makes to `m1` reads `want`; sent back as the client got it, it comes back whole and
    the next turn reuses everything the first one held."""
    r1 = chat(server.url, m1, force)
    assert r1["choices"][0]["message"]["content"] == want
    m2 = m1 + [{"role": "assistant", "content": want}, {"role": "user", "content": "Again."}]
    r2 = chat(server.url, m2, max_tokens=2)
    assert r2["prefix_cache"]["answers_reused"] == 1 and r2["prefix_cache"]["answers_cut"] == 0
    assert cached(r2) >= context(r1)


def test_a_special_token_inside_an_answer_comes_back_with_it(gemma3_server):
    """A base model can generate a special token mid-answer (Gemma's `<start_of_turn>`, not an end token); the
    client's text does not show it. The answer's ids still come back whole, that token included, so the next
    turn reuses the whole previous context."""
    st = gemma3_server.state
    st.turns.clear()
    start = 105
    assert st.vocab.is_special[start] and start not in st.backend.eog_ids
    m1 = [{"role": "user", "content": "Greet me."}]
    force = char_ids(st, "Hello there") + [start] + char_ids(st, " friend") + [106]
    sent_back_whole(gemma3_server, m1, force, "Hello there friend")
    # the client shortened the answer to where the special token was: it is not put back at the cut
    m3 = m1 + [{"role": "assistant", "content": "Hello there"}, {"role": "user", "content": "Again."}]
    enc = st.chat.encode_prompt(m3, memory=st.turns)
    tail = enc.ids[len(st.chat.encode(m1)) :]
    assert start not in tail[: tail.index(106)]  # the answer's ids, up to the template's end of turn
    assert enc.spliced[0].cut


def test_an_answer_with_tag_tokens_comes_back_whole(gemma3_server):
    """Gemma's vocabulary has tag tokens (`<b>`, `</b>`, `<td>`) that are not control tokens: the tokenizer
    takes them whole with or without special parsing, so a message holding them needs no guarding, and an answer
    holding them comes back as generated."""
    st = gemma3_server.state
    st.turns.clear()
    bold, unbold = (st.tokenizer.encode(t, add_special=False) for t in ("<b>", "</b>"))
    assert len(bold) == 1 and len(unbold) == 1 and not st.vocab.is_special[bold[0]]
    assert st.tokenizer.encode("<b>", add_special=False, parse_special=True) == bold
    m1 = [{"role": "user", "content": "Say hi in <b>bold</b>."}]
    force = char_ids(st, "Hi ") + bold + char_ids(st, "there") + unbold + [106]
    sent_back_whole(gemma3_server, m1, force, "Hi <b>there</b>")


@pytest.mark.parametrize("stream", [False, True])
def test_an_answers_last_token_is_decoded_once_the_answer_is_out(smollm2_server, monkeypatch, stream):
    """The server holds a finished answer's last token out of the engine's next step until the answer is
    written out, then releases it: with the engine's time limit for a hold at a minute, the token is decoded
    at once all the same, for a single answer, a batch and a chat answer."""
    import tokenseam.engine.llm_engine as le

    engine = smollm2_server.state.engine
    monkeypatch.setattr(le, "TAIL_HOLD_SECONDS", 60.0)
    url = smollm2_server.url
    for path, body in (
        ("/v1/completions", {"prompt": "The harbor at dawn", "max_tokens": 3}),
        ("/v1/completions", {"prompt": ["One harbor", "Two harbors"], "max_tokens": 2}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Name a boat."}], "max_tokens": 3},
        ),
    ):
        body = {**body, "temperature": 0, "stream": stream}
        r = httpx.post(url + path, json=body, timeout=120)
        assert r.status_code == 200
        end = time.monotonic() + 10
        while engine._tails and time.monotonic() < end:
            time.sleep(0.01)
        assert not engine._tails, path
