import numpy as np

from tokenseam.constraint import allocate_token_bitmask, bitmask_from_ids, bitmask_to_bool


def test_bitmask_roundtrip_matches_xgrammar_layout():
    v = 100
    ids = [0, 1, 31, 32, 63, 64, 99]
    m = bitmask_from_ids(ids, v)
    assert m.shape == (4,) and m.dtype == np.int32
    assert m[0] == np.int32(np.uint32(0x80000003).view(np.int32))  # bit 31 is the sign bit
    assert np.flatnonzero(bitmask_to_bool(m, v)).tolist() == ids


def test_allocate_batch():
    assert allocate_token_bitmask(49152, batch=3).shape == (3, 1536)
