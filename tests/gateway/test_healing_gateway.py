"""Token healing through the gateway: the pieces, the off cases (said in a header, the field not forwarded),
and bad values. The healed path itself runs against a real vLLM in tests/vllm_adapter/test_gateway_vllm.py."""

from __future__ import annotations

import time

import httpx
import pytest

from tokenseam.gateway import cli_gateway
from tokenseam.gateway.healing import HealingNotApplied, TextCutter, heal_with_ids, load_tokenizers
from tokenseam.testing.fake_upstream import FakeUpstream

COMP = "/v1/completions"


def wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_heal_with_ids_rolls_back_the_tail_and_asks_vllm_to_regenerate_it(smollm2_vocab, tokenizers):
    ids = tokenizers["smollm2"].encode("The link is http:")
    plan = heal_with_ids({"prompt": "The link is http:", "token_healing": True}, ids, smollm2_vocab, 4)
    assert plan.removed and b"The link is http:".endswith(plan.removed)
    assert plan.body["prompt"] == ids[: len(ids) - len(plan.report["removed_ids"])]
    assert (
        plan.body["vllm_xargs"] == {"tokenseam_healing": plan.removed.hex()}
        and "token_healing" not in plan.body
    )
    assert plan.header == f"on; removed={len(plan.removed)}"
    stable = heal_with_ids({"prompt": "x"}, tokenizers["smollm2"].encode("Hello.\n"), smollm2_vocab, 0)
    assert stable.removed == b"" and stable.header == "on; removed=0"


def test_the_cutter_removes_the_regenerated_bytes_across_events():
    c = TextCutter(b"http:")
    assert c.cut(0, "ht") == "" and not c.finished(0)
    assert c.cut(0, "tp://www") == "//www" and c.finished(0)
    assert c.cut(0, ".example") == ".example"
    assert c.cut(1, "http://x") == "//x"  # each choice on its own
    with pytest.raises(HealingNotApplied):
        TextCutter(b"http:").cut(0, ", which")
    # A character that straddles the cut stays whole.
    assert TextCutter("é".encode()[:1]).cut(0, "ét") == "ét"


@pytest.mark.parametrize(
    "owned_by,reason",
    [
        ("vllm", "has no tokenseam healing processor"),  # a vLLM without the processor
        ("llamacpp", "has no tokenseam healing processor"),
    ],
)
def test_healing_off_is_said_and_the_field_never_forwarded(gateway, owned_by, reason):
    with FakeUpstream(owned_by=owned_by) as up:
        gw = gateway([up.url])
        r = httpx.post(
            gw.url + COMP, json={"model": "fake-model", "prompt": "The link is http:", "temperature": 0}
        )
        assert r.status_code == 200 and reason in r.headers["x-tokenseam-healing"]
        assert r.headers["x-tokenseam-healing"].startswith("off;") and "token_healing" not in r.json()
        r = httpx.post(
            gw.url + COMP, json={"model": "fake-model", "prompt": "x", "token_healing": 2, "seed": 1}
        )
        assert "token_healing" not in up.state.last_body
        off = httpx.post(gw.url + COMP, json={"model": "fake-model", "prompt": "x", "token_healing": False})
        assert "x-tokenseam-healing" not in off.headers


def test_a_tokenseam_upstream_gets_token_healing_as_sent(gateway):
    with FakeUpstream(owned_by="tokenseam") as up:
        gw = gateway([up.url])
        r = httpx.post(gw.url + COMP, json={"model": "fake-model", "prompt": "x", "token_healing": 3})
        assert r.status_code == 200 and up.state.last_body["token_healing"] == 3
        assert "x-tokenseam-healing" not in r.headers


@pytest.mark.parametrize("value", [17, -1, "yes", 2.5, [1], {"a": 1}])
def test_a_bad_token_healing_is_a_400_before_anything_is_sent(gateway, value):
    with FakeUpstream(owned_by="vllm") as up:
        gw = gateway([up.url])
        wait_for(lambda: gw.pool.replicas[0].detected)
        up.reset()
        r = httpx.post(gw.url + COMP, json={"model": "fake-model", "prompt": "x", "token_healing": value})
        assert r.status_code == 400 and r.json()["error"]["param"] == "token_healing"
        assert up.state.calls == 0


def test_tokenizer_specs(tmp_path, model_paths):
    vocabs = load_tokenizers([f"smollm2={model_paths['smollm2']}"])
    assert vocabs["smollm2"].size > 40000
    for spec, needle in [
        ("smollm2", "expected MODEL=PATH"),
        ("=x", "expected MODEL=PATH"),
        (f"m={tmp_path}", "is not a file"),
        (f"m={tmp_path / 'none.json'}", "is not a file"),
    ]:
        with pytest.raises(ValueError, match=needle):
            load_tokenizers([spec])
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read"):
        load_tokenizers([f"m={bad}"])


def test_a_bad_tokenizer_flag_exits_2(tmp_path, capsys):
    from tokenseam.cli import build_parser

    argv = [
        "gateway",
        "--upstream",
        "http://a:1",
        "--tokenizer",
        f"m={tmp_path}/nope.json",
        "--cache-store",
        "memory",
    ]
    assert cli_gateway.run(build_parser("gateway").parse_args(argv)) == 2
    assert "is not a file" in capsys.readouterr().err
