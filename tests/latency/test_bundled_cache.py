"""The on-disk cache of the bundled YAML files' parses (servesim/latency/bundled.py): what it
returns equals a fresh parse, an edited file is parsed again, and a cache that cannot be used
is passed over without an error."""

from __future__ import annotations

import pytest

from servesim.latency import bundled
from servesim.latency.bundled import CACHE_ENV, cache_file, load_bundled
from servesim.latency.modelspec import _DATA_DIR
from servesim.simcore.config import load_bundled_yaml

TABLE = "gpus:\n  H100: {memory_gb: 80, tflops: 989.5, aliases: [h100-sxm], note: null}\n"


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    directory = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(directory))
    return directory


def table(tmp_path, text=TABLE):
    path = tmp_path / "hardware.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("file", ["hardware.yaml", "models.yaml", "blackbox_coefficients.yaml"])
def test_a_bundled_file_read_back_from_the_cache_equals_its_parse(file, cache_dir, monkeypatch):
    path = _DATA_DIR / file
    parsed = load_bundled_yaml(path.read_text(encoding="utf-8"))
    assert load_bundled(path) == parsed  # parses, writes the cache
    assert cache_file(path, path.read_bytes()).is_file()
    monkeypatch.setattr(bundled, "load_bundled_yaml", None)  # a parse would fail now
    assert load_bundled(path) == parsed


def test_the_second_read_comes_from_the_cache(tmp_path, cache_dir, monkeypatch):
    path = table(tmp_path)
    first = load_bundled(path)
    h100 = {"memory_gb": 80, "tflops": 989.5, "aliases": ["h100-sxm"], "note": None}
    assert first == {"gpus": {"H100": h100}}
    monkeypatch.setattr(bundled, "load_bundled_yaml", None)
    assert load_bundled(path) == first
    assert [p.name for p in cache_dir.iterdir()] == [cache_file(path, path.read_bytes()).name]


def test_an_edited_file_is_parsed_again(tmp_path, cache_dir):
    path = table(tmp_path)
    load_bundled(path)
    table(tmp_path, TABLE.replace("989.5", "1000"))
    assert load_bundled(path)["gpus"]["H100"]["tflops"] == 1000
    assert len(list(cache_dir.iterdir())) == 2  # one per version of the file


def test_a_damaged_cache_file_is_parsed_over_and_replaced(tmp_path, cache_dir):
    path = table(tmp_path)
    cached = cache_file(path, path.read_bytes())
    cache_dir.mkdir()
    cached.write_bytes(b"\xff not marshal")
    assert load_bundled(path)["gpus"]["H100"]["memory_gb"] == 80
    assert cached.read_bytes() != b"\xff not marshal"


def test_an_unwritable_cache_directory_is_no_error(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory", encoding="utf-8")
    monkeypatch.setenv(CACHE_ENV, str(blocker / "cache"))
    assert load_bundled(table(tmp_path))["gpus"]["H100"]["aliases"] == ["h100-sxm"]


def test_a_value_marshal_cannot_hold_is_returned_uncached(tmp_path, cache_dir):
    path = table(tmp_path, "released: 2022-03-22\n")  # YAML makes a datetime.date of it
    assert str(load_bundled(path)["released"]) == "2022-03-22"
    assert not cache_dir.exists() or not list(cache_dir.iterdir())


def test_an_empty_cache_setting_turns_the_cache_off(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, "")
    path = table(tmp_path)
    assert cache_file(path, path.read_bytes()) is None
    assert load_bundled(path)["gpus"]["H100"]["memory_gb"] == 80


def test_without_a_setting_the_cache_is_under_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    path = table(tmp_path)
    assert cache_file(path, path.read_bytes()).parent == tmp_path / "xdg" / "servesim"
