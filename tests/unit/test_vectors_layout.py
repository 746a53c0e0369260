"""The stored vector layout (embedstream.vectors): ids, names, codecs and normalisation agree everywhere."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from embedstream import vectors
from embedstream.vectors import (
    FULL,
    int8_decode,
    int8_encode,
    l2_normalize,
    matryoshka_cut,
    mrl_name,
    named_vectors,
    parse_mrl_name,
    point_id,
    query_form,
    scale_key,
    stored_form,
    uint8_decode,
)


def _unit(dim: int, seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return v / np.linalg.norm(v)


def test_point_ids_are_uuid5_of_doc_and_chunk():
    pid = point_id("doc", 3)
    assert uuid.UUID(pid).version == 5
    assert pid == point_id("doc", 3) != point_id("doc", 4) != point_id("doc3", 0)
    assert pid == "f2a40b74-9ba1-55a0-a89c-875727d3cae2"  # ids already stored must never move


def test_mrl_names_are_built_and_parsed_in_one_place():
    for dims in (8, 64, 256):
        assert parse_mrl_name(mrl_name(dims)) == dims
    for other in (FULL, "mrl_", "mrl_0", "mrl_x", "mrl_8_old", "xmrl_8"):
        assert parse_mrl_name(other) is None
    assert scale_key(FULL) == "_scale" and scale_key(mrl_name(16)) == "_scale_16"
    assert vectors.is_layout_key("_scale_16") and not vectors.is_layout_key("lang")


def test_l2_normalize_rows_and_single_vectors_and_zero():
    m = np.array([[3.0, 4.0], [0.0, 0.0]], dtype=np.float32)
    np.testing.assert_allclose(l2_normalize(m), [[0.6, 0.8], [0.0, 0.0]])
    np.testing.assert_allclose(l2_normalize(m[0]), [0.6, 0.8])


def test_matryoshka_cut_renormalises_unless_told_not_to():
    v = _unit(32, 1)
    cut = matryoshka_cut(v, 8)
    np.testing.assert_allclose(cut, v[:8] / np.linalg.norm(v[:8]), rtol=1e-6)
    np.testing.assert_array_equal(matryoshka_cut(v, 8, normalize=False), v[:8])
    assert matryoshka_cut(v, None) is v and matryoshka_cut(v, 32) is v


def test_int8_codec_round_trips_within_half_a_step():
    v = _unit(64, 2)
    codes, scale = int8_encode(v)
    assert codes.dtype == np.int8 and np.abs(codes).max() == 127
    assert np.abs(int8_decode(codes, scale) - v).max() <= scale / 2 + 1e-7
    zero_codes, zero_scale = int8_encode(np.zeros(4, dtype=np.float32))
    assert zero_scale == 1.0 and not zero_codes.any()


def test_uint8_storage_is_int8_shifted_by_128_with_its_scale():
    v = _unit(64, 3)
    stored, scale = stored_form(v, "uint8")
    codes, same_scale = int8_encode(v)
    assert scale == same_scale
    np.testing.assert_array_equal(stored, codes.astype(np.float32) + 128)
    assert stored.min() >= 1 and stored.max() <= 255
    np.testing.assert_array_equal(uint8_decode(stored), codes)
    np.testing.assert_array_equal(query_form(v, "uint8"), stored)
    assert query_form(v, "float32") is v
    f16, none = stored_form(v, "float16")
    assert none is None and np.abs(f16 - v).max() < 1e-3
    with pytest.raises(ValueError, match="int4"):
        stored_form(v, "int4")


def test_named_vectors_hold_full_and_each_matryoshka_size_with_scales():
    v = _unit(32, 4)
    named, scales = named_vectors(v, (16, 8), "uint8")
    assert set(named) == {FULL, "mrl_16", "mrl_8"} and set(scales) == {"_scale", "_scale_16", "_scale_8"}
    restored = (np.array(named["mrl_8"]) - 128) * scales["_scale_8"]
    assert float(l2_normalize(restored) @ matryoshka_cut(v, 8)) > 0.999
    floats, none = named_vectors(v, (16,), "float32")
    assert none == {} and np.allclose(floats["mrl_16"], matryoshka_cut(v, 16))


def test_int8_codec_works_row_by_row_on_a_matrix():
    m = np.stack([_unit(16, 5), 3 * _unit(16, 6), np.zeros(16, dtype=np.float32)])
    codes, scales = int8_encode(m)
    assert codes.shape == m.shape and scales.shape == (3,)
    for row in range(3):
        one_codes, one_scale = int8_encode(m[row])
        np.testing.assert_array_equal(codes[row], one_codes)
        assert scales[row] == one_scale
    np.testing.assert_allclose(int8_decode(codes, scales), m, atol=float(scales.max()) / 2 + 1e-7)
