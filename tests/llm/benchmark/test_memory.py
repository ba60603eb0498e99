"""``python -m llm.memory`` (llm/benchmark/memory.py): XLA's memory analysis of one GRPO update compiled
from abstract shapes, with and without GRPO's supervised anchor (``--anchor-rows``)."""

from __future__ import annotations

import json

from llm.benchmark.memory import analyse_update, main


def test_the_anchored_update_compiles_from_shapes_and_takes_its_batch_as_arguments(capsys):
    rows, prompt, completion = 4, 16, 32
    plain = analyse_update("tiny", rows, prompt, completion)
    anchored = analyse_update("tiny", rows, prompt, completion, anchor_rows=4)
    assert plain.anchor_rows == 0 and anchored.anchor_rows == 4
    # the anchor's TokenBatch: int32 ids and bool mask of the prompt, int32 tokens, bool mask and
    # float32 weights of the completion, for each of its rows; nothing else is added
    assert anchored.argument_bytes - plain.argument_bytes == 4 * (prompt * 5 + completion * 9)
    assert anchored.temp_bytes > plain.temp_bytes  # its rows go through the forward and backward
    assert main(["--preset", "tiny", "--rows", "4", "--prompt", "16", "--completion", "32", "--anchor-rows", "4",
                 "--json"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["anchor_rows"] == 4 and row["preset"] == "tiny"
