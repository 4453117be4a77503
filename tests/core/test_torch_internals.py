"""One test per accessor of ``twinkle_fx.core.torch_internals``: each fails when the private torch
name it reaches moves."""

from twinkle_fx.core.torch_internals import inductor_config_values


def test_inductor_config_values_lists_nested_keys_and_is_a_copy():
    values = inductor_config_values()
    # the backend checks options={"inductor": {...}} against these keys, nested ones dotted
    assert isinstance(values["max_autotune"], bool)
    assert "triton.cudagraphs" in values
    values["max_autotune"] = "changed"
    assert inductor_config_values()["max_autotune"] != "changed"
