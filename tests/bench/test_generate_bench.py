"""``python -m twinkle_fx.bench.generate --tiny``: every row runs generate() on the tiny config,
generates the asked-for tokens, and the fp32 token check compares each row with eager."""

import json

import pytest

from twinkle_fx.bench import generate


@pytest.mark.slow
def test_tiny_generate_bench_runs_every_row_and_compares_tokens(tmp_path, capsys):
    out = tmp_path / "generate.json"
    assert generate.main(["--tiny", "--batches", "2", "--prompt", "8", "--new-tokens", "3", "--repeats", "1",
                          "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = {r["row"]: r for r in result["rows"]}
    assert set(rows) == set(generate.GENERATE_ROWS)
    for row in rows.values():
        assert row["error"] is None, row
        assert row["prefill_ms"] > 0 and row["tokens_equal"] is True, row
    table = capsys.readouterr().out
    assert "| twinkle | 2 |" in table and "fp32 tokens" in table


@pytest.mark.parametrize("argv, message", [(["--rows", "nope"], "unknown row"), (["--new-tokens", "1"], "at least 2"),
                                           (["--batches", "x"], "positive integers")])
def test_bad_arguments_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        generate.main(["--tiny", *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
