"""rotary_cache_attention: rotary, the static-cache write, the cache length's advance and grouped-query attention
of a decode step, against transformers' sequence of them in PyTorch."""

import pytest
import torch
from kernel_test_utils import assert_close, decode_step_inputs

import twinkle_triton as tt


def _mask(kind, batch, length, max_len, start, dtype, device):
    """A static cache's decode mask: position l of the step sees cache rows up to start + l."""
    if kind == "none":
        return None
    keep = torch.arange(max_len, device=device)[None, :] <= (start + torch.arange(length, device=device))[:, None]
    keep = keep.expand(batch, 1, length, max_len)
    if kind == "bool":
        return keep
    return torch.zeros(keep.shape, dtype=dtype, device=device).masked_fill(~keep, float("-inf"))


# (batch, heads, kv_heads, length, dim, max_len, start, mask): one decode token with the cache split in two
# (the new row in the second split), three tokens across a split boundary, a group of 24 query heads x 3
# tokens (two blocks of query rows), a float mask at a head dim short of a power of two, no mask.
CASES = [
    (1, 14, 2, 1, 64, 300, 250, "bool"),
    (1, 4, 2, 3, 32, 300, 190, "none"),
    (2, 24, 1, 3, 16, 50, 20, "bool"),
    (3, 6, 2, 2, 40, 37, 30, "float"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("counter", [True, False], ids=["cache_length", "cache_position"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_matches_rotary_cache_write_then_attention(dtype, counter, case, device):
    batch, heads, kv_heads, length, dim, max_len, start, kind = case
    q, k, v, cos, sin, keys, values = decode_step_inputs(dtype, device, batch, heads, kv_heads, length, dim, max_len)
    mask = _mask(kind, batch, length, max_len, start, dtype, device)
    rows = list(range(start, start + length))
    given = torch.tensor(start, device=device) if counter else torch.tensor(rows, device=device)
    name = "cache_length" if counter else "cache_position"
    want_given, want_keys, want_values = given.clone(), keys.double(), values.double()
    want = tt.rotary_cache_attention_reference(
        q.double(), k.double(), v.double(), cos.double(), sin.double(), want_keys, want_values,
        mask.double() if mask is not None and mask.is_floating_point() else mask, **{name: want_given})
    before_keys, before_values = keys.clone(), values.clone()
    with torch.no_grad():
        got = tt.rotary_cache_attention(q, k, v, cos, sin, keys, values, mask, **{name: given})
    assert got.shape == q.shape and got.is_contiguous()
    assert_close(got.double(), want, dtype, "attention output")
    # the cache length advances by the step's tokens; positions are left as they are
    assert torch.equal(given, torch.tensor(start + length, device=device) if counter else want_given)
    assert_close(keys[:, :, rows].double(), want_keys[:, :, rows], dtype, "rotated k in the key cache")
    assert torch.equal(values[:, :, rows], v), "v is copied into its rows exactly"
    others = [i for i in range(max_len) if i not in rows]
    assert torch.equal(keys[:, :, others], before_keys[:, :, others])
    assert torch.equal(values[:, :, others], before_values[:, :, others])


def test_each_call_writes_the_next_rows(device):
    """Two steps in a row: the second writes after the first and attends to both (the length it advanced)."""
    q, k, v, cos, sin, keys, values = decode_step_inputs(torch.float32, device, 1, 4, 2, 1, 16, 12)
    want_keys, want_values = keys.clone(), values.clone()
    length, want_length = torch.tensor(5, device=device), torch.tensor(5, device=device)
    for _ in range(2):
        mask = _mask("bool", 1, 1, 12, length.item(), torch.float32, device)
        want = tt.rotary_cache_attention_reference(q, k, v, cos, sin, want_keys, want_values, mask,
                                                   cache_length=want_length)
        with torch.no_grad():
            got = tt.rotary_cache_attention(q, k, v, cos, sin, keys, values, mask, cache_length=length)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert length.item() == want_length.item() == 7
    torch.testing.assert_close(keys, want_keys, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("counter", [True, False], ids=["cache_length", "cache_position"])
def test_opcheck_and_aot_eager(counter, device):
    q, k, v, cos, sin, keys, values = decode_step_inputs(torch.float32, device, 1, 4, 2, 2, 16, 12)
    mask = _mask("bool", 1, 2, 12, 6, torch.float32, device)

    def rows():  # the new rows 6 and 7, as the counter or as positions
        return {"cache_length": torch.tensor(6, device=device)} if counter else {
            "cache_position": torch.tensor([6, 7], device=device)}

    torch.library.opcheck(torch.ops.twinkle.rotary_cache_attention.default,
                          (q, k, v, cos, sin, keys.clone(), values.clone(), rows().get("cache_position"),
                           rows().get("cache_length"), mask, 0.25))
    want_keys, want_values, want_rows = keys.clone(), values.clone(), rows()
    want = tt.rotary_cache_attention_reference(q, k, v, cos, sin, want_keys, want_values, mask, **want_rows)
    step = torch.compile(lambda *args, **kwargs: tt.rotary_cache_attention(*args, **kwargs) * 2, backend="aot_eager",
                         fullgraph=True)
    got_rows = rows()
    with torch.no_grad():
        got = step(q, k, v, cos, sin, keys, values, mask, **got_rows)
    torch.testing.assert_close(got, 2 * want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(keys, want_keys, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(values, want_values)
    for name, value in got_rows.items():
        assert torch.equal(value, want_rows[name]), name  # the counter advanced to 8, the positions untouched


def test_rejects_what_it_cannot_do_with_a_useful_message(device):
    q, k, v, cos, sin, keys, values = decode_step_inputs(torch.float32, device, 2, 4, 2, 1, 16, 12)
    length = torch.tensor(3, device=device)
    with pytest.raises(ValueError, match="pass one of cache_position .* and cache_length"):
        tt.rotary_cache_attention(q, k, v, cos, sin, keys, values)
    with pytest.raises(ValueError, match=r"cache_length is \(1,\)"):
        tt.rotary_cache_attention(q, k, v, cos, sin, keys, values, cache_length=length[None])
    with pytest.raises(ValueError, match="cache_position is .*float"):
        tt.rotary_cache_attention(q, k, v, cos, sin, keys, values, cache_position=torch.zeros(1, device=device))
    with pytest.raises(ValueError, match=r"rotary_cache_attention: key_cache is \(2, 2, 12, 8\)"):
        tt.rotary_cache_attention(q, k, v, cos, sin, keys[..., :8], values, cache_length=length)
    with pytest.raises(ValueError, match="attn_mask has shape"):
        tt.rotary_cache_attention(q, k, v, cos, sin, keys, values, torch.ones(2, 1, 1, 5, dtype=torch.bool),
                                  cache_length=length)
    with pytest.raises(ValueError, match=r"requires grad(.|\n)*torch.no_grad"):
        tt.rotary_cache_attention(q.requires_grad_(), k, v, cos, sin, keys, values, cache_length=length)
