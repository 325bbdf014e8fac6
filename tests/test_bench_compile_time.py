"""bench/compile_time.py on a tiny problem: the modes run, the custom-op mode traces one graph
(fullgraph), the results are written as JSON, an earlier file kept as .prev."""
from __future__ import annotations

import json

from bench import compile_time


def test_compile_time_smoke(tmp_path, capsys):
    out = tmp_path / "compile_time.json"
    rc = compile_time.main(["--n", "60", "--d", "4", "--steps", "1", "--repeats", "1",
                            "--modes", "eager:-,custom-op:aot_eager", "--json", str(out)])
    assert rc == 0
    rows = {r["mode"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["eager"]["graphs"] == 0
    assert rows["custom-op"]["graphs"] == 1 and rows["custom-op"]["compiler"] == "aot_eager"
    assert all(r["first_call_s"] > 0 and r["steady_s"] > 0 for r in rows.values())
    assert "| custom-op | aot_eager |" in capsys.readouterr().out
    # a second run keeps the first's file as .prev (it was replaced without a word before)
    first = out.read_text()
    assert compile_time.main(["--n", "40", "--d", "4", "--steps", "1", "--repeats", "1",
                              "--modes", "eager:-", "--json", str(out)]) == 0
    assert (tmp_path / "compile_time.prev.json").read_text() == first
    assert "kept as" in capsys.readouterr().out
    assert json.loads(out.read_text())["n"] == 40
