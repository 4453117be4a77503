import pytest
import torch

from twinkle_fx.core.devices import infer_device, parse_device
from twinkle_fx.core.modes import Mode, format_mode, parse_mode


@pytest.mark.parametrize(
    "text, expected",
    [
        ("train", Mode.TRAINING),
        ("inference", Mode.INFERENCE),
        ("compile", Mode.INFERENCE | Mode.TORCH_COMPILE),
        ("train+compile", Mode.TRAINING | Mode.TORCH_COMPILE),
        ("inference|compile", Mode.INFERENCE | Mode.TORCH_COMPILE),
        (" Train + Compile ", Mode.TRAINING | Mode.TORCH_COMPILE),
    ],
)
def test_mode_strings(text, expected):
    assert parse_mode(text) == expected


def test_hf_kernels_mode_is_accepted():
    import kernels

    assert parse_mode(kernels.Mode.TRAINING | kernels.Mode.TORCH_COMPILE) == Mode.TRAINING | Mode.TORCH_COMPILE
    assert parse_mode(kernels.Mode.INFERENCE) == Mode.INFERENCE


@pytest.mark.parametrize("bad", ["training_mode", "fast", "", "train+inference", 3])
def test_unknown_or_contradictory_mode_is_an_error_naming_valid_modes(bad):
    with pytest.raises(ValueError) as info:
        parse_mode(bad)
    assert "train" in str(info.value)


def test_fallback_only_for_registrations():
    with pytest.raises(ValueError, match="registrations"):
        parse_mode("fallback")
    assert parse_mode("fallback", allow_fallback=True) == Mode.FALLBACK
    assert format_mode(Mode.FALLBACK) == "any"
    # "any mode" is the meaning; FALLBACK (Hugging Face kernels' name) stays as an alias of ANY
    assert Mode.FALLBACK is Mode.ANY and parse_mode("any", allow_fallback=True) is Mode.ANY
    assert format_mode(parse_mode("compile")) == "inference+compile"


def test_devices():
    assert parse_device("cuda:1") == "cuda"
    assert parse_device(torch.device("cpu")) == "cpu"
    with pytest.raises(ValueError, match="valid device types"):
        parse_device("gpu")
    assert infer_device(torch.nn.Linear(2, 2)) == "cpu"
    with pytest.raises(ValueError, match="pass device="):
        infer_device(torch.nn.ReLU())
