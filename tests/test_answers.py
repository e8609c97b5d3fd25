"""Each study's answer (dmls/report/answers.py): templates of report/studies.yaml filled from the
run files, every figure with its interval and a verdict."""

from __future__ import annotations

import re

import pytest
import yaml

from conftest import ROOT, alike
from dmls import record
from dmls.report import answers, comparisons
from dmls.report.study import Study
from fake_runs import fake_metrics

A1 = {
    "factor": ["launcher", "nproc_per_node"],
    "answer": [
        {
            "say": "Against one GPU's samples per second, DDP on 2 GPUs: {ddp}.",
            "compare": {"ddp": {"run": "ddp", "vs": "one", "metric": "samples_per_s"}},
        }
    ],
}


def study(*metrics: dict) -> Study:
    return alike("parallelism", {}, list(metrics))


def one(**kw) -> dict:
    return fake_metrics("one", launcher="single", epochs=3, spread=(0.95, 1.0, 1.05), **kw)


def ddp(samples_per_s: float = 1620.0, **kw) -> dict:
    return fake_metrics("ddp", launcher="torchrun", nproc_per_node=2, epochs=3,
                        samples_per_s=samples_per_s, spread=(0.95, 1.0, 1.05), **kw)  # fmt: skip


def test_an_answer_gives_the_ratio_its_interval_both_means_and_a_verdict():
    [text] = answers.study_answer(A1, study(one(), ddp()))
    match = re.fullmatch(
        r"Against one GPU's samples per second, DDP on 2 GPUs: 1\.62× \("
        r"(\d\.\d\d)–(\d\.\d\d)×; 1,62\d vs 1,00\d samples/s; the two also differ in global "
        r"batch \(64 vs 32: 0\.5× the steps per epoch\)\), faster\.",
        text,
    )
    assert match, text
    assert float(match[1]) < 1.62 < float(match[2])


def test_an_answer_names_the_devices_its_runs_ran_on():
    """Before: the CPU preset's report said "DDP on 2 GPUs 1.02×" of two CPU processes."""
    a1 = {"factor": A1["factor"], "answer": [
        {"say": "With the data {on_the_GPU}, against one {GPU}'s samples per second, DDP on 2 "
                "{GPUs}: {ddp}.", "compare": A1["answer"][0]["compare"]}]}  # fmt: skip
    [on_gpus] = answers.study_answer(a1, study(one(), ddp()))
    assert on_gpus.startswith("With the data on the GPU, against one GPU's samples per "
                              "second, DDP on 2 GPUs: 1.62×")  # fmt: skip
    runs = [one(gpu_mib=None), ddp(gpu_mib=None)]
    for m in runs:
        m["derived"]["device"] = "cpu"
    [on_cpu] = answers.study_answer(a1, study(*runs))
    assert on_cpu.startswith("With the data in memory, against one CPU process's samples per "
                             "second, DDP on 2 CPU processes: 1.62×")  # fmt: skip


def test_a_difference_within_the_seeds_noise_says_so():
    [text] = answers.study_answer(A1, study(one(), ddp(samples_per_s=1010.0)))
    assert text.endswith(", within seed noise."), text


def test_seeds_that_agree_exactly_print_no_range_and_the_rule_decides_the_verdict():
    """Before: a warm process's GPU memory, the same to the byte in every seed, printed
    "1.0050× (1.0050–1.0050×; 88.3 vs 87.9 MiB), heavier", and later "the same in every seed,
    no interval, about the same" for a ratio no interval held 1 in. The one rule: an interval
    of zero width that excludes 1 is a finding, printed with the decimals that show it."""

    def pair(samples_per_s):
        same = {"epochs": 3, "spread": (1.0, 1.0, 1.0)}
        return study(
            fake_metrics("one", launcher="single", **same),
            fake_metrics("ddp", launcher="torchrun", nproc_per_node=2,
                         samples_per_s=samples_per_s, **same),
        )  # fmt: skip

    [text] = answers.study_answer(A1, pair(1004.0))
    assert text.endswith("1.004× (1,004 vs 1,000 samples/s; the two also differ in global batch "
                         "(64 vs 32: 0.5× the steps per epoch); no spread in the seeds "
                         "compared), faster."), text  # fmt: skip
    [text] = answers.study_answer(A1, pair(1000.0))
    # Seed by seed the same (stats.paired): said in words, never as an interval.
    assert text.endswith("the same in every seed), identical in every seed compared."), text


def test_what_every_pair_of_a_sentence_also_differs_in_is_said_once_for_the_sentence():
    """Before: A1's sentences said "the two also differ in global batch (64 vs 32: ...)" after
    each of their two or three comparisons, seven times in three sentences. Where the pairs
    differ in different things, each says its own."""
    entry = {"factor": A1["factor"], "answer": [{
        "say": "Against one GPU: DDP {ddp}; DataParallel {dp}.",
        "compare": {"ddp": {"run": "ddp", "vs": "one", "metric": "samples_per_s"},
                    "dp": {"run": "dp", "vs": "one", "metric": "samples_per_s"}}}]}  # fmt: skip
    dp = fake_metrics("dp", launcher="dp", nproc_per_node=2, epochs=3, samples_per_s=600.0,
                      spread=(0.95, 1.0, 1.05))  # fmt: skip
    [text] = answers.study_answer(entry, study(one(), ddp(), dp))
    assert text.count("global batch") == 1, text
    assert text.endswith("slower; each pair also differs in global batch (64 vs 32: 0.5× the "
                         "steps per epoch)."), text  # fmt: skip
    assert "samples/s), faster; DataParallel" in text, text
    [text] = answers.study_answer(entry, study(one(), ddp(step="eager"), dp))
    assert text.count("global batch") == 2 and "each pair" not in text, text


def test_the_answer_shown_first_keeps_interval_verdict_and_seeds_not_the_means():
    """Before: the Answers list and each section's first screen printed both means and why a
    first seed was left out beside every figure: 6,544 visible words on the example's records."""
    entry = {"factor": A1["factor"], "answer": [{
        "say": "DDP: {s}; memory {m}.",
        "compare": {"s": {"run": "ddp", "vs": "one", "metric": "samples_per_s"},
                    "m": {"run": "ddp", "vs": "one", "metric": "memory"}}}]}  # fmt: skip
    pair = study(one(), ddp())
    [full] = answers.study_answer(entry, pair)
    _, [brief] = answers.study_answers(entry, pair)
    speed = comparisons.compare(pair, "ddp", "one", "samples_per_s", A1["factor"])
    assert "samples/s" in full and "samples/s" not in brief, brief
    value, interval = speed.figure.split(" (")[0], speed.figure.split(" (")[1].split(";")[0]
    assert brief.startswith(f"DDP: {value} ({interval}), {speed.verdict}; memory "), brief
    # GPU memory counts a warm process's seeds: the brief still says which.
    memory = comparisons.compare(pair, "ddp", "one", "memory", A1["factor"])
    assert "warm seeds" in memory.brief and "MiB" not in memory.brief, memory.brief
    assert brief.endswith("; each pair also differs in global batch (64 vs 32: 0.5× the "
                          "steps per epoch)."), brief  # fmt: skip


def test_a_pair_that_differs_in_more_than_the_factor_names_the_difference():
    [text] = answers.study_answer(A1, study(one(), ddp(step="eager")))
    assert "the two also differ in step (eager vs CUDA graph)" in text, text
    # The graphs a step captured follow from the step: not said again ("unset vs 1" before).
    assert "CUDA graphs captured" not in text, text


def test_what_the_spec_implies_is_named_where_two_runs_differ_in_it_beyond_the_factor():
    """Before: A3 set fp8 (one Linear layer in fp8) against fp32 and A7 set accumulation's two
    CUDA graphs against one, unsaid. The global batch is said where the factor is not what
    makes it (DDP doubles it: half the updates), not where it is (A7's accumulation)."""
    fp8 = fake_metrics("fp8", launcher="torchrun", nproc_per_node=2, epochs=3, precision="fp8",
                       spread=(0.9, 1.0, 1.1))  # fmt: skip
    fp8["fp8_linear_layers"] = 1
    bf16 = fake_metrics("bf16", launcher="torchrun", nproc_per_node=2, epochs=3,
                        precision="bf16", spread=(0.9, 1.0, 1.1))  # fmt: skip
    said = str(comparisons.compare(study(fp8, bf16), "fp8", "bf16", "samples_per_s", ["precision"]))
    assert "the two also differ in Linear layers in fp8 (1 vs 0)" in said, said
    accum = [fake_metrics(f"accum{k}", launcher="torchrun", nproc_per_node=2, epochs=3,
                          grad_accum_steps=k, spread=(0.9, 1.0, 1.1)) for k in (1, 2)]  # fmt: skip
    accum[1]["step"]["graphs"], accum[0]["step"]["graphs"] = 2, 1
    grad = alike("grad_accumulation", {}, accum)
    said = str(comparisons.compare(grad, "accum2", "accum1", "memory", ["grad_accum_steps"]))
    assert "the two also differ in CUDA graphs captured (2 vs 1)" in said, said
    assert "global batch" not in said


def test_a_factor_asked_for_but_not_applied_is_said_not_to_explain_the_difference():
    """Before: B3 on a CPU printed "fp16 1.35× (1.27–1.43×; 30,805 vs 22,894 samples/s),
    faster" while accelerate's fp16 on a CPU trained in fp32 (effective_precision fp32): the two
    runs computed the same arithmetic at different moments beside different jobs."""
    runs = {
        p: fake_metrics(
            p,
            launcher="accelerate",
            device="cpu",
            backend="gloo",
            epochs=3,
            precision=p,
            spread=(0.9, 1.0, 1.1),
        )
        for p in ("fp16", "fp32", "bf16")
    }
    runs["fp16"]["samples_per_s"] = 1350.0  # fmt: skip
    runs["fp16"]["effective_precision"] = "fp32"
    s = study(*runs.values())
    said = str(comparisons.compare(s, "fp16", "fp32", "samples_per_s", ["precision"]))
    assert (
        "fp16 computed in fp32 here, as fp32 did (the precision probe measured fp32 in "
        "both): the two ran the same arithmetic, so the difference is not precision's"
    ) in said
    said = str(comparisons.compare(s, "bf16", "fp32", "samples_per_s", ["precision"]))
    assert "same arithmetic" not in said  # (bf16 computed in bf16)


def test_a_model_trained_bare_against_one_inside_ddp_is_said_where_the_launcher_is_the_factor():
    """Before: B2's "1 × 1 1.40× (1.05–1.87×), faster" left out that at one process accelerate
    trains the model bare while torchrun's code wraps it in DDP, whose all-reduce hooks double a
    step of B's MLP even at world size 1 (bench/b_alone.py)."""
    acc = fake_metrics("acc", launcher="accelerate", device="cpu", backend="gloo", epochs=3,
                       spread=(0.9, 1.0, 1.1))  # fmt: skip
    run = fake_metrics("run", launcher="torchrun", device="cpu", backend="gloo", epochs=3,
                       spread=(0.9, 1.0, 1.1))  # fmt: skip
    acc["step"]["wrapper"], run["step"]["wrapper"] = "none", "DistributedDataParallel"
    s = study(acc, run)
    said = str(comparisons.compare(s, "acc", "run", "samples_per_s", ["launcher"]))
    assert "the two also differ in model wrapper (none vs DistributedDataParallel)" in said
    # Where the processes are the factor (A1: one GPU against DDP), the wrapper is by design.
    said = str(
        comparisons.compare(s, "acc", "run", "samples_per_s", ["launcher", "nproc_per_node"])
    )
    assert "model wrapper" not in said


def test_memory_is_compared_over_warm_seeds_and_says_what_each_first_seed_held_more():
    """Before: "the same in every seed, no interval" where seed 0 of a graph job measured
    28–59 MiB more (cuDNN's autotuning in a process's first seed)."""
    graph = fake_metrics("ddp", launcher="torchrun", nproc_per_node=2, epochs=3,
                         spread=(1.2, 1.0, 1.0))  # fmt: skip
    base = fake_metrics("one", launcher="single", epochs=3, spread=(1.1, 1.0, 1.0))
    said = str(comparisons.compare(study(base, graph), "ddp", "one", "memory", A1["factor"]))
    assert said.startswith(
        "1.00× (300.0 vs 300.0 MiB, warm seeds 1 and 2; each job's first "
        "seed measured 60.0 vs 30.0 MiB more (not isolated for these runs; "
        "bench/seed_memory.py measured such an excess as cuDNN's autotuning workspaces, paid "
        "once per process, on another host)"
    ), said
    assert said.endswith("identical in every seed compared"), said


def test_the_step_a_run_took_counts_not_the_step_it_asked_for():
    """A DataParallel run asks for a graph and steps eagerly: against a one-GPU graph run the
    pair differs in its step, which the sentence must say."""
    eager = ddp(eager_reason="DataParallel copies the model to its GPUs from Python")
    [text] = answers.study_answer(A1, study(one(), eager))
    assert "also differ in step (eager vs CUDA graph)" in text, text


def test_a_run_that_did_not_finish_gives_no_number_but_its_reason():
    skipped = fake_metrics("ddp", "skipped", launcher="torchrun", nproc_per_node=2, epochs=3)
    [text] = answers.study_answer(A1, study(one(), skipped))
    assert text == (
        "Against one GPU's samples per second, DDP on 2 GPUs: not measured (ddp skipped: ddp "
        "could not run: no CUDA GPU on this host)."
    )
    assert not re.search(r"\d×", text)


def test_a_reason_repeated_in_an_answer_is_given_once():
    texts = {"answer": [
        {"say": "DDP: {a}; again: {b}.", "compare": {
            "a": {"run": "ddp", "vs": "one", "metric": "samples_per_s"},
            "b": {"run": "ddp", "vs": "one", "metric": "test_accuracy"}}},
        {"say": "Once more: {c}.",
         "compare": {"c": {"run": "ddp", "vs": "one", "metric": "samples_per_s"}}},
    ]}  # fmt: skip
    skipped = fake_metrics("ddp", "skipped", launcher="torchrun", nproc_per_node=2, epochs=3)
    assert answers.study_answer(texts, study(one(), skipped)) == [
        "DDP: not measured (ddp skipped: ddp could not run: no CUDA GPU on this host); again: "
        "not measured (ddp skipped, as above).",
        "Once more: not measured (ddp skipped, as above).",
    ]


def test_the_key_table_gives_a_repeated_skip_reason_once():
    why = "no CUDA GPU on this host"
    skipped = [fake_metrics(name, "skipped", launcher="torchrun", nproc_per_node=2, epochs=3)
               | {"reason": why} for name in ("ddp", "ddp_b64")]  # fmt: skip
    rows = study(one(), *skipped).key_table()["rows"]
    assert [(r["run"], r["reason"]) for r in rows if r["status"] != "ok"] == [
        ("ddp", why), ("ddp_b64", "the reason given for ddp")
    ]  # fmt: skip


def test_a_wide_interval_is_judged_by_the_one_rule_and_too_few_only_below_two_seeds():
    """Before: an interval wider than 20 points (or a factor 4) read "too few seeds to tell"
    even where it excluded zero (A8's RMSprop −12.3 points, −22.9 to −1.7). Now a wide
    interval that holds the null is within seed noise, and "too few" needs a side of one seed."""
    wide = fake_metrics("ddp", launcher="torchrun", nproc_per_node=2, epochs=3,
                        samples_per_s=1620.0, spread=(0.2, 3.0))  # fmt: skip
    base = fake_metrics("one", launcher="single", epochs=3, spread=(0.9, 1.1))
    [text] = answers.study_answer(A1, study(base, wide))
    assert text.endswith(", within seed noise."), text
    single = fake_metrics("ddp", launcher="torchrun", nproc_per_node=2, epochs=3,
                          samples_per_s=1620.0)  # fmt: skip
    [text] = answers.study_answer(A1, study(base, single))
    assert text.endswith("one seed on a side, no interval), too few seeds to tell."), text


def test_memory_grows_with_the_batch_along_a_fitted_line():
    runs = [
        fake_metrics(f"b{b}", launcher="torchrun", nproc_per_node=2, batch_size=b, epochs=3,
                     gpu_mib=60.0 + 0.66 * b, spread=(1.0, 1.0, 1.0))
        for b in (16, 32, 64, 128)
    ]  # fmt: skip
    texts = {
        "answer": [
            {
                "say": "Peak memory {mem}.",
                "fit": {"mem": {"metric": "peak_gpu_mem_allocated_bytes", "against": "batch_size"}},
            }
        ]
    }
    [text] = answers.study_answer(texts, alike("batch_size", {}, runs))
    assert text.startswith(
        "Peak memory grows along a line within noise: 0.660 MiB per unit of batch_size"
    ), text

    def sweep(points):
        return alike("batch_size", {}, [
            fake_metrics(f"b{b}", launcher="torchrun", nproc_per_node=2, batch_size=b, epochs=3,
                         gpu_mib=mib, spread=(1.0, 1.0, 1.0)) for b, mib in points])  # fmt: skip

    # Flat, then rising (the example's A6 under version 3): four points leave one degree of
    # freedom, and the bend's interval holds 0: no bend told from a line (R² once decided it).
    _, [brief] = answers.study_answers(
        texts, sweep(((16, 99.7), (32, 99.9), (64, 117.0), (128, 157.9)))
    )
    assert brief.startswith("Peak memory grows along a line within noise: 0.546 MiB"), brief
    # Five points on a parabola: the bend is a finding, and the slope is the best line's.
    _, [brief] = answers.study_answers(
        texts, sweep(((16, 100.0), (32, 100.5), (64, 112.0), (128, 160.0), (256, 400.2)))
    )
    assert brief.startswith("Peak memory grows, but not along a line: best line "), brief
    assert brief.endswith(")."), brief  # with its R²
    assert (
        "plus 60.0 MiB (R² = 1.000; a least-squares line through the 4 runs' means (warm "
        "seeds 1 and 2 of each))"
    ) in text, text


def test_every_training_studys_answer_names_runs_of_the_config():
    """A template that names a run the config lacks would say "not measured here" forever."""
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    texts = yaml.safe_load((ROOT / "report" / "studies.yaml").read_text())
    for section in texts["sections"]:
        key = section.get("from") or section.get("study")
        if key not in config["studies"]:
            continue
        runs = set(config["studies"][key]["runs"])
        other = config["studies"][key].get("compare_with")
        assert len(section.get("answer") or []) <= 3, section["study"]
        for entry in section.get("answer") or []:
            for c in (entry.get("compare") or {}).values():
                assert c["run"] in runs, (section["study"], c["run"])
                vs_study, _, vs_run = c["vs"].rpartition("/")
                assert vs_run in (set(config["studies"][vs_study]["runs"]) if vs_study else runs)
                assert not vs_study or vs_study == other
                assert c["metric"] in {*comparisons.METRICS, "memory"}


# A measured figure: a duration, a percentage, a ratio with decimals, or a number with two
# decimals (a measured time or version-specific figure), as fixed prose would quote one.
MEASURED = re.compile(r"\d+(?:\.\d+)?\s?(?:ms|µs|s)\b|\d+(?:\.\d+)?\s?%|\d+\.\d+×|\b\d+\.\d{2}\b")


def test_the_report_texts_quote_no_measured_number_outside_a_marked_box():
    """What a run of this folder did not measure sits in `measured_elsewhere` (shown as a box
    naming where and on what it was measured) or in `course_reference`; the rest of the fixed
    text has no such figure, nor do the answers' templates."""
    texts = yaml.safe_load((ROOT / "report" / "studies.yaml").read_text())
    found = []
    for section in texts["sections"]:
        key = section.get("study") or section.get("special")
        prose = [section.get("question") or "", *(section.get("background") or [])]
        for entry in section.get("answer") or []:
            say = entry["say"]
            prose += list(say.values()) if isinstance(say, dict) else [say]
        found += [(key, hit) for text in prose for hit in MEASURED.findall(text)]
        for box in section.get("measured_elsewhere") or []:
            assert box["source"] and box["text"], key
    assert not MEASURED.findall(texts["intro"])
    assert found == []


def test_the_courses_figures_sit_beside_ours_naming_the_settings_that_differ():
    table = {
        "setting": {
            "epochs": "15",
            "data": "CIFAR-10 (50,000 training samples)",
            "card": "not stated",
        },
        "rows": [
            {"run": "one", "course": "107.9 s, 312 MB, 64.8% test"},
            {"run": "ddp", "course": "67.2 s"},
        ],
    }
    skipped = fake_metrics("ddp", "skipped", launcher="torchrun", nproc_per_node=2, epochs=3)
    result = answers.course_comparison(study(one(), skipped), table)
    first, second = result["rows"]
    assert first[:2] == ["one", "107.9 s, 312 MB, 64.8% test"]
    assert re.fullmatch(r"[\d.,]+ s, [\d.,]+ MiB \(peak GPU memory\), [\d.]+% test", first[2])
    assert first[3] == (
        "epochs: 15 vs 3; data: CIFAR-10 (50,000 training samples) vs cifar10; "
        "card: not stated vs 1× NVIDIA H100"
    )
    assert second == ["ddp", "67.2 s", "no numbers (skipped)", ""]
    # On a CPU, the course's GPU memory has no like beside it: the ranks' RSS is not shown.
    on_cpu = one(gpu_mib=None)
    on_cpu["derived"]["device"] = "cpu"
    on_cpu["host"]["gpus"] = []
    cpu_row = answers.course_comparison(study(on_cpu), table)["rows"][0]
    assert ", no GPU memory (it trained on the CPU), " in cpu_row[2]
    assert "RSS" not in cpu_row[2] and cpu_row[3].endswith("card: not stated vs CPU")


def test_a4s_techniques_are_read_in_the_setting_they_ran():
    """Before: every technique was neutral or harmful, with no word on why."""

    def run(name: str, val_losses: list[float]) -> dict:
        history = [
            {"epoch": e, "train_loss": 2.0 / e, "train_accuracy": 0.6, "test_loss": 2.1 / e,
             "test_accuracy": 0.5, "val_loss": v, "val_accuracy": 0.5, "train_time_s": 1.0,
             "eval_time_s": 0.1, "lr": 0.001}
            for e, v in enumerate(val_losses, start=1)
        ]  # fmt: skip
        return fake_metrics(name, study="regularization", epochs=len(val_losses),
                            history=history, spread=(0.98, 1.0, 1.02))  # fmt: skip

    texts = yaml.safe_load((ROOT / "report" / "studies.yaml").read_text())
    (a4,) = [s for s in texts["sections"] if s.get("study") == "regularization"]

    def setting(val_losses: list[float]) -> str:
        runs = [run("none", val_losses), run("dropout", val_losses)]
        study = alike("regularization", {"baseline": "none"}, runs)
        return answers.study_answer(a4, study)[-1]

    falling = setting([2.0, 1.5, 1.2])
    assert falling.startswith("Whether the bare baseline none overfits, 3 epochs can't show")
    assert "its validation loss was still lowest at epoch 3, the last" in falling
    assert "The bare baseline none overfit within 4 epochs" in setting([2.0, 1.2, 1.3, 1.5])
    # Each technique's gap (train 60%, test 50%: +10 points), and where early stopping fired.
    assert falling.endswith("dropout on): none +10.0 (+9.5 to +10.5), train 60.0%; dropout "
                            "+10.0 (+9.5 to +10.5), train 60.0%."), falling  # fmt: skip
    stopped = run("early_stopping", [2.0, 1.2, 1.3])
    stopped["spec"]["early_stopping_patience"] = 1
    stopped["seeds"][0]["final"] |= {"stopped_early_epoch": 3, "restored_best_epoch": 2}
    stopped["seeds"][0]["history"][2]["lr"] = 0.0005
    runs = [run("none", [2.0, 1.5, 1.2]), stopped]
    said = answers.study_answer(a4, alike("regularization", {"baseline": "none"}, runs))
    assert said[-1].endswith(
        "; early_stopping stopped at epoch 3 of 3, its learning rate still "
        "50% of its peak, and reports the weights of its best epoch (2), restored."
    ), said[-1]
    # Where it never fired, the sentence says so once, with the patience and the epochs it had.
    del stopped["seeds"][0]["final"]["stopped_early_epoch"]
    said = answers.study_answer(a4, alike("regularization", {"baseline": "none"}, runs))
    assert said[-1].endswith("; early stopping never fired in early_stopping (patience 1, 3 "
                             "epochs)."), said[-1]  # fmt: skip
    # Augmentation that trains no better than it tests, and tests worse than none: underfit
    # (issue #53: train 87.5%, gap −0.6 points, −1.5 points against none, unsaid).
    augment = run("augmentation", [2.0, 1.5, 1.2])
    for k, seed in enumerate(augment["seeds"]):
        seed["final"] |= {"train_accuracy": 0.45 + 0.01 * k, "test_accuracy": 0.45}
    runs = [run("none", [2.0, 1.5, 1.2]), augment]
    said = answers.study_answer(a4, alike("regularization", {"baseline": "none"}, runs))
    assert said[-1].endswith("; augmentation underfit in these epochs: a gap whose interval "
                             "holds 0 or lies below it, and less accurate than none.")  # fmt: skip
    assert "underfit" not in falling


def test_b1_measures_why_two_processes_on_one_host_step_slower_than_one():
    """Before: 1×2 at 0.52× one process, unexplained; then the all-reduce's 4% of the time lost,
    the rest unexplained. n1xp2_passive is n1xp2 with OpenMP's idle threads asleep: the
    share of the loss it regains is what spinning threads cost."""
    import pandas as pd

    def run(name: str, procs: int, samples_per_s: float, switches: int, **spec) -> dict:
        m = fake_metrics(name, study="cluster_torchrun", launcher="torchrun", nproc_per_node=procs,
                         device="cpu", backend="gloo", samples_per_s=samples_per_s,
                         spread=(0.99, 1.0, 1.01), **spec)  # fmt: skip
        m["parameters"] = 17_000  # 68,000 bytes of gradient
        m["launch"]["env"] = [{"OMP_NUM_THREADS": "4"}]
        m["ranks"] = [
            r | {"device": "cpu", "involuntary_context_switches": switches} for r in m["ranks"]
        ]
        return m

    # 1 ms per step alone; 4 ms per step of two processes (64 samples at 16,000/s); 2 ms asleep.
    runs = [
        run("n1xp1", 1, 32_000.0, 30),
        run("n1xp2", 2, 16_000.0, 1_700),
        run("n1xp2_passive", 2, 32_000.0, 25, omp_wait_policy="passive"),
    ]
    texts = yaml.safe_load((ROOT / "report" / "studies.yaml").read_text())
    (b1,) = [s for s in texts["sections"] if s.get("study") == "cluster_torchrun"]
    study = alike("cluster_torchrun", {}, runs)
    sweep = pd.DataFrame(
        [{"status": "ok", "backend": "gloo", "device": "cpu", "processes": 2, "op": "all_reduce",
          "size_bytes": size, "latency_us": 800.0, "placement": "host"}
         for size in (4, 2**20)]
    )  # fmt: skip
    case, facts = answers.one_host_cause(study, sweep)
    assert case == "spin"
    assert (facts["step_one"], facts["step_two"], facts["step_passive"]) == ("1 ms", "4 ms", "2 ms")
    assert facts["spin_share"] == "67%" and facts["threads"] == "4 threads"
    assert (facts["switches_two"], facts["switches_passive"]) == ("1,700", "25")
    assert facts["all_reduce"] == "0.8 ms for the 66 KiB gradient (gloo), 27% of the time lost"
    assert str(facts["passive"]).startswith("2.00× (") and str(facts["passive"]).endswith("faster")
    text = answers.study_answer(b1, study, sweep=sweep)[-1]
    assert "that run puts 67% of the time lost on 4 threads per process spinning" in text
    # 3 ms lost: 2 regained asleep, 0.8 the all-reduce's; the rest is said, not explained.
    assert "7% of the time lost is left to neither" in text
    assert "one process 30: preemption counts alone don't tell the runs apart" in text
    # Asleep or not, the same speed: the spinning threads are not the cause.
    same = [*runs[:2], run("n1xp2_passive", 2, 16_000.0, 25, omp_wait_policy="passive")]
    case, facts = answers.one_host_cause(alike("cluster_torchrun", {}, same), sweep)
    assert case == "other" and facts["passive"].verdict == "identical in every seed compared"
    # Without the ablation or the sweep, each part says why it is missing.
    case, facts = answers.one_host_cause(alike("cluster_torchrun", {}, runs[:2]), None)
    assert case == "other"
    assert str(facts["passive"]) == "not measured (the config has no run n1xp2_passive)"
    assert facts["all_reduce"] == "not measured (the sweep did not run)"
    assert facts["unexplained"] == "100%"
    # Two processes as fast as one: nothing lost to explain.
    quick = [runs[0], run("n1xp2", 2, 80_000.0, 30)]
    case, _ = answers.one_host_cause(alike("cluster_torchrun", {}, quick), sweep)
    assert case == "faster"


def _curve(test_losses, lrs):
    return [
        {"epoch": e, "train_loss": 1.0 / e, "train_accuracy": 0.5 + 0.1 * e,
         "test_loss": loss, "test_accuracy": 0.5, "train_time_s": 10.0, "eval_time_s": 1.0,
         "lr": lr}
        for e, (loss, lr) in enumerate(zip(test_losses, lrs, strict=True), start=1)
    ]  # fmt: skip


def test_a2_counts_only_the_runs_whose_minimum_could_show_a_rise_and_names_the_schedule():
    """Before: "No run overfit" while 7 of 9 runs had their minimum at the last epoch, where
    OneCycle's rate, annealed to nearly 0, makes the loss fall whatever the model does."""
    annealed = [1e-3, 5e-4, 1e-6]
    late = fake_metrics("late", epochs=3, history=_curve([2.0, 1.5, 1.2], annealed))
    early = fake_metrics("early", epochs=3, history=_curve([2.0, 1.0, 1.005], annealed))
    # (One seed each: a rise after the minimum can't be told from seed noise.)
    case, facts = answers.overfitting(study(late, early))
    assert case == "some_at_last" and (facts["n_told"], facts["n_at_last"]) == (1, 1)
    # A cause is measured or not said: the rate's end is a fact, its share of the falling loss
    # is not isolated by these runs (once: "so the schedule alone makes the last epochs' loss
    # fall", while A4's `none`, same schedule, overfit).
    assert facts["schedule"] == (
        "; their learning rate ended at 0.1% of its peak, whose share in the last epochs' "
        "falling loss no run here isolates"
    )
    case, facts = answers.overfitting(study(late))
    assert case == "still_falling"
    texts = yaml.safe_load((ROOT / "report" / "studies.yaml").read_text())
    [entry] = next(s for s in texts["sections"] if s["study"] == "overfitting")["answer"]
    text, _ = answers.sentence(entry, study(late, early))
    assert text.startswith("No overfitting where it could show: 1 of 2 runs"), text
    flat = [1e-3] * 3
    rose = fake_metrics("rose", epochs=3, history=_curve([2.0, 1.0, 1.3], flat),
                        spread=(0.95, 1.0, 1.05))  # three seeds, each rising  # fmt: skip
    assert answers.overfitting(study(rose, early))[0] == "overfit"


def test_a_comparison_with_a_study_not_compared_here_says_why_not_that_it_is_absent():
    """Before: "cluster_torchrun is not in this report" where that section was in the report,
    but the study's compare_with did not name it."""
    s = study(one(), ddp())
    unnamed = ("parallelism is not compared with cluster_torchrun here: studies.parallelism."
               "compare_with does not name it, or cluster_torchrun has no runs")  # fmt: skip
    with pytest.raises(comparisons.NotMeasured, match=f"^{re.escape(unnamed)}$"):
        comparisons.compare(s, "ddp", "cluster_torchrun/n1xp1", "samples_per_s")
    other = alike("optimizer", {}, [one()])
    named = ("parallelism is compared with optimizer, not cluster_torchrun "
             "(studies.parallelism.compare_with)")  # fmt: skip
    with pytest.raises(comparisons.NotMeasured, match=f"^{re.escape(named)}$"):
        comparisons.compare(s, "ddp", "cluster_torchrun/n1xp1", "samples_per_s", other=other)


def test_a_memory_finding_gives_its_size_in_mib_and_percent():
    """A1 read "1.005× …, heavier" for 0.43 MiB: seeds that agree to the byte make any
    difference a finding, so its size is said beside it."""
    same = {"epochs": 3, "spread": (1.0, 1.0, 1.0)}
    pair = study(fake_metrics("one", launcher="single", gpu_mib=87.9, **same),
                 fake_metrics("ddp", launcher="torchrun", nproc_per_node=2, gpu_mib=88.33,
                              **same))  # fmt: skip
    memory = comparisons.compare(pair, "ddp", "one", "memory", A1["factor"])
    assert memory.brief.startswith("1.005× (+0.4 MiB, +0.5%; warm seeds 1 and 2; "), memory.brief
    assert memory.verdict == "heavier"


def test_a4_says_its_seeds_cant_tell_where_the_baselines_rise_is_within_seed_noise():
    """The example's A4 `none`: its validation loss was lowest at epoch 8 of the mean curve, and
    two seeds rose from there while the third fell; the rise's interval over the seeds holds
    0. It once read "overfit" (a 1% rise of the mean), then "did not overfit ... a regularizer
    can only slow the fit": neither is what three seeds say."""
    texts = yaml.safe_load((ROOT / "report" / "studies.yaml").read_text())
    (a4,) = [s for s in texts["sections"] if s.get("study") == "regularization"]
    m = fake_metrics("none", study="regularization", epochs=3, spread=(1.0, 1.0, 1.0))
    for seed, last in zip(m["seeds"], (1.30, 1.25, 0.95), strict=True):
        for row, loss in zip(seed["history"], (2.0, 1.0, last), strict=True):
            row |= {"val_loss": loss, "val_accuracy": 0.5, "train_loss": 3.0 / row["epoch"]}
    m |= record.combine(m)
    study = alike("regularization", {"baseline": "none"}, [m])
    case, facts = answers.regularization_setting(study)
    assert case == "not_told" and facts["best_epoch"] == "2"
    assert facts["rise"].startswith("+0.167 (−") and facts["rise"].endswith(")")
    text = answers.study_answer(a4, study)[-1]
    assert text.startswith("Whether the bare baseline none overfit in 3 epochs, its seeds can't")


def test_an_answer_says_where_it_agrees_with_the_course_and_where_not():
    """Before: A5's "slower" at batch 32 and "within seed noise" at 128, and A8's Adam within
    noise of SGD, never said that the course found otherwise. `course:` names what the course
    found per comparison; the rule's finding of each says agree or disagree."""
    spread = {"epochs": 3, "spread": (0.9, 1.0, 1.1)}
    runs = study(
        fake_metrics("one", launcher="single", **spread),
        fake_metrics("ddp", launcher="torchrun", nproc_per_node=2, samples_per_s=1620.0, **spread),
        fake_metrics("same", launcher="single", samples_per_s=1000.0, **spread),
    )
    entry = {
        "say": "The course found no difference: {course}.",
        "compare": {"fast": {"run": "ddp", "vs": "one", "metric": "samples_per_s"},
                    "equal": {"run": "same", "vs": "one", "metric": "samples_per_s"},
                    "gone": {"run": "missing", "vs": "one", "metric": "samples_per_s"}},
        "course": {"fast": {"found": "none", "where": "on DDP"},
                   "equal": {"found": "none", "where": "on the twin"},
                   "gone": {"found": "more", "where": "on a run not in the config"}},
    }  # fmt: skip
    [text] = answers.study_answer({"answer": [entry]}, runs)
    assert text == (
        "The course found no difference: we agree on the twin; we disagree on DDP (faster); "
        "no verdict to weigh on a run not in the config."
    ), text


def test_a_background_describes_the_runs_that_ran():
    """Before: A3's background said "batch 32 per GPU" and "compiled and replayed from a CUDA
    graph" for runs that took batch 64 eagerly on CPU processes."""
    texts = yaml.safe_load((ROOT / "report" / "studies.yaml").read_text())
    (a3,) = [s for s in texts["sections"] if s.get("study") == "precision"]
    runs = [fake_metrics(p, study="precision", precision=p, batch_size=64, epochs=2)
            for p in ("fp32", "bf16")]  # fmt: skip
    for m in runs:
        m["derived"]["device"] = "cpu"
        m["step"] |= {"mode": "eager", "compiled": False}
    said = " ".join(answers.background(a3, alike("precision", {}, runs)))
    assert "At batch 64 per CPU process that GEMM" in said
    assert "The A3 runs here stepped “eager”;" in said
    assert "batch 32" not in said and "{" not in said
