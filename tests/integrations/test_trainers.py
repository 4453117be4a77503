"""The README recipes for Hugging Face Trainer, TRL's SFTTrainer and accelerate: a tiny Qwen2, two
optimizer steps on the CPU, losses equal to the same run without kernels.

Trainer keeps only the dataset columns ``inspect.signature(model.forward)`` names, and accelerate
accepts only its own list of Dynamo backends (``TrainingArguments(torch_compile_backend="twinkle")``
fails with "'TWINKLE' is not a valid DynamoBackend"), so the recipes swap kernels before the trainer
sees the model: ``kernelize_model(model)`` and/or ``model.compile(backend="twinkle")`` (in place: the
trainer still gets the ``nn.Module`` and its forward signature).
"""

from __future__ import annotations

import pytest
import torch

from twinkle_fx import kernelize_model
from twinkle_fx.builtin import use_builtin_kernels
from twinkle_fx.compiler import collect_reports
from twinkle_fx.core.swaps import swapped_forward

# the test extra installs them (CI); a machine without them (the GPU machine) skips these recipes
datasets = pytest.importorskip("datasets")
pytest.importorskip("trl")
pytest.importorskip("accelerate")

VOCAB, SEQ, ROWS = 128, 12, 4


def _model() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=VOCAB, pad_token_id=0, eos_token_id=1)
    return Qwen2ForCausalLM(config)


def _token_rows() -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(3, VOCAB, (ROWS, SEQ), generator=generator).tolist()


def _losses(trainer) -> list[float]:
    trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def _trainer(model, tmp_path):
    from transformers import Trainer, TrainingArguments

    rows = _token_rows()
    dataset = datasets.Dataset.from_dict({"input_ids": rows, "labels": rows})
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2, logging_steps=1,
                             report_to=[], save_strategy="no", use_cpu=True, seed=0)
    return Trainer(model=model, args=args, train_dataset=dataset)


@pytest.fixture(scope="module")
def reference_losses(tmp_path_factory) -> list[float]:
    return _losses(_trainer(_model(), tmp_path_factory.mktemp("reference")))


def _builtin() -> None:
    # with the fused-loss head: its swapped forward shows the original signature, so Trainer keeps the columns
    use_builtin_kernels(devices=("cpu",))


@pytest.mark.slow
def test_trainer_with_a_kernelized_model(tmp_path, reference_losses):
    _builtin()
    model = kernelize_model(_model(), mode="train", device="cpu")
    assert sum(swapped_forward(m) is not None for m in model.modules()) == 8  # 5 RMSNorm + 2 MLP + the fused-loss head
    assert _losses(_trainer(model, tmp_path)) == pytest.approx(reference_losses, rel=1e-4)


@pytest.mark.slow
def test_trainer_with_the_twinkle_backend(tmp_path, reference_losses):
    _builtin()
    model = _model()
    model.compile(backend="twinkle", options={"compiler": "aot_eager"})  # in place; Trainer keeps the module
    trainer = _trainer(model, tmp_path)
    with collect_reports() as report:
        losses = _losses(trainer)
    assert losses == pytest.approx(reference_losses, rel=1e-4)
    assert {r.target for r in report.swapped} >= {"Qwen2RMSNorm -> RMSNorm", "Qwen2MLP -> SwiGLUMLP"}


def test_accelerate_refuses_the_backend_name_the_recipe_avoids(tmp_path):
    # why the recipe compiles the model itself: if accelerate ever accepts other backends, revisit it
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), torch_compile=True, torch_compile_backend="twinkle",
                             use_cpu=True, report_to=[])
    with pytest.raises(ValueError, match="'TWINKLE' is not a valid DynamoBackend"):
        Trainer(model=_model(), args=args)


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<eos>", "<unk>"] + [f"w{i}" for i in range(3, VOCAB)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def _sft_losses(model, tmp_path) -> list[float]:
    from trl import SFTConfig, SFTTrainer

    texts = [" ".join(f"w{i}" for i in row) for row in _token_rows()]
    args = SFTConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2, logging_steps=1,
                     report_to=[], save_strategy="no", use_cpu=True, seed=0, max_length=SEQ + 1)
    trainer = SFTTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_dict({"text": texts}),
                         processing_class=_tokenizer())
    return _losses(trainer)


@pytest.mark.slow
def test_trl_sft_trainer_with_a_kernelized_model(tmp_path):
    reference = _sft_losses(_model(), tmp_path / "reference")
    _builtin()
    model = kernelize_model(_model(), mode="train", device="cpu")
    assert sum(swapped_forward(m) is not None for m in model.modules()) == 8
    assert _sft_losses(model, tmp_path / "kernelized") == pytest.approx(reference, rel=1e-4)
    # SFTTrainer installs its own forward on the model (its token-accuracy metrics need the logits), which
    # displaces the fused-loss head; the 5 RMSNorm and 2 MLP swaps stay
    assert swapped_forward(model) is None
    assert sum(swapped_forward(m) is not None for m in model.modules()) == 7


def _accelerate_losses(model) -> list[float]:
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rows = torch.tensor(_token_rows())
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(rows), batch_size=2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for (input_ids,) in loader:
        loss = model(input_ids=input_ids, labels=input_ids).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.slow
def test_accelerate_with_a_kernelized_model():
    reference = _accelerate_losses(_model())
    _builtin()
    model = kernelize_model(_model(), mode="train", device="cpu")
    assert _accelerate_losses(model) == pytest.approx(reference, rel=1e-4)
