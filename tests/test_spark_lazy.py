"""D6 (dmls.special.spark_lazy): what each line of question 4's PySpark program starts, with and
without cache(), as Spark's own status stores count it; Spark listening on loopback only; and
the skip, naming the command that fixes it, where pyspark or Java is missing.

CI installs pyspark and Java, so the measured tests run there and are not skipped."""

import csv
import sys

import psutil
import pytest

from dmls.special.spark_lazy import measure as spark_lazy

# (jobs, stages run, stages skipped) of each line that starts anything, measured with pyspark
# 4.3.0 on local[2] with Spark's defaults (AQE on); every other line (the lists, createDataFrame,
# the filter, withColumn, withColumnRenamed, cache()) starts nothing.
#
# count() is groupBy().count(): a partial count per partition of the parallelized list (2), an
# exchange into one partition, and the final count. AQE runs each query stage as a job of its
# own: the shuffle map stage (2 tasks), then the final ResultQueryStage, whose job holds the map
# stage again; its outputs exist, so the scheduler skips it. Hence 2 jobs, 2 stages run and 1
# skipped. A collect() has no exchange: 1 job, 1 stage of 2 tasks, reading the source again.
NO_CACHE = {13: (2, 2, 1), 14: (1, 1, 0), 15: (1, 1, 0)}
# With cache() before count(), AQE first materializes the cache (a TableCacheQueryStage: one job
# that scans the source and keeps the 2 matching rows), then runs the shuffle map stage over the
# cached batches and the final stage as above: 3 jobs. The collect() after it is 1 job that reads
# the cached relation; the source's scan, still in its plan, reads 0 rows.
CACHE = {14: (3, 3, 1), 15: (1, 1, 0), 16: (1, 1, 0)}
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


@pytest.fixture(scope="module")
def d6(tmp_path_factory):
    folder = tmp_path_factory.mktemp("spark_lazy")
    return spark_lazy.run({"title": "D6"}, folder), folder


def lines(result, variant):
    return {r["line"]: r for r in result["rows"] if r["variant"] == variant}


def counts(row):
    return row["jobs"], row["stages_run"], row["stages_skipped"]


def test_every_line_runs_as_a_function_not_as_its_source_text():
    lines = {code for variant in spark_lazy.VARIANTS for code, _ in spark_lazy.program(variant)}
    assert set(spark_lazy.STEPS) == lines | {spark_lazy.CONTROL}
    assert spark_lazy.CONTROL_SQL in spark_lazy.CONTROL  # the control's text is what it runs


def test_defining_dataframes_starts_no_job_and_each_action_runs_the_chain_from_its_source(d6):
    result, _ = d6
    rows = lines(result, "no cache")
    assert [rows[n]["code"] for n in rows] == [code for code, _ in spark_lazy.PROGRAM]
    for n, row in rows.items():
        assert row["status"] == "ok" and row["reason"] is None, row
        assert counts(row) == NO_CACHE.get(n, (0, 0, 0)), row
        assert (row["kind"] == "action") == (n in NO_CACHE), row
    # Each action is one SQL execution; count() scans the 3 rows, and collect() after it scans
    # them again: nothing of count()'s work is kept.
    assert [rows[n]["rows_scanned"] for n in NO_CACHE] == ["Scan ExistingRDD=3"] * 3
    assert all(len(rows[n]["executions"].split()) == 1 for n in NO_CACHE)
    assert rows[13]["job_stages"].endswith("skipped (2 task(s)), stage 2 ran 1 task(s)")


def test_with_cache_count_builds_the_cache_and_the_collect_after_it_reads_the_cache(d6):
    result, _ = d6
    rows = lines(result, "cache")
    assert rows[13]["code"] == "renamed_df_2nd.cache()"
    for n, row in rows.items():
        assert row["status"] == "ok", row
        assert counts(row) == CACHE.get(n, (0, 0, 0)), row
    assert rows[14]["rows_scanned"] == "InMemoryTableScan=2; Scan ExistingRDD=3"
    assert rows[15]["rows_scanned"] == "InMemoryTableScan=2; Scan ExistingRDD=0"
    assert rows[16]["rows_scanned"] == "Scan ExistingRDD=3"  # the other chain isn't cached


def test_create_dataframe_of_a_list_is_an_rdd_so_convert_to_local_relation_folds_nothing(d6):
    result, folder = d6
    for variant in spark_lazy.VARIANTS:
        assert result["convert_to_local_relation"][variant]["effective_runs"] == 0
        assert result["convert_to_local_relation"][variant]["runs"] > 0
        assert "LogicalRDD [Name#" in result["plans"][variant]["renamed_df"]
    # The control, the same filter and projection over SQL VALUES (a LocalRelation): the rule
    # folds them into the relation and the driver answers collect() without a job.
    control = result["control"]
    assert control["status"] == "ok" and control["jobs"] == 0
    assert control["rows_scanned"] == "LocalTableScan=2"
    assert result["convert_to_local_relation"]["control"]["effective_runs"] > 0
    assert "LocalTableScan" in (folder / "plans.txt").read_text().split("==== control:")[1]


def test_plans_are_captured_after_the_lines_ran_so_the_cached_chain_reads_the_cache(d6):
    result, folder = d6
    cached = result["plans"]["cache"]["renamed_df_2nd"]
    physical = cached.split("== Physical Plan ==")[1]
    assert physical.lstrip().startswith("InMemoryTableScan")
    assert "InMemoryRelation" not in result["plans"]["no cache"]["renamed_df_2nd"]
    text = (folder / "plans.txt").read_text()
    for variant in spark_lazy.VARIANTS:
        for chain in spark_lazy.CHAINS:
            assert f"==== {variant}, {chain}, after every line ran ====" in text
    for section in ("Parsed Logical", "Analyzed Logical", "Optimized Logical", "Physical"):
        assert text.count(f"== {section} Plan ==") >= 4, section
    # count() as run: AQE's final plan with its shuffle and result query stages.
    assert "TableCacheQueryStage" in text and "ResultQueryStage" in text


def test_the_study_records_spark_its_settings_and_writes_every_line(d6):
    result, folder = d6
    assert spark_lazy.missing_dependencies() == []
    assert result["spark_version"] == spark_lazy.PYSPARK_VERSION
    assert result["adaptive"] is True and result["shuffle_partitions"] == 200
    assert result["master"] == "local[2]" and result["default_parallelism"] == 2
    bound = result["bound_address"]
    assert bound["spark.driver.host"] == bound["spark.driver.bindAddress"] == "127.0.0.1"
    assert bound["rpc"].startswith("127.0.0.1:") and bound["block_manager"].startswith("127.0.0.1:")
    assert psutil.Process(result["jvm_pid"]).name() == "java"
    with open(folder / "lines.csv") as f:
        written = list(csv.DictReader(f))
    assert list(written[0]) == list(spark_lazy.COLUMNS)
    assert len(written) == len(result["rows"]) == 15 + 16


def test_spark_and_its_python_workers_listen_on_loopback_only():
    from pyspark import SparkContext

    with spark_lazy.local_session() as spark:
        # Run the cached variant, so that every server the study starts is up: the JVM's
        # (py4j gateway, RPC, block manager) and the Python workers' daemon.
        rows, _ = spark_lazy.run_variant(spark, spark_lazy.Stores(spark), "cache")
        assert all(r["status"] == "ok" for r in rows)
        jvm = psutil.Process(SparkContext._gateway.proc.pid)
        listening = [
            c.laddr
            for process in (jvm, *jvm.children(recursive=True))
            for c in process.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        ]
        bound = spark_lazy.session_facts(spark)["bound_address"]
    spark_ports = {
        SparkContext._gateway.gateway_parameters.port,
        *(int(bound[key].rsplit(":", 1)[1]) for key in ("rpc", "block_manager")),
    }
    assert {a.ip for a in listening} <= LOOPBACK, listening
    assert spark_ports <= {a.port for a in listening}, (spark_ports, listening)


def fake_java(folder, version):
    """A `java` that answers -version as a JDK of `version` does (on stderr)."""
    java = folder / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text(f"#!/bin/sh\necho 'openjdk version \"{version}\" 2024-01-16' >&2\n")
    java.chmod(0o755)
    return java


def test_a_missing_or_old_java_is_named_with_the_command_that_installs_one(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    java, reason = spark_lazy.java_runtime({"PATH": str(empty)})
    assert java is None
    assert reason.startswith("no Java runtime: no JAVA_HOME and no java on PATH")
    assert "apt-get install openjdk-17-jre-headless" in reason and "envs/spark.yaml" in reason
    # JAVA_HOME wins over PATH, as in Spark's launcher, even when it holds no java.
    _, reason = spark_lazy.java_runtime({"JAVA_HOME": str(empty), "PATH": "/usr/bin"})
    assert f"JAVA_HOME={empty} has no bin/java" in reason
    old = fake_java(tmp_path / "jdk11", "11.0.22")
    java, reason = spark_lazy.java_runtime({"JAVA_HOME": str(tmp_path / "jdk11")})
    assert java == str(old) and reason.startswith("Java 11 at ")
    assert "needs 17 or later: apt-get install openjdk-17-jre-headless" in reason
    fake_java(tmp_path / "jdk21", "21.0.4")
    assert spark_lazy.java_runtime({"PATH": str(tmp_path / "jdk21" / "bin")})[1] is None


def test_without_pyspark_and_java_every_line_is_skipped_with_the_fixing_commands(
    tmp_path, monkeypatch
):
    monkeypatch.setitem(sys.modules, "pyspark", None)  # `import pyspark` raises ImportError
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    result = spark_lazy.run({"title": "D6"}, tmp_path)
    reason = f"pyspark is not installed: pip install pyspark=={spark_lazy.PYSPARK_VERSION}"
    assert len(result["rows"]) == 1  # the reason is the same for every line: said once
    for row in result["rows"]:
        assert row["status"] == "skipped"
        assert row["reason"].startswith(reason + ", or use the rule's conda env envs/spark.yaml")
        assert "no Java runtime" in row["reason"] and "apt-get install" in row["reason"]
    assert result["jvm_pid"] is None and result["spark_version"] is None
    with open(tmp_path / "lines.csv") as f:
        assert {r["status"] for r in csv.DictReader(f)} == {"skipped"}
