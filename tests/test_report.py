"""Boards from tracking rows (best valid score, full-deck mean with failures as 0, repeats, pass@k, flagged cells
shown but never ranked and capped worst first, dollars and tokens, a harness column, infra counts and sweeps with
nothing scored, CPU boards marked), the report files and plots, and the `report` / `export` verbs."""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kbsweep.reporting.figures import pareto
from kbsweep.reporting.render import (
    board_figures,
    board_table,
    flagged_table,
    fmt,
    kernelbench_table,
    render_html,
    render_markdown,
    render_terminal,
    write_report,
)
from kbsweep.reporting.report import build_boards, mean_ci95, pass_at_k
from kbsweep.tracking.cell_result import CellResult
from kbsweep.tracking.tracker import Tracker
from tests.test_tracking import artifact_paths, log_cell, make_cell, write_result

REPO = Path(__file__).resolve().parent.parent
PARAMS = {"roofline.dram_gbps": "3350", "roofline.peaks_tflops.bf16": "989", "problem.peak": "bf16", "shape0": "m=1024"}


def row(model, problem, repeat, outcome="pass", score=0.5, verdict="clean", usd=1.0, start=1, status="FINISHED"):
    """One cell run as mlflow_store.runs_frame gives it."""
    found = {
        "track": "hard",
        "gpu": "h100",
        "model": model,
        "problem": problem,
        "repeat": str(repeat),
        "outcome": outcome,
        "verdict": verdict,
        "cost_usd": usd,
        "tokens_output": 1000.0,
        "tokens_input": 9000.0,
        "run_id": f"{model}-{problem}-{repeat}-{start}",
        "status": status,
        "start_time": start,
        "experiment": "hard",
        "cell_key": f"{model}|{problem}|{repeat}",
        "params": PARAMS,
        "shape0.ms": 1.0,
        "shape0.tflops": 100.0 * (score or 0.1),
        "shape0.gbps": 500.0,
    }
    if outcome == "pass":
        found["score"] = score
    return found


ROWS = [
    *[row("alpha", "hard/p1", r, score=s, start=10) for r, s in enumerate((0.5, 0.6, 0.7))],
    row("alpha", "hard/p1", 2, score=0.99, start=5),  # an older record of the same cell (a --force rerun replaced it)
    *[row("alpha", "hard/p2", r, outcome="incorrect") for r in range(3)],
    row("beta", "hard/p1", 0, score=0.9, verdict="reward_hack", usd=0.5),
    *[row("beta", "hard/p1", r, outcome="incorrect", usd=0.5) for r in (1, 2)],
    row("beta", "hard/p2", 0, score=0.2, usd=0.5),
    *[row("beta", "hard/p2", r, outcome="runtime_error", usd=0.5) for r in (1, 2)],
    row("beta", "hard/p2", 1, outcome="rate_limited", usd=0.5, start=20, status="FAILED"),  # infra: never counts
]


@pytest.mark.fast
def test_board_ranks_mean_valid_scores_over_the_full_deck_and_the_repeats():
    [board] = build_boards(ROWS)
    assert (board["track"], board["gpu"], board["deck"], board["k"]) == ("hard", "h100", ["hard/p1", "hard/p2"], 3)
    alpha, beta = board["models"]
    assert (alpha["model"], alpha["rank"], beta["model"], beta["rank"]) == ("alpha", 1, "beta", 2)
    assert alpha["means"] == {"hard/p1": pytest.approx(0.6), "hard/p2": 0.0} and alpha["best"] == {
        "hard/p1": 0.7
    }  # p2 failed: 0
    assert beta["means"] == {"hard/p1": 0.0, "hard/p2": pytest.approx(0.2 / 3)}  # the flagged 0.9 is not ranked
    assert beta["flagged"] == {"hard/p1": {"score": 0.9, "verdict": "reward_hack", "run_id": "beta-hard/p1-0-1"}}
    assert (alpha["passed"], alpha["cells"], beta["passed"], beta["flagged_cells"], beta["cells"]) == (3, 6, 1, 1, 6)
    # repeats: per-repeat deck means 0.25, 0.30, 0.35 → mean 0.30 (the mean of the problems' means) ± t(0.975, 2)·0.05/√3
    assert alpha["deck_mean"] == pytest.approx(0.3) and alpha["deck_ci95"] == pytest.approx(
        4.302653 * 0.05 / math.sqrt(3), rel=1e-5
    )
    assert (alpha["pass_at_1"], alpha["pass_at_k"]) == (pytest.approx(0.5), pytest.approx(0.5))
    assert (beta["pass_at_1"], beta["pass_at_k"]) == (pytest.approx(1 / 6), pytest.approx(0.5))
    assert (alpha["usd"], beta["usd"], beta["usd_per_pass"], alpha["tokens_output_per_pass"]) == (6.0, 3.0, 3.0, 2000.0)
    assert [(c["model"], c["problem"], c["repeat"]) for c in board["cells"] if c["flagged"]] == [
        ("beta", "hard/p1", "0")
    ]
    assert [p["tflops"] for p in board["shapes"]["hard/p1"]["alpha"]] == pytest.approx(
        [50.0, 60.0, 70.0]
    )  # every valid repeat's


@pytest.mark.fast
def test_terminal_table_shows_flagged_cells_without_ranking_them():
    text = render_terminal(build_boards(ROWS))
    assert "kbsweep leaderboard — hard / h100" in text and "pass@3" in text and "audit-flagged — hard / h100" in text
    beta_line = next(line for line in text.splitlines() if "beta" in line and "DQ(0.9)" in line)
    assert re.search(r"│\s*2\s*│\s*beta\s*│\s*builtin\s*│", beta_line)
    assert "reward_hack" in text and "p1 mean" in text and "deck mean ± CI95" in text and "mean over repeats" in text


@pytest.mark.fast
def test_terminal_table_never_truncates_names_at_160_columns():
    model = "a-model-with-a-very-long-name-from-some-provider/and-its-route"
    rows = [{**r, "model": model} for r in ROWS if r["model"] == "alpha"]
    rows += [row(model, f"hard/problem-number-{i}-with-a-long-name", 0) for i in range(6)]
    text = render_terminal(build_boards(rows), width=160)
    assert model in text and max(map(len, text.splitlines())) <= 160


@pytest.mark.fast
@pytest.mark.parametrize("width", [80, None])  # None: stdout piped, no limit
def test_terminal_board_shows_every_number_whole_at_80_columns_and_piped(width, monkeypatch):
    monkeypatch.setattr(sys, "stdout", io.StringIO())  # not a terminal
    model = "a-long-model-name/of-a-provider"
    rows = [
        {
            **row(model, "hard/a-long-problem-name", r, score=5.123e-05, usd=0.0004),
            "score_public": 6.2e-05,
            "score_held_out": 4.1e-05,
        }
        for r in range(3)
    ]
    rows += [row("big", "hard/a-long-problem-name", 0, score=123456.7, usd=12345.678)]
    [board] = build_boards(rows)
    text = render_terminal([board], width=width)
    assert "…" not in text and (width is None or max(map(len, text.splitlines())) <= width)
    header, table = board_table(board)
    words = set(text.split())
    assert all(word in words for line in table for cell in line for word in cell.split())  # every name and number whole
    assert {"0.0000512", "123457", "0.0004", "12346"} <= words and not re.search(r"\de-\d", text)
    assert all(word in words for name in header for word in name.split())  # headers wrap at their words, never cut


@pytest.mark.fast
def test_numbers_have_three_significant_figures_in_positional_notation():
    assert [fmt(v) for v in (5.123e-05, 0.26667, 0.9996, 12.345, 123456.7, 6.0, 0.0, None)] == [
        "0.0000512",
        "0.267",
        "1",
        "12.3",
        "123457",
        "6",
        "0",
        "–",
    ]


def test_a_board_per_sweep():
    other = [{**r, "experiment": "hard-again", "run_id": r["run_id"] + "-again"} for r in ROWS if r["model"] == "beta"]
    boards = build_boards(ROWS + other)
    assert [(b["sweep"], [m["model"] for m in b["models"]]) for b in boards] == [
        ("hard", ["alpha", "beta"]),
        ("hard-again", ["beta"]),
    ]
    text = render_terminal(boards)
    assert "kbsweep leaderboard — hard / h100" in text and "kbsweep leaderboard — sweep hard-again: hard / h100" in text


@pytest.mark.fast
def test_harness_is_a_column_and_every_entrant_shows_its_infra_count():
    """The same model under two harnesses: two rows with the harness in its own column. An entrant whose cells all
    ended in infrastructure is listed, unranked, with its count; a cell with a scored record counts no infra."""
    rows = ROWS + [
        {**r, "harness": "claude-code", "run_id": r["run_id"] + "-cc", "cell_key": r["cell_key"] + "|cc"}
        for r in ROWS
        if r["model"] == "alpha"
    ]
    rows += [
        {**row("gamma", "hard/p1", r, outcome="rate_limited", start=30 + r, status="FAILED"), "harness": "codex"}
        for r in range(2)
    ]
    [board] = build_boards(rows)
    assert [(e["model"], e["harness"], e["infra"]) for e in board["models"]] == [
        ("alpha", "builtin", 0),
        ("alpha", "claude-code", 0),
        ("beta", "builtin", 0),
    ]
    assert board["unscored"] == [
        {"entrant": "gamma@codex", "model": "gamma", "harness": "codex", "infra": 2, "outcomes": {"rate_limited": 2}}
    ]
    header, table = board_table(board)
    assert [r[:3] for r in table] == [
        ["1", "alpha", "builtin"],
        ["2", "alpha", "claude-code"],
        ["3", "beta", "builtin"],
        ["–", "gamma", "codex"],
    ]
    assert [r[header.index("infra")] for r in table] == ["0", "0", "0", "2"] and table[-1][
        header.index("deck mean ± CI95")
    ] == "–"
    text = render_terminal([board])
    assert not re.search(r"(alpha|gamma)@", text) and re.search(
        r"│\s*–\s*│\s*gamma\s*│\s*codex\s*│", text
    )  # no model@harness rows


@pytest.mark.fast
def test_a_sweep_whose_cells_all_ended_in_infrastructure_has_nothing_scored():
    flaky = [
        {**row("alpha", f"hard/p{n}", 0, outcome=o, start=40, status="FAILED"), "experiment": "flaky"}
        for n, o in ((1, "rate_limited"), (2, "provider_error"))
    ]
    boards = build_boards(ROWS + flaky)
    [nothing, ok] = boards  # by sweep name
    assert (ok["sweep"], nothing["sweep"], nothing["models"], nothing["deck"]) == ("hard", "flaky", [], [])
    assert nothing["unscored"][0]["infra"] == 2 and nothing["experiments"] == ["flaky"]
    text = render_terminal(boards)
    section = text[
        text.index("kbsweep leaderboard — sweep flaky: hard / h100") : text.index("kbsweep leaderboard — hard / h100")
    ]
    assert (
        "nothing scored: all 2 cells ended in an infrastructure outcome (provider_error 1, rate_limited 1)"
        in " ".join(section.split())
    )
    assert "beta" not in section and "0.3" not in section  # no other sweep's entrant or score
    assert "nothing scored" in render_markdown([nothing]) and "nothing scored" in render_html([nothing], {})
    assert board_figures(nothing) == {}


@pytest.mark.fast
def test_the_audit_flagged_list_is_capped_worst_first():
    rows = [
        row("m", f"hard/p{n}", 0, score=n / 100, verdict="needs_human" if n % 3 else "reward_hack")
        for n in range(1, 31)
    ]
    header, table = flagged_table(build_boards(rows)[0])
    assert len(table) == 21 and table[-1][0] == "… and 10 more"
    verdicts = [r[header.index("verdict")] for r in table[:-1]]
    assert verdicts == ["reward_hack"] * 10 + ["needs_human"] * 10  # every reward hack first, the highest score first
    assert [r[header.index("problem")] for r in table[:3]] == ["hard/p30", "hard/p27", "hard/p24"]
    assert "… and 10 more" in render_terminal(build_boards(rows))


@pytest.mark.fast
def test_a_cpu_board_is_marked_plumbing_only_and_its_kernelbench_verdict_shrunk():
    rows = [
        {
            **r,
            "gpu": "cpu",
            "experiment": "kernelbench",
            "params": {**r["params"], "gpu.device": "cpu"},
            "verdict.kernelbench": "correct",
            "verdict.kbsweep": r["outcome"],
        }
        for r in kernelbench_rows()
        if "level1" in r["problem"]
    ]
    [board] = build_boards(rows)
    assert board["cpu"]
    text = " ".join(render_terminal([board]).split())
    assert (
        "kbsweep leaderboard — kernelbench / cpu · cpu: plumbing only" in text
        and "KernelBench metrics — kernelbench / cpu · cpu: plumbing only" in text
    )
    assert {"KB correct (cpu)", "fast_1.5 (cpu)", "geomean eager (cpu)"} <= set(
        kernelbench_table(board)[0]
    ) and "fast_1 (cpu)" in board_table(board, False)[0]
    assert "computed at shrunk sizes (docs/kernelbench.md) and can differ from KernelBench's at the real size" in text
    for page in (render_markdown([board]), html.unescape(render_html([board], {}))):
        assert "cpu: plumbing only" in page and "can differ from KernelBench's at the real size" in page
    assert not build_boards(kernelbench_rows())[0]["cpu"]


@pytest.mark.fast
def test_pareto_pass_at_k_and_confidence_interval():
    assert pareto({"a": (1, 0.5), "b": (2, 0.4), "c": (3, 0.9), "d": (0.5, 0.1), "e": (1, 0.2)}) == ["d", "a", "c"]
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10) and pass_at_k(3, 0, 3) == 0 and pass_at_k(2, 1, 5) == 1
    assert mean_ci95([0.4]) == (0.4, None)
    mean, half = mean_ci95([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5 and half == pytest.approx(3.182446 * math.sqrt(5 / 3) / 2, rel=1e-5)


def test_report_files_embed_the_plots(tmp_path):
    paths = write_report(build_boards(ROWS), tmp_path)
    plots = sorted(p.name for p in (tmp_path / "plots" / "hard_h100").iterdir())
    assert plots == ["capability_vs_output_tokens.png", "pareto_dollars.png", "roofline_p1.png", "roofline_p2.png"]
    page = paths["html"].read_text()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 4 and all(base64.b64decode(i).startswith(b"\x89PNG") for i in images)
    assert "DQ(0.9)" in page and "Audit-flagged" in page
    assert "| 2 | beta | builtin | DQ(0.9) | 0.0667 |" in paths["markdown"].read_text()
    board = json.loads(paths["json"].read_text())["boards"][0]
    assert [m["model"] for m in board["models"]] == ["alpha", "beta"] and board["models"][0]["best"] == {"hard/p1": 0.7}


@pytest.fixture
def logged_store(store):
    """A store with one sweep: a clean pass on scale_shift and a flagged pass on row_softmax."""
    outputs, uri = store
    tracker = Tracker(uri, str(outputs / "mlartifacts"), "demo")
    tracker.start_sweep({"launcher": "inline"}, 2)
    log_cell(tracker, make_cell(outputs, problem="scale_shift"), score=0.4)
    secret_cell = make_cell(outputs, problem="row_softmax")
    result = write_result(secret_cell, score=0.8, verdict="reward_hack")
    with open(Path(result["folder"]) / "transcript.jsonl", "a") as fh:
        fh.write(json.dumps({"ts": 1_796_000_004.0, "type": "user", "content": "key tok-9f8e7d6c5b4a"}) + "\n")
    tracker.finish_cell(tracker.start_cell(secret_cell), CellResult.from_json(result))
    tracker.end_sweep("FINISHED", {})
    return outputs, tracker


def cli(outputs: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "KBSWEEP_OUTPUTS": str(outputs), **env}
    return subprocess.run(
        [sys.executable, "-m", "kbsweep.cli", *args], cwd=REPO, env=full, capture_output=True, text=True, timeout=300
    )


def test_report_verb_writes_files_and_logs_them_to_the_sweep_run(logged_store):
    outputs, tracker = logged_store
    proc = cli(outputs, "report")
    assert proc.returncode == 0, proc.stderr
    assert (
        "kbsweep leaderboard — demo / cpu" in proc.stdout and "DQ(0.8)" in proc.stdout and "reward_hack" in proc.stdout
    )
    assert {"report.html", "report.md", "report.json"} <= {p.name for p in (outputs / "reports").iterdir()}
    [sweep] = tracker.client.search_runs([tracker.experiment_id], "tags.`kbsweep.kind` = 'sweep'")
    logged = artifact_paths(tracker.client, sweep.info.run_id)
    assert {
        "report/report.html",
        "report/plots/demo_cpu/pareto_dollars.png",
        "report/plots/demo_cpu/roofline_scale_shift.png",
    } <= logged


def test_report_verb_says_nothing_scored_for_a_sweep_left_in_infrastructure(logged_store):
    """A second sweep whose one cell was rate limited: its board lists the entrant with its infra count and says
    nothing was scored; the first sweep's scores stay on the first sweep's board."""
    outputs, _ = logged_store
    tracker = Tracker(f"sqlite:///{outputs}/mlflow.db", str(outputs / "mlartifacts"), "flaky")
    tracker.start_sweep({"launcher": "inline"}, 1)
    log_cell(tracker, make_cell(outputs, sweep="flaky"), outcome="rate_limited")
    tracker.end_sweep("FINISHED", {})
    proc = cli(outputs, "report")
    assert proc.returncode == 0, proc.stderr
    flaky = proc.stdout[proc.stdout.index("kbsweep leaderboard — sweep flaky: demo / cpu · cpu: plumbing only") :]
    assert "nothing scored: all 1 cells ended in an infrastructure outcome (rate_limited 1)" in " ".join(flaky.split())
    assert re.search(r"│\s*–\s*│\s*scripted\s*│\s*builtin\s*│", flaky) and "0.4" not in flaky and "DQ" not in flaky
    assert "## sweep flaky: demo / cpu · cpu: plumbing only" in (outputs / "reports" / "report.md").read_text()


def test_export_verb_writes_a_redacted_dataset_folder(logged_store, tmp_path):
    outputs, tracker = logged_store
    out = outputs / "dataset"  # a relative out= lands under outputs/, never in the working folder
    proc = cli(outputs, "export", "+out=dataset", KBSWEEP_EXPORT_TOKEN="tok-9f8e7d6c5b4a")
    assert proc.returncode == 0, proc.stderr
    assert (
        "exported 2 runs (2 traces)" in proc.stdout and "Downloading artifacts" not in proc.stderr
    )  # no progress bars
    assert not (REPO / "dataset").exists()
    index = {r["problem"]: r for r in map(json.loads, (out / "index.jsonl").read_text().splitlines())}
    assert index["demo/scale_shift"]["verdict"] == "clean" and index["demo/scale_shift"]["score"] == 0.4
    assert index["demo/row_softmax"]["verdict"] == "reward_hack" and index["demo/row_softmax"]["cost_usd"] == 0.05
    files = sorted((out / "traces").iterdir())
    assert [f"traces/{f.name}" for f in files] == sorted(r["trace"] for r in index.values())
    records = [json.loads(line) for line in (out / index["demo/row_softmax"]["trace"]).read_text().splitlines()]
    assert [r["type"] for r in records[:3]] == ["custom-title", "ai-title", "mode"]
    body = records[3:]
    assert body[0]["parentUuid"] is None and all(b["parentUuid"] == a["uuid"] for a, b in zip(body, body[1:]))
    everything = "".join(p.read_text() for p in out.rglob("*") if p.is_file())
    assert "tok-9f8e7d6c5b4a" not in everything and "[REDACTED]" in everything
    assert "format:agent-traces" in (out / "README.md").read_text()


def test_exported_dataset_loads_with_datasets_alone(logged_store):
    """The card's default config (the index) and the traces' raw records load without any undeclared package."""
    import datasets  # the test extra's, as a user of the export has it

    outputs, _ = logged_store
    assert cli(outputs, "export").returncode == 0
    index = datasets.load_dataset(str(outputs / "export"))["train"]
    assert sorted(index["problem"]) == ["demo/row_softmax", "demo/scale_shift"]
    traces = datasets.load_dataset(str(outputs / "export"), "traces", parse_agent_traces=False)["train"]
    assert "custom-title" in traces["type"]


def kernelbench_rows():
    """Two models over 60 problems of level1 and 60 of level2 (120 problems: past the per-problem columns)."""
    rows = []
    for level in ("level1", "level2"):
        for n in range(1, 61):
            for model, fast in (("alpha", n % 3 == 0), ("beta-with-a-long-name", n % 2 == 0)):
                found = row(
                    model,
                    f"kernelbench/{n}_{level}_op",
                    0,
                    outcome="pass" if n % 5 else "incorrect",
                    score=2.5 if fast else 0.8,
                )
                found.update(
                    track="kernelbench",
                    gpu="h200",
                    params={**PARAMS, "track.problems_dir": f"/kb/KernelBench/{level}"},
                    speedup_eager=found.get("score"),
                )
                # no per-shape numbers: they would draw 120 roofline plots (most of this test's time), which the
                # report verb's tests cover; this board's tests are its columns and its heatmap
                for key in ("shape0.ms", "shape0.tflops", "shape0.gbps"):
                    del found[key]
                rows.append(found)
    return rows


def test_a_large_deck_has_per_level_columns_in_120_columns_and_a_heatmap(tmp_path):
    [board] = build_boards(kernelbench_rows())
    assert board["deck"][:3] == ["kernelbench/1_level1_op", "kernelbench/2_level1_op", "kernelbench/3_level1_op"]
    assert board["deck"][60] == "kernelbench/1_level2_op"  # by level, then by number
    alpha = board["levels"]["alpha"]["level1"]
    # level1, alpha: 60 cells, 48 passes (every 5th failed), 16 of them at 2.5x (n % 3 == 0 and n % 5 != 0), the rest 0.8x
    assert (alpha["cells"], alpha["passed"]) == (60, 48)
    assert alpha["fast_1"] == pytest.approx(16 / 60) and alpha["fast_2"] == pytest.approx(16 / 60)
    assert alpha["geomean"] == pytest.approx(math.exp((16 * math.log(2.5) + 32 * math.log(0.8)) / 48))
    text = render_terminal([board])
    assert max(len(line) for line in text.splitlines()) <= 120
    alpha_rows = [line for line in text.splitlines() if "level" in line and "0.267" in line]  # alpha's two level rows
    assert (
        len(alpha_rows) == 2
        and all("48/60" in line and "1.17" in line for line in alpha_rows)
        and "alpha" in alpha_rows[0]
    )
    assert "1_level1_op" not in text  # no column per problem
    page = write_report([board], tmp_path)["html"].read_text()
    heatmap = page[page.index("class='heatmap'") :]
    assert heatmap.count("<td class='hm'") == 2 * 120
    assert "title='kernelbench/15_level1_op: incorrect" in heatmap and "<th colspan='60'>level1</th>" in heatmap
