"""The run specification: everything one training run needs, resolved from config.

Config is the experiment. `config["defaults"]` holds a complete run spec (the JSON schema fills
every key), each study may override it in `base`, and each run overrides the study. The merged
dict is validated against the schema's run definition, then turned into a frozen `RunSpec`.
Defaults live in the schema only: the dataclasses below have none, so a spec that reaches the
engine is always complete and there is one place to change a default.
"""

from __future__ import annotations

import copy
import difflib
import json
import math
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, cast, get_type_hints

import yaml

from dmls.config import data_sizes

SCHEMA_PATH = Path(__file__).resolve().parents[4] / "config" / "schemas" / "config.schema.yaml"


# torch._scaled_mm (fp8 GEMMs) needs both dimensions of each operand divisible by 16.
FP8_MULTIPLE = 16
# numpy seeds its generators with 32-bit integers.
MAX_SEED = 2**32 - 1


class SpecError(ValueError):
    """A config or run spec that can't be run; the message names the key."""


@dataclass(frozen=True)
class ModelSpec:
    name: str
    conv_channels: tuple[int, ...]
    fc_hidden: int
    hidden: int
    layers: int
    dropout: float
    batch_norm: bool
    activation: str


@dataclass(frozen=True)
class OptimizerSpec:
    name: str
    lr: float
    momentum: float
    weight_decay: float


@dataclass(frozen=True)
class SchedulerSpec:
    name: str
    max_lr: float


@dataclass(frozen=True)
class AugmentSpec:
    random_crop: bool
    horizontal_flip: bool
    color_jitter: float
    rotation_degrees: float


@dataclass(frozen=True)
class RunSpec:
    study: str
    run: str
    dataset: str
    model: ModelSpec
    launcher: str
    replica_threads: str
    omp_wait_policy: str
    sharding: str
    device: str
    nodes: int
    nproc_per_node: int
    backend: str
    precision: str
    optimizer: OptimizerSpec
    scheduler: SchedulerSpec
    batch_size: int
    grad_accum_steps: int
    augment: AugmentSpec
    label_smoothing: float
    early_stopping_patience: int
    epochs: int
    seed: int
    seeds: int
    train_samples: int
    validation_samples: int
    test_samples: int
    num_workers: int
    loader: str
    step: str

    @property
    def run_id(self) -> str:
        return f"{self.study}/{self.run}"

    # What the torch-free side (Snakemake, the supervisor) needs to know of a launcher. How each
    # one trains (wrapping, backward, gradient sync, optimizer step) is its strategy class in
    # training/parallel.py; launch.py builds its command.
    @property
    def processes(self) -> int:
        """Training processes started: one per replica under torchrun/accelerate, else one."""
        return self.replicas if self.launcher in ("torchrun", "accelerate") else 1

    @property
    def replicates_in_one_process(self) -> bool:
        """nn.DataParallel: one process copies the model to each of its GPUs in every step."""
        return self.launcher == "dp"

    @property
    def precision_by_launcher(self) -> bool:
        """accelerate applies the mixed precision itself (autocast, loss scaling, fp8 through
        its backends), from `accelerate launch --mixed_precision`; for every other launcher the
        engine does (training/precision.py)."""
        return self.launcher == "accelerate"

    @property
    def cpu_shares(self) -> int:
        """Processes' worth of CPU cores the run gets (`cluster.cpus_per_process` each): one per
        process, and for DataParallel one per GPU its one process drives, so that A1 compares
        launchers with the same cores per GPU (docs/performance.md, "The whole DAG on one GPU
        machine")."""
        return self.replicas if self.replicates_in_one_process else self.processes

    @property
    def replicas(self) -> int:
        """Data-parallel model replicas: the world size (DataParallel: GPUs of its one process)."""
        return self.nodes * self.nproc_per_node

    @property
    def requested_gpus(self) -> int:
        """GPUs the spec itself asks for ('auto' asks for none: it takes what it finds)."""
        wants_cuda = (
            self.device == "cuda" or self.replicates_in_one_process or self.backend == "nccl"
        )
        return self.replicas if wants_cuda else 0

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step, over all replicas and accumulation micro-steps."""
        return self.batch_size * self.replicas * self.grad_accum_steps

    def checkpoint_path(self, results_dir: Path | str) -> Path:
        """Where this run's resume checkpoint lives (dmls/training/checkpoint.py): outside the
        rule's outputs, so Snakemake never deletes it with an incomplete run. With several
        seeds, each seed's is beside it (`seed_checkpoint`)."""
        return Path(results_dir) / "checkpoints" / self.study / f"{self.run}.pt"

    def seed_specs(self) -> list[RunSpec]:
        """The runs this spec's job trains, one per seed: the same spec with `seed` + k and
        `seeds: 1`, so that seed k of the job is, number for number, the job that trains that
        seed alone."""
        return [replace(self, seed=self.seed + k, seeds=1) for k in range(self.seeds)]

    def seed_checkpoint(self, checkpoint: Path, seed: int) -> Path:
        """Seed `seed`'s checkpoint in a job whose run checkpoint is `checkpoint`: that file
        itself for one seed, else `<run>.seed<seed>.pt` beside it."""
        return (
            checkpoint
            if self.seeds == 1
            else checkpoint.with_name(f"{checkpoint.stem}.seed{seed}{checkpoint.suffix}")
        )

    def seed_checkpoints(self, checkpoint: Path) -> list[Path]:
        return [self.seed_checkpoint(checkpoint, s.seed) for s in self.seed_specs()]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSpec:
        spec = _build(cls, data, where=f"{data.get('study', '?')}/{data.get('run', '?')}")
        spec.check()
        return spec

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        return cls.from_dict(json.loads(text))

    def cpu_conflicts(self) -> list[str]:
        """What this spec asks for that no CPU can do, when it pins device 'cpu'."""
        if self.device != "cpu":
            return []
        where = f"studies.{self.study}.runs.{self.run}"
        needs_gpu = {
            "launcher": (self.launcher, ("dp",), "single, torchrun, accelerate"),
            "backend": (self.backend, ("nccl",), "gloo"),
            "precision": (self.precision, ("fp8",), "fp32, fp16, bf16"),
        }
        return [
            f"{where}.{key}: {value!r} needs a CUDA GPU, but device is 'cpu'; "
            f"allowed on the CPU: {allowed}"
            for key, (value, gpu_only, allowed) in needs_gpu.items()
            if value in gpu_only
        ]

    def check(self) -> None:
        """SpecError listing every constraint between keys that this spec breaks."""
        if problems := self.problems():
            raise SpecError("\n".join(problems))

    def problems(self) -> list[str]:
        """Constraints between keys, which the JSON schema can't express clearly: one line per
        broken one, naming its key."""
        where = f"studies.{self.study}.runs.{self.run}"
        found = []
        if self.launcher == "single" and self.replicas != 1:
            found.append(
                f"{where}: launcher 'single' runs one process on one device, but nodes × "
                f"nproc_per_node = {self.nodes} × {self.nproc_per_node}; use 'dp', 'torchrun' "
                "or 'accelerate' for several"
            )
        if self.replica_threads != "per_step" and not self.replicates_in_one_process:
            found.append(
                f"{where}.replica_threads: {self.replica_threads!r} is a setting of launcher "
                f"'dp' (nn.DataParallel); this run's launcher is {self.launcher!r}"
            )
        if self.sharding != "none" and self.launcher != "torchrun":
            found.append(
                f"{where}.sharding: {self.sharding!r} shards over torchrun's processes (DDP with "
                f"ZeroRedundancyOptimizer, FSDP2); this run's launcher is {self.launcher!r}"
            )
        if self.sharding in ("gradients", "full") and self.precision == "fp8":
            found.append(
                f"{where}.sharding: {self.sharding!r} (FSDP2) with precision 'fp8' needs "
                "torchao's float8 all-gather set-up, which the engine does not do; use "
                "sharding 'none' or 'optimizer' for fp8"
            )
        if self.launcher == "dp" and self.nodes != 1:
            found.append(
                f"{where}: launcher 'dp' (nn.DataParallel) is one process: nodes must be 1"
            )
        if self.seed + self.seeds - 1 > MAX_SEED:
            found.append(
                f"{where}.seed: seeds {self.seed} to {self.seed + self.seeds - 1}, but a seed "
                f"ends at {MAX_SEED} (2³² − 1, numpy's); use a seed of at most "
                f"{MAX_SEED - self.seeds + 1}"
            )
        if self.early_stopping_patience and not self.validation_samples:
            found.append(
                f"{where}.early_stopping_patience: {self.early_stopping_patience} watches the "
                f"validation loss, but {where}.validation_samples is 0 (no validation split); "
                "hold out the last N training samples with validation_samples: N, or set "
                "early_stopping_patience: 0 (the test set never decides when to stop)"
            )
        if self.precision == "fp8" and self.batch_size % FP8_MULTIPLE:
            found.append(
                f"{where}.batch_size: fp8 matmuls need every dimension divisible by "
                f"{FP8_MULTIPLE}, the batch too (weight gradients); got {self.batch_size}"
            )
        return found


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected a mapping, got {data!r}")
    names = {f.name for f in fields(cls)}
    unknown, missing = sorted(set(data) - names), sorted(names - set(data))
    if unknown or missing:
        raise SpecError(f"{where}: unknown keys {unknown}, missing keys {missing}")
    hints = get_type_hints(cls)
    kwargs = {}
    for name in names:
        value, hint = data[name], hints[name]
        if is_dataclass(hint):
            value = _build(cast(type, hint), value, f"{where}.{name}")
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[name] = value
    return cls(**kwargs)


def deep_merge(*layers: dict[str, Any]) -> dict[str, Any]:
    """Merge mappings left to right; nested mappings merge, everything else is replaced."""
    merged: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = deep_merge(merged[key], value)
            else:
                merged[key] = copy.deepcopy(value)
    return merged


class _NoDuplicates(yaml.SafeLoader):
    """YAML's safe loader, keeping each mapping's duplicate keys (YAML takes the last)."""

    duplicates: list[str]

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue  # `<<: *anchor` merges keys that the mapping's own may override
            key = key_node.value
            line = key_node.start_mark.line + 1
            if key in seen:
                self.duplicates.append(f"line {line}: {key!r} again (first at line {seen[key]})")
            seen.setdefault(key, line)
        return super().construct_mapping(node, deep=deep)


def config_file_problems(path: Path) -> list[str]:
    """What YAML would get wrong in a config file, each with its line: a syntax error (which
    Snakemake reports without file or line), or a key given twice in one mapping (YAML keeps
    the last silently, so the first setting would not apply)."""
    loader = _NoDuplicates(Path(path).read_text())
    loader.duplicates = []
    try:
        loader.get_single_data()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        return [f"{path}: {where}{e.problem or e.context} (YAML syntax)"]
    finally:
        loader.dispose()
    return [f"{path}: {line}" for line in loader.duplicates]


def yaml_scalars(value: Any) -> Any:
    """A `--config` value as a config file would hold it: Snakemake reads a nested one's
    scalars as strings (`--config 'defaults={epochs: 3}'` gives epochs '3', which no integer
    key takes); each such string is read as YAML reads a plain scalar (3, 0.5, true, null),
    any other stays a string."""
    if isinstance(value, Mapping):
        return {k: yaml_scalars(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [yaml_scalars(v) for v in value]
    if isinstance(value, str) and value.strip() and "\n" not in value:
        try:
            read = yaml.safe_load(value)
        except yaml.YAMLError:
            return value
        if read is None or isinstance(read, bool | int | float):
            return read
    return value


def load_schema(path: Path = SCHEMA_PATH) -> dict[str, Any]:
    with open(path) as f:
        return yaml.safe_load(f)


def strict_validator(schema: dict[str, Any]):
    """JSON Schema 2020-12 as written, not as JSON counts: an `integer` is no float (2.0 would
    fail later as "'float' object cannot be interpreted as an integer"), and a `number` is
    finite (`lr: .nan` would start a job that fails with no key named)."""
    import jsonschema

    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine_many(
        {
            "integer": lambda _, v: isinstance(v, int) and not isinstance(v, bool),
            "number": lambda _, v: (
                isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            ),
        }
    )
    return jsonschema.validators.extend(base, type_checker=checker)(schema)


def run_validator(schema: dict[str, Any]):
    """A validator for one resolved run spec: the schema's `run` definition and its `$defs`."""
    return strict_validator(dict(schema["$defs"]["run"], **{"$defs": schema["$defs"]}))


def check_config(config: dict[str, Any], schema: dict[str, Any] | None = None) -> None:
    """Raise SpecError listing every schema violation of `config` at every level, each with its
    key path and what is allowed there: the config's own keys, `defaults`, and each study's
    `base` and runs, which the schema leaves open until they are merged (each layer holds run
    keys, every one optional: a key's value is checked in the layer that sets it, so a bad
    `defaults` key is named once, not again in every run). Snakemake's `validate` then fills
    in the defaults; its own message for the first error is a dump of the schema."""
    schema = schema or load_schema()
    errors = list(strict_validator(schema).iter_errors(config))
    lines = _error_lines(errors, prefix=())
    layers = run_validator(schema)
    studies = config.get("studies")
    studies = {
        study: definition
        for study, definition in (studies if isinstance(studies, dict) else {}).items()
        if isinstance(definition, dict)
    }
    broken: set[tuple[str, str]] = set()  # runs with a bad key in a layer of their own
    for study, definition in studies.items():
        base = definition.get("base")
        base_lines = []
        if isinstance(base, dict):
            base_lines = _error_lines(layers.iter_errors(base), ("studies", study, "base"))
        lines += base_lines
        runs = definition.get("runs")
        for run, overrides in (runs if isinstance(runs, dict) else {}).items():
            own = []
            if isinstance(overrides, dict):
                prefix = ("studies", study, "runs", str(run))
                own = _error_lines(layers.iter_errors(overrides), prefix)
            lines += own
            if own or base_lines:
                broken.add((study, run))
    if not lines:
        return
    message = "invalid config:\n  " + "\n  ".join(lines)
    # The constraints between a run's keys too, for every run whose own keys are sound, where
    # what every run shares is (the defaults, the data, the seeds): all in one message.
    shared = {"defaults", "data", "seeds", "strict"}
    if not any(e.absolute_path and e.absolute_path[0] in shared for e in errors):
        filled = dict(config, studies=studies)
        filled["defaults"] = deep_merge(run_defaults(schema), config.get("defaults") or {})
        try:
            resolve_runs(filled, schema, skip=broken)
        except SpecError as e:
            message += f"\n{e}"
    raise SpecError(message)


def _raise_errors(title: str, errors, prefix: tuple[str, ...]) -> None:
    if lines := _error_lines(errors, prefix):
        raise SpecError(f"{title}:\n  " + "\n  ".join(lines))


def _error_lines(errors, prefix: tuple[str, ...]) -> list[str]:
    """Each schema error explained (`_explain`), in the order of their key paths."""
    return [
        line
        for error in sorted(errors, key=lambda e: list(map(str, e.absolute_path)))
        for line in _explain(error, prefix)
    ]


def _explain(error, prefix: tuple[str, ...]) -> list[str]:
    """One line per problem: `key.path: what is wrong; what is allowed`."""
    path = [*prefix, *map(str, error.absolute_path)]
    where = ".".join(path) or "config"
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        lines = []
        for key in sorted(set(error.instance) - set(allowed)):
            hint = difflib.get_close_matches(key, allowed, n=1)
            guess = f" (did you mean {hint[0]!r}?)" if hint else ""
            lines.append(
                f"{'.'.join([*path, key])}: unknown key{guess}; allowed: {', '.join(allowed)}"
            )
        return lines
    if error.validator == "type" and isinstance(error.instance, float):
        wanted = error.validator_value
        if not math.isfinite(error.instance):
            return [f"{where}: {error.instance} is not a finite number"]
        if "integer" in (wanted if isinstance(wanted, list) else [wanted]):
            if not error.instance.is_integer():  # 2.5: no integer is meant
                return [f"{where}: {error.instance!r} is not a whole number; write an integer"]
            return [
                f"{where}: {error.instance!r} is not a whole number written as one "
                f"(write {int(error.instance)})"
            ]
    if error.validator == "enum":
        choices = ", ".join(map(str, error.validator_value))
        return [f"{where}: {error.instance!r} is not allowed; allowed: {choices}"]
    if error.validator == "pattern" and (rule := error.schema.get("x-rule")):
        return [f"{where}: {error.instance!r} is not allowed: {rule}"]
    if "propertyNames" in error.schema_path and error.validator == "maxLength":
        name, most = error.instance, error.validator_value
        return [
            f"{where}: name {name[:24]!r}… is {len(name)} characters long, more than the "
            f"{most} allowed (a run's name becomes folder and file names, which hold at "
            "most 255 bytes with the pipeline's suffixes)"
        ]
    if "propertyNames" in error.schema_path:
        rule = error.schema.get("description", f"must match {error.validator_value!r}")
        return [f"{where}: name {error.instance!r} is not allowed: {rule}"]
    return [f"{where}: {error.message}"]


def resolve_runs(
    config: dict[str, Any],
    schema: dict[str, Any] | None = None,
    skip: Collection[tuple[str, str]] = (),
) -> dict[str, RunSpec]:
    """Expand the studies of a (schema-validated) config into run specs keyed '<study>/<run>'.

    Raises one SpecError listing every problem of every run, each naming its key: the schema's
    errors, the constraints between keys (`RunSpec.problems`), a batch the training set can't
    fill where its size is known before the data is read (dmls.config.data_sizes), a
    `baseline` that is no run. Under `strict`, a run whose spec pins the CPU yet asks for what
    only a GPU does is an error here too: it could only be skipped, which strict forbids.
    `skip`: the (study, run) pairs not to build, their bad keys named already (check_config).
    """
    schema = schema or load_schema()
    validator = run_validator(schema)
    runs: dict[str, RunSpec] = {}
    problems: list[str] = []
    for study, definition in config["studies"].items():
        for run, overrides in (definition.get("runs") or {}).items():
            if (study, run) in skip:  # (its bad keys named already: check_config)
                continue
            merged = deep_merge(config["defaults"], definition.get("base") or {}, overrides or {})
            if config.get("seeds") is not None:  # the command line's `--config seeds=N`
                merged["seeds"] = config["seeds"]
            prefix = ("studies", study, "runs", run)
            if errors := _error_lines(validator.iter_errors(merged), prefix):
                problems += errors
                continue
            spec = _build(RunSpec, {"study": study, "run": run, **merged}, ".".join(prefix))
            problems += spec.problems()
            problems += data_sizes.problems(spec, config.get("data") or {}, schema)
            runs[spec.run_id] = spec
    for study, definition in config["studies"].items():
        baseline = definition.get("baseline")
        names = list(definition.get("runs") or {})
        if baseline is not None and names and baseline not in names:
            problems.append(
                f"studies.{study}.baseline: {baseline!r} is not one of its runs {names}"
            )
    conflicts = [line for spec in runs.values() for line in spec.cpu_conflicts()]
    message = ["invalid run spec:\n  " + "\n  ".join(problems)] if problems else []
    if config.get("strict") and conflicts:
        message.append(
            "strict: true, but these runs pin device 'cpu' and ask for what only a GPU "
            "does, so they could only be skipped (set strict: false to record them as "
            "skipped):\n  " + "\n  ".join(conflicts)
        )
    if message:
        raise SpecError("\n".join(message))
    return runs


def run_defaults(schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """A whole run spec of the schema's defaults (every key of `$defs.run`), for code that
    builds runs outside a config: the special studies that train through the engine."""

    def default(node: dict[str, Any]) -> Any:
        if "properties" in node:
            found = {k: default(v) for k, v in node["properties"].items() if _has_default(v)}
            return deep_merge(node.get("default", {}), found)
        return copy.deepcopy(node["default"])

    return default((schema or load_schema())["$defs"]["run"])


def _has_default(node: dict[str, Any]) -> bool:
    return "default" in node or any(_has_default(v) for v in node.get("properties", {}).values())


def special_study_config(study: str, config_path: Path | None = None) -> dict[str, Any]:
    """A special study's settings as the default DAG runs it: config/config.yaml's
    `special_studies.<study>` over the schema's defaults (for the bench scripts that run a
    study's code outside Snakemake)."""
    schema = load_schema()["properties"]["special_studies"]["properties"][study]
    cfg = {k: v["default"] for k, v in schema["properties"].items() if "default" in v}
    path = config_path or SCHEMA_PATH.parents[1] / "config.yaml"
    return cfg | (yaml.safe_load(path.read_text())["special_studies"].get(study) or {})


def special_run_spec(study: str, run: str, **overrides: Any) -> RunSpec:
    """A run spec of the schema's defaults under `overrides` (nested mappings merge),
    validated as a config's runs are."""
    schema = load_schema()
    merged = deep_merge(run_defaults(schema), overrides)
    _raise_errors("invalid run spec", run_validator(schema).iter_errors(merged), (study, run))
    return RunSpec.from_dict({"study": study, "run": run, **merged})
