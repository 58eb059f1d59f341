"""workload.multimodal: which requests carry media, how many tokens, and that the others are
untouched."""

from __future__ import annotations

import pytest

from servesim.simcore.errors import ScenarioError
from servesim.simcore.rng import RandomStreams
from servesim.workloads.multimodal import MEDIA_SEGMENT_BASE, media_items
from tests.multimodal.helpers import IMAGES, scenario

ENCODER = {"preset": "qwen2-vl-vit"}


def _specs(s):
    return list(s.workload.requests(RandomStreams(s.seed)))


def test_requests_without_media_are_untouched():
    plain = _specs(scenario())
    mixed = _specs(scenario(IMAGES, ENCODER))
    assert len(plain) == len(mixed)
    with_media = 0
    for a, b in zip(plain, mixed):
        assert (a.id, a.arrival_us, a.output_tokens) == (b.id, b.arrival_us, b.output_tokens)
        items = media_items(b.segments)
        if not items:
            assert b.segments is None and b.prompt_tokens == a.prompt_tokens
            continue
        with_media += 1
        assert items == [576, 576]
        assert b.prompt_tokens == a.prompt_tokens + 1152
        assert b.segments[0] == (2 * b.id, a.prompt_tokens)  # its own text, then the images
    assert 0 < with_media < len(plain)


def test_book_lists_the_requests_with_media():
    s = scenario(IMAGES, ENCODER)
    specs = _specs(s)
    book = s.workload.book
    assert list(book.ids) == [x.id for x in specs if media_items(x.segments)]
    assert set(book.tokens) == {1152}


def test_audio_clip_tokens_and_segment_ids():
    s = scenario({"audio_seconds": 10, "tokens_per_second": 25}, ENCODER)
    spec = _specs(s)[0]
    assert media_items(spec.segments) == [250]
    assert all(seg <= -MEDIA_SEGMENT_BASE for seg, _ in spec.segments[1:])


@pytest.mark.parametrize(
    "media, field",
    [
        ({"images": 1}, "workload.multimodal.tokens_per_image"),
        ({"images": 1, "tokens_per_image": 5, "audio_seconds": 3}, "workload.multimodal"),
        ({"images": {"min": 3, "max": 1}, "tokens_per_image": 5}, "workload.multimodal.images.max"),
        ({"audio_seconds": 3, "tokens_per_image": 5}, "workload.multimodal.tokens_per_image"),
        ({"images": 1, "tokens_per_image": 5, "fraction": 0}, "workload.multimodal.fraction"),
        ({"images": 1, "tokens_per_image": 5, "colour": 1}, "workload.multimodal"),
    ],
)
def test_bad_media_sections_name_the_field(media, field):
    with pytest.raises(ScenarioError) as err:
        scenario(media, ENCODER)
    assert field in str(err.value)


def test_media_without_an_encoder_is_refused():
    with pytest.raises(ScenarioError) as err:
        scenario(IMAGES)
    assert "encoder" in str(err.value) and "preset" in str(err.value)


def test_encode_pool_without_an_encoder_is_refused():
    pools = {"encode": {"instances": 1}, "prefill": {"instances": 1}, "decode": {"instances": 1}}
    with pytest.raises(ScenarioError) as err:
        scenario(pools=pools)
    assert "cluster.pools.encode" in str(err.value)


def _spec_workload(chat_media: dict | None, vision_media: dict | None):
    from servesim.workloads.spec import workload_from_config

    def client(cid: str, media: dict | None) -> dict:
        entry = {"id": cid, "input": {"type": "constant", "value": 100}}
        entry["output"] = {"type": "constant", "value": 10}
        if media is not None:
            entry["multimodal"] = media
        return entry

    section = {
        "rate": 10,
        "requests": 60,
        "clients": [client("chat", chat_media), client("vision", vision_media)],
    }
    return workload_from_config(section)


def test_media_per_client_of_a_workload_spec():
    w = _spec_workload(None, {"images": 1, "tokens_per_image": 64})
    specs = list(w.requests(RandomStreams(1)))
    for spec in specs:
        expected = [64] if spec.client == "vision" else []
        assert media_items(spec.segments) == expected
    assert {s.client for s in specs} == {"chat", "vision"}
    assert w.describe()["clients"][1]["multimodal"]["tokens_per_image"] == 64


def test_one_clients_media_never_shift_anothers_draws():
    half = {"images": 1, "tokens_per_image": 64, "fraction": 0.5}
    a = list(_spec_workload(half, {"images": 1, "tokens_per_image": 64}).requests(RandomStreams(1)))
    b = list(_spec_workload(half, {"images": 3, "tokens_per_image": 9}).requests(RandomStreams(1)))
    chat_a = [media_items(s.segments) for s in a if s.client == "chat"]
    chat_b = [media_items(s.segments) for s in b if s.client == "chat"]
    assert chat_a == chat_b and any(chat_a) and not all(chat_a)


def test_bad_client_media_names_the_client():
    with pytest.raises(ScenarioError) as err:
        _spec_workload({"images": 1}, None)
    assert "workload.clients[0].multimodal.tokens_per_image" in str(err.value)
