"""apply_rotary_pos_emb_to_cache: the rotary kernel writing k (rotated) and v into a static KV cache."""

import pytest
import torch
from kernel_test_utils import DTYPES, assert_close, decode_step_inputs

import twinkle_triton as tt


def _inputs(dtype, device, batch=2, heads=6, kv_heads=2, length=3, dim=16, max_len=11):
    return decode_step_inputs(dtype, device, batch, heads, kv_heads, length, dim, max_len)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("positions", [[5], [7, 2, 10]])
def test_matches_rotary_then_index_copy(dtype, positions, device):
    q, k, v, cos, sin, keys, values = _inputs(dtype, device, length=len(positions))
    index = torch.tensor(positions, device=device)
    want_keys, want_values = keys.clone(), values.clone()
    want = tt.apply_rotary_pos_emb_to_cache_reference(q.double(), k.double(), v.double(), cos.double(), sin.double(),
                                                      want_keys.double(), want_values.double(), index)
    with torch.no_grad():
        got = tt.apply_rotary_pos_emb_to_cache(q, k, v, cos, sin, keys, values, index)
    assert_close(got.double(), want, dtype, "rotated q")
    truth_keys = keys.double().index_copy(2, index, tt.apply_rotary_pos_emb_reference(q.double(), k.double(),
                                                                                       cos.double(), sin.double())[1])
    assert_close(keys.double(), truth_keys, dtype, "key cache")
    assert torch.equal(values.index_select(2, index), v), "v is copied into its rows exactly"
    untouched = [i for i in range(keys.shape[2]) if i not in positions]
    assert torch.equal(values[:, :, untouched], want_values[:, :, untouched])
    assert torch.equal(keys[:, :, untouched], want_keys[:, :, untouched])


def test_opcheck_and_aot_eager(device):
    q, k, v, cos, sin, keys, values = _inputs(torch.float32, device, length=2)
    index = torch.tensor([4, 9], device=device)
    torch.library.opcheck(torch.ops.twinkle.apply_rotary_pos_emb_to_cache.default,
                          (q, k, v, cos, sin, keys.clone(), values.clone(), index))
    want_keys, want_values = keys.clone(), values.clone()
    want = tt.apply_rotary_pos_emb_to_cache_reference(q, k, v, cos, sin, want_keys, want_values, index)
    step = torch.compile(lambda *args: tt.apply_rotary_pos_emb_to_cache(*args) * 2, backend="aot_eager",
                         fullgraph=True)
    with torch.no_grad():
        got = step(q, k, v, cos, sin, keys, values, index)
    torch.testing.assert_close(got, 2 * want)
    torch.testing.assert_close(keys, want_keys)
    torch.testing.assert_close(values, want_values)


def test_rejects_what_it_cannot_write_with_a_useful_message(device):
    q, k, v, cos, sin, keys, values = _inputs(torch.float32, device, length=1)
    index = torch.tensor([0], device=device)
    with pytest.raises(ValueError, match=r"key_cache is \(2, 2, 11, 8\).*pass \[2, 2, S_max, 16\]"):
        tt.apply_rotary_pos_emb_to_cache(q, k, v, cos, sin, keys[..., :8], values, index)
    with pytest.raises(ValueError, match="value_cache .*unit-stride rows"):
        tt.apply_rotary_pos_emb_to_cache(q, k, v, cos, sin, keys, values.transpose(2, 3).contiguous().transpose(2, 3),
                                         index)
    with pytest.raises(ValueError, match=r"cache_position is \(2,\)"):
        tt.apply_rotary_pos_emb_to_cache(q, k, v, cos, sin, keys, values, torch.tensor([0, 1], device=device))
    with pytest.raises(ValueError, match="v is"):
        tt.apply_rotary_pos_emb_to_cache(q, k, v[:, :1], cos, sin, keys, values, index)
    with pytest.raises(ValueError, match=r"requires grad(.|\n)*torch.no_grad"):
        tt.apply_rotary_pos_emb_to_cache(q.requires_grad_(), k, v, cos, sin, keys, values, index)
