"""D6: what Spark runs, and when, for the written assignment's question 4 (lazy evaluation).

The question's program runs here line by line in a local SparkSession, each line in a job group
of its own, and Spark's status stores say what the line started: jobs, stages run and skipped,
tasks, SQL executions and the rows its scans read (SQL metrics). Two variants: the program as
given, and the same with `renamed_df_2nd.cache()` right before its count(), which shows whether
the collect() after count() computes the chain again. Both chains' plans (parsed, analyzed,
optimized, physical) are captured after every line ran: asking for a plan fixes it, and a frame
whose plan was fixed before cache() would scan its source again instead of the cache.

pyspark's createDataFrame of a Python list builds an RDD (a LogicalRDD), not a LocalRelation, so
the optimizer rule ConvertToLocalRelation, which evaluates a filter or projection of a local
list on the driver without a job, finds nothing to fold. The study counts that rule's effective
runs, and runs a control, the same filter and projection over SQL VALUES (a LocalRelation), to
show the difference.

Spark runs in local mode on two cores, bound to loopback (driver RPC, block manager and the py4j
gateway listen on 127.0.0.1), with no UI. Spark's SQL defaults stand (AQE, 200 shuffle
partitions) and are recorded: the question is about Spark as shipped, not as tuned.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from dmls.files import atomic_write, write_csv
from dmls.special import error_line

log = logging.getLogger(__name__)

# The pyspark the fix names (envs/spark.yaml pins the same); Spark 4 runs on Java 17 or later.
PYSPARK_VERSION = "4.3.0"
MIN_JAVA = 17
MASTER = "local[2]"
LOOPBACK = "127.0.0.1"
FIX_PYSPARK = f"pip install pyspark=={PYSPARK_VERSION}, or use the rule's conda env envs/spark.yaml"
FIX_JAVA = "apt-get install openjdk-17-jre-headless, or use the rule's conda env envs/spark.yaml"


class Line(NamedTuple):
    """A line of the program: its text, what it is (plain Python "local", a definition Spark
    records without running anything "transformation", or an "action"), and what it does, as a
    function of the namespace the lines share: no source text is executed."""

    code: str
    kind: str
    step: Callable[[dict[str, Any]], Any]


def _assign(name: str, value: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], Any]:
    """The step of `name = <value>`."""
    return lambda ns: ns.update({name: value(ns)})


# The question's program, line by line.
LINES: tuple[Line, ...] = (
    Line(
        'data = [("Alice", 25), ("Bob", 30), ("Cathy", 27)]',
        "local",
        _assign("data", lambda ns: [("Alice", 25), ("Bob", 30), ("Cathy", 27)]),
    ),
    Line('columns = ["Name", "Age"]', "local", _assign("columns", lambda ns: ["Name", "Age"])),
    Line(
        "df = spark.createDataFrame(data, columns)",
        "transformation",
        _assign("df", lambda ns: ns["spark"].createDataFrame(ns["data"], ns["columns"])),
    ),
    Line(
        "filtered_df = df.filter(df.Age > 26)",
        "transformation",
        _assign("filtered_df", lambda ns: ns["df"].filter(ns["df"].Age > 26)),
    ),
    Line(
        'transformed_df = filtered_df.withColumn("AgeIn5Years", filtered_df.Age + 5)',
        "transformation",
        _assign(
            "transformed_df",
            lambda ns: ns["filtered_df"].withColumn("AgeIn5Years", ns["filtered_df"].Age + 5),
        ),
    ),
    Line(
        'renamed_df = transformed_df.withColumnRenamed("AgeIn5Years", "AgeAfterFiveYears")',
        "transformation",
        _assign(
            "renamed_df",
            lambda ns: ns["transformed_df"].withColumnRenamed("AgeIn5Years", "AgeAfterFiveYears"),
        ),
    ),
    Line(
        'data_2nd = [("James", 28), ("Josh", 32), ("Sarah", 21)]',
        "local",
        _assign("data_2nd", lambda ns: [("James", 28), ("Josh", 32), ("Sarah", 21)]),
    ),
    Line(
        'columns_2nd = ["Name", "Age"]', "local", _assign("columns_2nd", lambda ns: ["Name", "Age"])
    ),
    Line(
        "df_2nd = spark.createDataFrame(data_2nd, columns_2nd)",
        "transformation",
        _assign(
            "df_2nd", lambda ns: ns["spark"].createDataFrame(ns["data_2nd"], ns["columns_2nd"])
        ),
    ),
    Line(
        "filtered_df_2nd = df_2nd.filter(df_2nd.Age > 26)",
        "transformation",
        _assign("filtered_df_2nd", lambda ns: ns["df_2nd"].filter(ns["df_2nd"].Age > 26)),
    ),
    Line(
        'transformed_df_2nd = filtered_df_2nd.withColumn("AgeIn15Years", filtered_df_2nd.Age + 15)',
        "transformation",
        _assign(
            "transformed_df_2nd",
            lambda ns: ns["filtered_df_2nd"].withColumn(
                "AgeIn15Years", ns["filtered_df_2nd"].Age + 15
            ),
        ),
    ),
    Line(
        'renamed_df_2nd = transformed_df_2nd.withColumnRenamed("AgeIn15Years", '
        '"AgeAfterFiftheenYears")',
        "transformation",
        _assign(
            "renamed_df_2nd",
            lambda ns: ns["transformed_df_2nd"].withColumnRenamed(
                "AgeIn15Years", "AgeAfterFiftheenYears"
            ),
        ),
    ),
    Line(
        "row_count_2nd = renamed_df_2nd.count()",
        "action",
        _assign("row_count_2nd", lambda ns: ns["renamed_df_2nd"].count()),
    ),
    Line(
        "result_2nd = renamed_df_2nd.collect()",
        "action",
        _assign("result_2nd", lambda ns: ns["renamed_df_2nd"].collect()),
    ),
    Line(
        "result = renamed_df.collect()",
        "action",
        _assign("result", lambda ns: ns["renamed_df"].collect()),
    ),
)
PROGRAM: tuple[tuple[str, str], ...] = tuple((line.code, line.kind) for line in LINES)
# The second variant marks the chain for caching right before its first action; cache() only
# registers the plan with the cache manager (no job: measured).
CACHE = Line("renamed_df_2nd.cache()", "transformation", lambda ns: ns["renamed_df_2nd"].cache())
CACHE_LINE = (CACHE.code, CACHE.kind)
VARIANTS = ("no cache", "cache")
CHAINS = ("renamed_df", "renamed_df_2nd")
# The second chain's filter and projection over a LocalRelation (SQL VALUES), which
# ConvertToLocalRelation can fold.
CONTROL_SQL = (
    "SELECT Name, Age, Age + 15 AS AgeAfterFiftheenYears FROM VALUES ('James', 28), "
    "('Josh', 32), ('Sarah', 21) AS t(Name, Age) WHERE Age > 26"
)
CONTROL = f'spark.sql("{CONTROL_SQL}").collect()'
# Each line's step, by its text (tests/test_spark_lazy.py checks that every line has one).
STEPS: dict[str, Callable[[dict[str, Any]], Any]] = {
    **{line.code: line.step for line in (*LINES, CACHE)},
    CONTROL: lambda ns: ns["spark"].sql(CONTROL_SQL).collect(),
}
RULE = "org.apache.spark.sql.catalyst.optimizer.ConvertToLocalRelation"
COLUMNS = (
    "variant", "line", "code", "kind", "jobs", "job_ids", "stages_run", "stages_skipped",
    "tasks", "job_stages", "executions", "rows_scanned", "seconds", "status", "reason",
)  # fmt: skip


def program(variant: str) -> list[tuple[str, str]]:
    """The lines `variant` runs: the question's, with cache() before count() in "cache"."""
    lines = list(PROGRAM)
    if variant == "cache":
        count = next(i for i, (code, _) in enumerate(lines) if code.endswith(".count()"))
        lines.insert(count, CACHE_LINE)
    return lines


def java_runtime(environ: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(the java Spark's launcher would run, what is wrong with it or None).

    Mirrors bin/spark-class: JAVA_HOME/bin/java when JAVA_HOME is set (even a broken one), else
    `java` on PATH; and asks it its version, as Spark 4 refuses a Java older than 17 only once
    the JVM is up, with a class-version error."""
    home = environ.get("JAVA_HOME")
    if home:
        java = str(Path(home) / "bin" / "java")
        if not os.access(java, os.X_OK):
            return None, f"no Java runtime: JAVA_HOME={home} has no bin/java: {FIX_JAVA}"
    else:
        found = shutil.which("java", path=environ.get("PATH", os.defpath))
        if found is None:
            return None, f"no Java runtime: no JAVA_HOME and no java on PATH: {FIX_JAVA}"
        java = found
    try:
        done = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, env=dict(environ)
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"no Java runtime: {java} -version failed ({e}): {FIX_JAVA}"
    version = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr + done.stdout)
    if not version:
        return None, f"no Java runtime: {java} -version printed no version: {FIX_JAVA}"
    # Java 8 and older call themselves 1.x.
    major = int(version[2] or 0) if version[1] == "1" else int(version[1])
    if major < MIN_JAVA:
        return java, f"Java {major} at {java}; Spark 4 needs {MIN_JAVA} or later: {FIX_JAVA}"
    return java, None


def missing_dependencies(environ: Mapping[str, str] | None = None) -> list[str]:
    """Why Spark can't run on this host, each reason with the command that fixes it; [] if it
    can. `environ` stands for os.environ (PATH, JAVA_HOME), so a test can pass a bare one."""
    environ = os.environ if environ is None else environ
    missing = []
    try:
        import pyspark  # noqa: F401
    except ImportError:
        missing.append(f"pyspark is not installed: {FIX_PYSPARK}")
    _, problem = java_runtime(environ)
    if problem:
        missing.append(problem)
    return missing


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    """`values` in os.environ for the block, the previous values back after it."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


@contextlib.contextmanager
def local_session() -> Iterator[Any]:
    """A SparkSession on `local[2]`, listening on loopback only, stopped on exit.

    The environment is set only while the session starts: pyspark launches the JVM with it
    (SPARK_LOCAL_IP) and reads the workers' Python from it (PYSPARK_PYTHON: this interpreter,
    unless one is set, rather than whatever `python3` is on PATH). The JVM and its gateway
    outlive a stopped session and serve the next one in this process."""
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(MASTER)
        .appName("dmls-spark-lazy")
        .config("spark.driver.host", LOOPBACK)
        .config("spark.driver.bindAddress", LOOPBACK)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.log.level", "WARN")
    )
    python = os.environ.get("PYSPARK_PYTHON") or sys.executable
    with _environment(SPARK_LOCAL_IP=LOOPBACK, PYSPARK_PYTHON=python):
        spark = builder.getOrCreate()
    try:
        yield spark
    finally:
        spark.stop()


def _seq(scala_seq: Any) -> list[Any]:
    """A Scala collection reached through py4j, as a Python list."""
    items = scala_seq.toList()
    return [items.apply(i) for i in range(items.size())]


class Stores:
    """Spark's status stores through py4j: jobs and stages (AppStatusStore) and SQL executions
    (SQLAppStatusStore). Both exist with the UI off; listeners fill them asynchronously, so a
    reader first drains the listener bus (`settle`)."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self.jsc = spark.sparkContext._jsc.sc()
        self.app = self.jsc.statusStore()
        self.sql = spark._jsparkSession.sharedState().statusStore()

    def settle(self) -> None:
        self.jsc.listenerBus().waitUntilEmpty()

    def execution_ids(self) -> set[int]:
        return {e.executionId() for e in _seq(self.sql.executionsList())}

    def jobs(self, group: str) -> list[dict[str, Any]]:
        """The jobs of a job group, each with its stages: (id, status, tasks, tasks run)."""
        jobs = []
        for job_id in sorted(self.spark.sparkContext.statusTracker().getJobIdsForGroup(group)):
            stages = [self.app.lastStageAttempt(s) for s in _seq(self.app.job(job_id).stageIds())]
            jobs.append(
                {
                    "id": job_id,
                    "stages": sorted(
                        (s.stageId(), s.status().toString(), s.numTasks(), s.numCompleteTasks())
                        for s in stages
                    ),
                }
            )
        return jobs

    def scan_rows(self, execution_id: int) -> dict[str, int]:
        """Rows each scan of an execution put out ("number of output rows"), by node name; 0
        for a scan in the plan that read nothing (the source under a cache already built)."""
        values = self.sql.executionMetrics(execution_id)
        rows: dict[str, int] = {}
        for node in _seq(self.sql.planGraph(execution_id).allNodes()):
            if "Scan" not in node.name():
                continue
            for metric in _seq(node.metrics()):
                if metric.name() == "number of output rows":
                    value = values.get(metric.accumulatorId())
                    count = int(value.get().replace(",", "")) if value.isDefined() else 0
                    rows[node.name()] = rows.get(node.name(), 0) + count
        return rows

    def physical_plan(self, execution_id: int) -> str:
        """The plan as the execution ran it: with AQE, the final plan and its query stages."""
        return self.sql.execution(execution_id).get().physicalPlanDescription()


def _job_stages(jobs: list[dict[str, Any]]) -> str:
    """Each job's stages, e.g. "job 1: stage 1 skipped (2 tasks), stage 2 ran 1 task"."""

    def stage(stage_id: int, status: str, tasks: int, ran: int) -> str:
        if status == "SKIPPED":
            return f"stage {stage_id} skipped ({tasks} task(s))"
        return f"stage {stage_id} {'ran' if status == 'COMPLETE' else status} {ran} task(s)"

    return "; ".join(
        f"job {job['id']}: " + ", ".join(stage(*s) for s in job["stages"]) for job in jobs
    )


def run_line(
    spark: Any, stores: Stores, namespace: dict[str, Any], group: str, code: str
) -> dict[str, Any]:
    """Run one line of the program in job group `group` and say what it started.

    The line runs as its STEPS function; its jobs are the group's, its executions those the SQL
    store gained while it ran."""
    spark.sparkContext.setJobGroup(group, code)
    stores.settle()
    executions_before = stores.execution_ids()
    start = time.perf_counter()
    STEPS[code](namespace)
    seconds = time.perf_counter() - start
    stores.settle()
    jobs = stores.jobs(group)
    stages = {s[0]: s for job in jobs for s in job["stages"]}.values()
    executions = sorted(stores.execution_ids() - executions_before)
    scans: dict[str, int] = {}
    for execution in executions:
        for name, count in stores.scan_rows(execution).items():
            scans[name] = scans.get(name, 0) + count
    return {
        "jobs": len(jobs),
        "job_ids": " ".join(str(job["id"]) for job in jobs),
        "stages_run": sum(status != "SKIPPED" for _, status, _, _ in stages),
        "stages_skipped": sum(status == "SKIPPED" for _, status, _, _ in stages),
        "tasks": sum(ran for _, status, _, ran in stages if status != "SKIPPED"),
        "job_stages": _job_stages(jobs),
        "executions": " ".join(str(e) for e in executions),
        "rows_scanned": "; ".join(f"{name}={count}" for name, count in sorted(scans.items())),
        "seconds": seconds,
        "status": "ok",
        "reason": None,
    }


def run_variant(
    spark: Any, stores: Stores, variant: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The variant's lines, measured; and the namespace they ran in (its DataFrames). A line
    that raises is recorded as failed, and the lines after it, which depend on it, as not run."""
    namespace: dict[str, Any] = {"spark": spark}
    rows: list[dict[str, Any]] = []
    broken: int | None = None
    for line, (code, kind) in enumerate(program(variant), start=1):
        row = {"variant": variant, "line": line, "code": code, "kind": kind}
        if broken is not None:
            rows.append(row | {"status": "failed", "reason": f"not run: line {broken} failed"})
            continue
        group = f"{variant.replace(' ', '-')}-line-{line}"
        try:
            row |= run_line(spark, stores, namespace, group, code)
        except Exception as e:  # recorded; the other variant still runs
            log.exception("D6 %s, line %d failed", variant, line)
            broken = line
            rows.append(row | {"status": "failed", "reason": error_line(e)})
            continue
        log.info(
            "D6 %s, line %2d: %d job(s), %d stage(s) run, %d skipped, %d task(s), %.2f s: %s",
            variant,
            line,
            row["jobs"],
            row["stages_run"],
            row["stages_skipped"],
            row["tasks"],
            row["seconds"],
            code,
        )
        rows.append(row)
    return rows, namespace


def rule_meter(spark: Any) -> Any:
    """Catalyst's RuleExecutor, whose meter counts each rule's runs, JVM-wide: this process
    runs nothing else in Spark meanwhile."""
    return spark._jvm.org.apache.spark.sql.catalyst.rules.RuleExecutor


def rule_runs(spark: Any, rule: str = RULE) -> dict[str, int]:
    """How often the optimizer applied `rule` and with effect, since the meter's last reset."""
    for line in rule_meter(spark).dumpTimeSpent().splitlines():
        fields = line.split()
        if fields and fields[0] == rule:  # rule, effective / total time, effective / total runs
            return {"effective_runs": int(fields[4]), "runs": int(fields[6])}
    return {"effective_runs": 0, "runs": 0}


def session_facts(spark: Any) -> dict[str, Any]:
    """Version, master, the SQL settings that shape the jobs, and where the driver listens."""
    from pyspark import SparkContext

    sc = spark.sparkContext
    conf = sc.getConf()
    proc = getattr(SparkContext._gateway, "proc", None)
    return {
        "spark_version": spark.version,
        "adaptive": spark.conf.get("spark.sql.adaptive.enabled") == "true",
        "shuffle_partitions": int(spark.conf.get("spark.sql.shuffle.partitions")),
        "master": sc.master,
        "default_parallelism": sc.defaultParallelism,
        "bound_address": {
            "spark.driver.host": conf.get("spark.driver.host"),
            "spark.driver.bindAddress": conf.get("spark.driver.bindAddress"),
            # The RPC env's port, set once it listens. Not asked of SparkEnv: py4j's reflection
            # on it loads classes (protobuf) that pyspark's jars lack, and the call dies.
            "rpc": f"{conf.get('spark.driver.host')}:{conf.get('spark.driver.port')}",
            # Keyed by each block manager's host:port; local mode has the driver's only.
            "block_manager": " ".join(_seq(sc._jsc.sc().getExecutorMemoryStatus().keys())),
        },
        "jvm_pid": proc.pid if proc is not None else None,
    }


def measure(spark: Any) -> tuple[list[dict[str, Any]], dict[str, Any], list[tuple[str, str]]]:
    """Both variants and the control in `spark`: (rows, result keys, (title, plan) texts)."""
    stores = Stores(spark)
    meter = rule_meter(spark)
    rows: list[dict[str, Any]] = []
    plans: dict[str, dict[str, str]] = {}
    rules: dict[str, dict[str, int]] = {}
    texts: list[tuple[str, str]] = []
    for variant in VARIANTS:
        meter.resetMetrics()
        variant_rows, namespace = run_variant(spark, stores, variant)
        rules[variant] = rule_runs(spark)
        rows += variant_rows
        # Only now, after every line ran: a plan asked for earlier would be fixed before
        # cache() and bypass the cache.
        plans[variant] = {
            chain: namespace[chain]._jdf.queryExecution().toString()
            for chain in CHAINS
            if chain in namespace
        }
        texts += [
            (f"{variant}, {chain}, after every line ran", text)
            for chain, text in plans[variant].items()
        ]
        texts += [
            (
                f"{row['variant']}, line {row['line']}: {row['code']} (SQL execution {e}, as run)",
                stores.physical_plan(int(e)),
            )
            for row in variant_rows
            for e in (row.get("executions") or "").split()
        ]
        spark.catalog.clearCache()
    meter.resetMetrics()
    control: dict[str, Any] = {"code": CONTROL}
    try:
        control |= run_line(spark, stores, {"spark": spark}, "control", CONTROL)
    except Exception as e:  # the control backs the finding; the program's rows still stand
        log.exception("D6 control failed")
        control |= {"status": "failed", "reason": error_line(e)}
    else:
        log.info("D6 control (LocalRelation): %d job(s): %s", control["jobs"], CONTROL)
        texts += [
            (f"control: {CONTROL} (SQL execution {e}, as run)", stores.physical_plan(int(e)))
            for e in control["executions"].split()
        ]
    rules["control"] = rule_runs(spark)
    return rows, {"plans": plans, "convert_to_local_relation": rules, "control": control}, texts


def _unmeasured(status: str, reason: str) -> list[dict[str, Any]]:
    """One row for the whole program where it could not run: the reason is the same for every
    line, and said once."""
    return [
        {
            "variant": " and ".join(VARIANTS),
            "line": None,
            "code": "every line",
            "kind": None,
            "status": status,
            "reason": reason,
        }
    ]


def run(cfg: dict[str, Any], out_dir: Path, **_: Any) -> dict[str, Any]:
    """Measure both variants into lines.csv and plans.txt. Where pyspark or Java is missing
    every line is skipped with the command that fixes it, and where Spark fails every line says
    how: the study never raises, so the other studies' results and the report still come."""
    out_dir = Path(out_dir)
    result: dict[str, Any] = {
        "spark_version": None, "adaptive": None, "shuffle_partitions": None, "master": MASTER,
        "default_parallelism": None, "bound_address": None, "jvm_pid": None,
        "session_start_s": None, "plans": {}, "convert_to_local_relation": {}, "control": None,
    }  # fmt: skip
    texts: list[tuple[str, str]] = []
    if missing := missing_dependencies():
        log.warning("D6 skipped: %s", "; ".join(missing))
        rows = _unmeasured("skipped", "; ".join(missing))
    else:
        try:
            start = time.perf_counter()
            with local_session() as spark:
                result |= session_facts(spark) | {"session_start_s": time.perf_counter() - start}
                log.info(
                    "D6: Spark %s on %s, AQE %s",
                    result["spark_version"],
                    result["master"],
                    "on" if result["adaptive"] else "off",
                )
                rows, measured, texts = measure(spark)
                result |= measured
        except Exception as e:  # Spark did not start, or the study itself broke: say so
            log.exception("D6: Spark failed")
            rows = _unmeasured("failed", f"Spark failed: {error_line(e)}")
    write_csv(out_dir / "lines.csv", rows, COLUMNS)
    text = "".join(f"==== {title} ====\n{plan}\n\n" for title, plan in texts)
    atomic_write(out_dir / "plans.txt", lambda f: f.write(text.encode()))
    return {"rows": rows, **result, "plans_file": "plans.txt"}
