"""GPU timings of chapter 15's kernels: measured live, stored by the benchmark, or read from
ropelib's own GPU benchmark.

Three sources, never mixed up:

- ``measure``: times the step kernels of ``ropelib.book.gpu_steps`` now, against ``copy_``
  of the same bytes in the same process (on CUDA with ``triton.testing.do_bench``: CUDA
  events, L2 flushed, medians; on the CPU a dry run in Triton's interpreter whose times mean
  nothing). ``benchmarks/bench_gpu_steps.py`` writes its result with ``format_step_run``.
- ``read_step_run`` / ``latest_step_run``: a stored run of the step kernels. Its header
  carries the hash of the kernels' source it timed; a run whose hash differs from
  ``gpu_steps.source_hash()`` is refused (ValueError): its numbers belong to other code.
- ``read_bench_gpu`` / ``read_bench_run``: the tables of ``benchmarks/bench_gpu.py``
  (ropelib's own kernel, the compiled formulas, decode steps), e.g. ``2026-11-26-h200.txt``
  (several runs) or ``2026-11-27-h200-run6.txt`` (one). No hash ties them to the step
  kernels.
"""

from __future__ import annotations

import datetime
import math
import re
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import triton

from ..rotation import apply_rope
from ..tables import generate_rope_embeddings
from . import gpu_steps

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
BENCH_GPU = RESULTS / "2026-11-26-h200.txt"
STEP_RUNS = "*-gpu-steps.txt"
"""The file names ``benchmarks/bench_gpu_steps.py`` stores its runs under."""

SHAPE = (4, 32, 4096, 128)
QK_HEADS = (32, 8)
DECODE_ROWS = 64
TUNED = {"block_s": 16, "heads_per_program": 4, "num_warps": 8}
"""Step 4's launch: ropelib's kernel's choice from its H200 tile sweep (tokens and heads a
program, warps), fixed before any run of the step kernels."""
SWEEP = {"block_s": (16, 32), "heads_per_program": (2, 4, 8), "num_warps": (4, 8)}
STEP3 = "step 3: tables once per block"
STEP4 = "step 4: tuned launch"
CASES = ("copy_", "step 1: tables per head", "step 2: stride-2 loads",
         "step 2: rows split in registers", STEP3, STEP4, "q and k: copy_ both",
         "q and k: one launch", "q and k: two launches", "backward: step 3 with -theta",
         "HF formula compiled", "GPT-J stack compiled", "decode: eager call",
         "decode: CUDA graph replay")
COLUMNS = ("case", "dtype", "layout", "config", "us", "baseline_us", "max_err")


@dataclass(frozen=True)
class Timing:
    """One timed case: ``us`` its median time, ``baseline_us`` that of its baseline in the
    same run (``copy_`` of the same bytes; NaN where it has none), ``max_err`` its largest
    difference from a float64 rotation (NaN where not computed)."""

    case: str
    dtype: str
    layout: str
    config: str
    us: float
    baseline_us: float
    max_err: float

    @property
    def ratio(self) -> float:
        return self.us / self.baseline_us


@dataclass
class StepRun:
    """A run of ``measure``: ``meta`` (device, versions, commit, kernels' hash, shapes) and
    its timings."""

    meta: dict[str, str]
    timings: list[Timing] = field(default_factory=list)

    def find(self, case: str, dtype: str = "", layout: str = "", config: str | None = None
             ) -> list[Timing]:
        """The timings of ``case`` (and of the dtype, layout and config given)."""
        return [t for t in self.timings if t.case == case and (not dtype or t.dtype == dtype)
                and (not layout or t.layout == layout) and (config is None or t.config == config)]


def config_text(block_s: int, heads_per_program: int | None = None,
                num_warps: int | None = None) -> str:
    """A launch's shape as it is stored, e.g. ``block_s=16 heads=4 warps=8``."""
    parts = [f"block_s={block_s}"]
    if heads_per_program is not None:
        parts.append(f"heads={heads_per_program}")
    if num_warps is not None:
        parts.append(f"warps={num_warps}")
    return " ".join(parts)


# --------------------------------------------------------------------------- stored step runs

def format_step_run(run: StepRun) -> str:
    """The text a step run is stored as: ``# key: value`` lines, then a CSV table."""
    lines = [f"# {key}: {value}" for key, value in run.meta.items()]
    lines.append(",".join(COLUMNS))
    for t in run.timings:
        lines.append(",".join([t.case, t.dtype, t.layout, t.config, f"{t.us:.3f}",
                               f"{t.baseline_us:.3f}", f"{t.max_err:.3g}"]))
    return "\n".join(lines) + "\n"


def parse_step_run(text: str) -> StepRun:
    """``format_step_run``'s text back as a StepRun (no hash check: see ``read_step_run``)."""
    meta, timings, header = {}, [], None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith("# "):
            key, sep, value = line[2:].partition(": ")
            if not sep:
                raise ValueError(f"line {number}: a header line is '# key: value', got {line!r}")
            meta[key] = value
        elif header is None:
            header = tuple(line.split(","))
            if header != COLUMNS:
                raise ValueError(f"line {number}: expected the columns {','.join(COLUMNS)}, "
                                 f"got {line!r}")
        else:
            cells = line.split(",")
            if len(cells) != len(COLUMNS):
                raise ValueError(f"line {number}: expected {len(COLUMNS)} comma-separated "
                                 f"values, got {line!r}")
            case, dtype, layout, config, us, baseline, err = cells
            timings.append(Timing(case, dtype, layout, config, float(us), float(baseline),
                                  float(err)))
    if header is None:
        raise ValueError("no table: a step run has a header line with the columns "
                         f"{','.join(COLUMNS)}")
    return StepRun(meta, timings)


def read_step_run(path: str | Path) -> StepRun:
    """A stored step run, refused (ValueError) unless it timed the step kernels of this
    source (``kernels-sha256`` equal to ``gpu_steps.source_hash()``) on a CUDA device."""
    path = Path(path)
    run = parse_step_run(path.read_text())
    stored, current = run.meta.get("kernels-sha256"), gpu_steps.source_hash()
    if stored != current:
        raise ValueError(f"{path.name} timed step kernels whose source hashes to {stored}; "
                         f"ropelib/book/gpu_steps.py's kernels hash to {current}. Its numbers "
                         f"belong to other code: rerun benchmarks/bench_gpu_steps.py on a GPU "
                         f"and replace the file (or delete it)")
    if not run.meta.get("device", "").startswith("cuda"):
        raise ValueError(f"{path.name} was not measured on a CUDA device "
                         f"(device: {run.meta.get('device')!r}): a dry run is no measurement")
    return run


def step_runs(folder: str | Path = RESULTS) -> list[StepRun]:
    """Every stored step run in ``folder`` (``*-gpu-steps.txt``), oldest first; a stored run
    of other kernels makes this raise (``read_step_run``)."""
    return [read_step_run(path) for path in sorted(Path(folder).glob(STEP_RUNS))]


def latest_step_run(folder: str | Path = RESULTS) -> StepRun:
    """The newest stored step run in ``folder`` (by file name, which starts with the date);
    FileNotFoundError if there is none."""
    runs = step_runs(folder)
    if not runs:
        raise FileNotFoundError(f"no stored run of the step kernels ({STEP_RUNS}) in {folder}: "
                                f"run benchmarks/bench_gpu_steps.py on a GPU and store its "
                                f"output there")
    return runs[-1]


# --------------------------------------------------------------------------- measuring

def measure(device: str = "cuda", *, shape: tuple[int, int, int, int] = SHAPE,
            qk_heads: tuple[int, int] = QK_HEADS, decode_rows: int = DECODE_ROWS,
            dtypes: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float32),
            sweep: dict[str, tuple[int, ...]] | None = None, compiled: bool = True,
            log: Callable[[str], None] = lambda line: None) -> StepRun:
    """Time every step kernel against ``copy_`` in this process.

    Args:
        device: ``"cuda"`` (timed with CUDA events, L2 flushed, medians) or ``"cpu"`` (a dry
            run in Triton's interpreter: every code path once, at small shapes; its times
            mean nothing and ``read_step_run`` refuses it).
        shape: x ``(batch, heads, seq, head_dim)`` of the single-tensor cases.
        qk_heads: heads of q and of k for the q-and-k and decode cases.
        decode_rows: sequences in the decode step (one token each, own positions).
        dtypes: the dtypes of the single-tensor cases.
        sweep: step 4's launch shapes (``SWEEP`` by default): values of block_s,
            heads_per_program and num_warps, every combination timed.
        compiled: also time ``torch.compile`` of the Hugging Face formula and GPT-J's stack.
        log: called with a line of progress per case.
    """
    cuda = device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise ValueError("device='cuda' needs a CUDA GPU; use device='cpu' for a dry run")
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    timer = _do_bench if cuda else _cpu_median
    run = StepRun(_meta(device, shape, qk_heads, decode_rows))
    sweep = SWEEP if sweep is None else sweep
    b, h, s, d = shape
    cos, sin = generate_rope_embeddings(s, d, device=device)
    for dtype in dtypes:
        name = str(dtype).removeprefix("torch.")
        x = torch.randn(shape, device=device).to(dtype)
        buffer = torch.empty_like(x)
        copy = timer(lambda x=x, buffer=buffer: buffer.copy_(x))
        run.timings.append(Timing("copy_", name, "", "", copy, copy, 0.0))
        cases = _single_tensor_cases(x, cos, sin, sweep)
        if compiled:
            cases += _compiled_cases(x, cos, sin)
        expected = {layout: apply_rope(x.double(), cos.double(), sin.double(), layout=layout)
                    for layout in ("half", "interleaved")}
        for case, layout, config, fn in cases:
            run.timings.append(_timed(case, name, layout, config, fn, expected[layout], copy,
                                      timer))
            log(f"{case} {name} {layout} {config}: {run.timings[-1].ratio:.2f}x copy_")
    for part in (lambda: _qk_cases(run, device, shape, qk_heads, cos, sin, timer, log),
                 lambda: _decode_cases(run, device, shape, qk_heads, decode_rows, timer, log)):
        try:
            part()
        except Exception as error:  # stored as a failed row: the rest of the run is kept
            run.timings.append(Timing(f"failed: {type(error).__name__}", "", "",
                                      str(error)[:80].replace(",", ";").replace("\n", " "),
                                      math.nan, math.nan, math.nan))
            log(f"failed: {type(error).__name__}: {error}")
    return run


def _single_tensor_cases(x, cos, sin, sweep):
    cases = []
    for block_s in (8, 16, 32, 64):
        config = config_text(block_s, None, 4)
        cases.append(("step 1: tables per head", "half", config, lambda bs=block_s:
                      gpu_steps.per_head(x, cos, sin, block_s=bs)))
        for strided, case in ((True, "step 2: stride-2 loads"),
                              (False, "step 2: rows split in registers")):
            cases.append((case, "interleaved", config, lambda bs=block_s, st=strided:
                          gpu_steps.interleaved(x, cos, sin, strided=st, block_s=bs)))
    for layout in ("half", "interleaved"):
        for block_s, warps in ((8, 4), (16, 4), (32, 8)):
            cases.append((STEP3, layout, config_text(block_s, x.shape[1], warps),
                          lambda lay=layout, bs=block_s, w=warps: gpu_steps.blocks(
                              x, None, cos, sin, layout=lay, block_s=bs, num_warps=w)[0]))
        for block_s in sweep["block_s"]:
            for heads in sweep["heads_per_program"]:
                for warps in sweep["num_warps"]:
                    cases.append((STEP4, layout, config_text(block_s, heads, warps),
                                  lambda lay=layout, bs=block_s, hp=heads, w=warps:
                                  gpu_steps.blocks(x, None, cos, sin, layout=lay, block_s=bs,
                                                   heads_per_program=hp, num_warps=w)[0]))
    return cases


def _compiled_cases(x, cos, sin):
    half = x.shape[-1] // 2
    wide = [torch.cat((t, t), -1).to(x.dtype) for t in (cos, sin)]

    def hf(x, cos_wide, sin_wide):  # Hugging Face Llama: x cos + rotate_half(x) sin
        rotated = torch.cat((-x[..., half:], x[..., :half]), -1)
        return x * cos_wide + rotated * sin_wide

    def gptj(x, cos, sin):  # GPT-J / RoFormer: pairs (2i, 2i + 1), stacked back
        a, b = x[..., 0::2].float(), x[..., 1::2].float()
        return torch.stack((a * cos - b * sin, a * sin + b * cos), -1).flatten(-2).to(x.dtype)

    hf_c, gptj_c = torch.compile(hf), torch.compile(gptj)
    return [("HF formula compiled", "half", "", lambda: hf_c(x, *wide)),
            ("GPT-J stack compiled", "interleaved", "", lambda: gptj_c(x, cos, sin))]


def _timed(case, dtype, layout, config, fn, expected, baseline, timer) -> Timing:
    try:
        err = (fn().double() - expected).abs().max().item()
        return Timing(case, dtype, layout, config, timer(fn), baseline, err)
    except Exception as error:  # a failed case is stored as such, not fatal
        return Timing(case, dtype, layout, f"{config} failed: {type(error).__name__}",
                      math.nan, baseline, math.nan)


def _qk_cases(run, device, shape, qk_heads, cos, sin, timer, log):
    b, _, s, d = shape
    q = torch.randn(b, qk_heads[0], s, d, device=device).to(torch.bfloat16)
    k = torch.randn(b, qk_heads[1], s, d, device=device).to(torch.bfloat16)
    q_buf, k_buf = torch.empty_like(q), torch.empty_like(k)
    grad = torch.randn_like(q)

    def copies():
        q_buf.copy_(q)
        k_buf.copy_(k)

    copy = timer(copies)
    config = config_text(TUNED["block_s"], TUNED["heads_per_program"], TUNED["num_warps"])
    run.timings.append(Timing("q and k: copy_ both", "bfloat16", "half", "", copy, copy, 0.0))
    cases = {
        "q and k: one launch": lambda: gpu_steps.blocks(q, k, cos, sin, layout="half", **TUNED),
        "q and k: two launches": lambda: (gpu_steps.blocks(q, None, cos, sin, layout="half",
                                                           **TUNED)[0],
                                          gpu_steps.blocks(k, None, cos, sin, layout="half",
                                                           **TUNED)[0]),
    }
    for case, fn in cases.items():
        q_out, k_out = fn()
        err = max((q_out.double() - apply_rope(q.double(), cos.double(), sin.double(),
                                               layout="half")).abs().max().item(),
                  (k_out.double() - apply_rope(k.double(), cos.double(), sin.double(),
                                               layout="half")).abs().max().item())
        run.timings.append(Timing(case, "bfloat16", "half", config, timer(fn), copy, err))
        log(f"{case}: {run.timings[-1].ratio:.2f}x copy_ both")
    grad_copy = timer(lambda: q_buf.copy_(grad))
    expected = apply_rope(grad.double(), cos.double(), -sin.double(), layout="half")
    run.timings.append(_timed(
        "backward: step 3 with -theta", "bfloat16", "half", config,
        lambda: gpu_steps.blocks(grad, None, cos, sin, layout="half", inverse=True,
                                 **TUNED)[0], expected, grad_copy, timer))
    log(f"backward: {run.timings[-1].ratio:.2f}x copy_")


def _decode_cases(run, device, shape, qk_heads, rows, timer, log):
    """One decode step: q (rows, heads_q, 1, d) and k (rows, heads_k, 1, d), each row at its
    own position: the table rows gathered by indexing (a device gather, no host read), then
    one launch. Eager: wall time per call, Python included; CUDA graph: per replay."""
    d = shape[-1]
    table_len = 8192
    cos, sin = generate_rope_embeddings(table_len, d, device=device)
    q = torch.randn(rows, qk_heads[0], 1, d, device=device).to(torch.bfloat16)
    k = torch.randn(rows, qk_heads[1], 1, d, device=device).to(torch.bfloat16)
    out = (torch.empty_like(q), torch.empty_like(k))
    positions = torch.randint(0, table_len, (rows,), device=device)
    config = config_text(TUNED["block_s"], TUNED["heads_per_program"], TUNED["num_warps"])

    def step():
        cos_rows = cos[positions][:, None].contiguous()  # (rows, 1, d/2)
        sin_rows = sin[positions][:, None].contiguous()
        gpu_steps.blocks(q, k, cos_rows, sin_rows, layout="half", out=out, **TUNED)

    step()
    expected = apply_rope(q.double(), cos[positions][:, None, None].double(),
                          sin[positions][:, None, None].double(), layout="half")
    err = (out[0].double() - expected).abs().max().item()
    calls = 200 if device == "cuda" else 2
    run.timings.append(Timing("decode: eager call", "bfloat16", "half", config,
                              _wall_per_call(step, calls, device), math.nan, err))
    log(f"decode eager: {run.timings[-1].us:.1f} us per call")
    if device == "cuda":
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            step()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            step()
        run.timings.append(Timing("decode: CUDA graph replay", "bfloat16", "half", config,
                                  timer(graph.replay), math.nan, err))
        log(f"decode graph replay: {run.timings[-1].us:.1f} us")


def _do_bench(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3  # ms -> us


def _cpu_median(fn, repeats: int = 1) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


def _wall_per_call(fn, calls: int, device: str) -> float:
    for _ in range(min(calls, 20)):
        fn()
    samples = []
    for _ in range(7 if device == "cuda" else 1):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def _meta(device, shape, qk_heads, decode_rows) -> dict[str, str]:
    if device == "cuda":
        card = f"cuda: {torch.cuda.get_device_name()}"
        timer = "triton.testing.do_bench medians (CUDA events, L2 flushed), microseconds"
    else:
        card = "cpu (Triton's interpreter: a dry run, the times mean nothing)"
        timer = "time.perf_counter of one call (dry run)"
    return {
        "date": datetime.date.today().isoformat(),
        "device": card,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "commit": _commit(),
        "kernels-sha256": gpu_steps.source_hash(),
        "shape": str(tuple(shape)),
        "qk heads": str(tuple(qk_heads)),
        "decode rows": str(decode_rows),
        "timer": timer,
    }


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, timeout=10, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git)"
    return head.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")


# --------------------------------------------------------------------------- bench_gpu.py runs

def read_bench_gpu(path: str | Path = BENCH_GPU) -> dict[str, dict[str, dict[str, object]]]:
    """The tables of a ``bench_gpu.py`` results file: run ("Run 4") -> table title -> row
    name -> its numbers (a list of floats) or its text where it has none ("capture
    failed: ..."). Each run's tile sweep is the table "sweep", its rows "dtype layout" ->
    ``{"default": (config, ratio), "best": [(config, ratio), ...]}``. A file of one run,
    without "## Run N" headings (``2026-11-27-h200-run6.txt``), is the run ``""``
    (``read_bench_run``)."""
    tables: dict[str, dict[str, object]] = {}
    runs: dict[str, dict[str, dict[str, object]]] = {"": tables}
    title, rows, previous = None, None, ""
    for line in Path(path).read_text().splitlines():
        run = re.match(r"## (Run \d+)", line)
        if run:
            tables = runs.setdefault(run.group(1), {})
            title, rows = None, None
        elif re.match(r"(formulation|module)\s{2,}", line) and previous:
            title, rows = previous, {}
            tables[title] = rows
        elif line.startswith("sweep:"):
            rows = tables.setdefault("sweep", {})
            title = "sweep"
        elif not line.strip():
            title, rows = None, None
        elif rows is not None and title == "sweep":
            m = re.match(r"\s+torch\.(\w+) (\w+): default (\([\d, ]+\)) ([\d.]+); best (.*)", line)
            if m:
                best = re.findall(r"(\([\d, ]+\)) ([\d.]+)", m.group(5))
                rows[f"{m.group(1)} {m.group(2)}"] = {
                    "default": (m.group(3), float(m.group(4))),
                    "best": [(c, float(r)) for c, r in best]}
        elif rows is not None and not line.startswith(("#", " ")):
            m = re.match(r"(.+?)\s{2,}(\S.*)$", line)
            if m:
                values: list[object] = []
                rest = m.group(2).strip()
                while (number := re.match(r"(-?\d+(?:\.\d+)?)(?:\s+|$)", rest)):
                    values.append(float(number.group(1)))
                    rest = rest[number.end():]
                rows[m.group(1)] = values + ([rest] if rest else [])
        previous = line if not line.startswith("#") else previous
    if not runs[""]:
        del runs[""]
    return runs


def read_bench_run(name: str) -> dict[str, dict[str, object]]:
    """The tables of the one run in ``benchmarks/results/<name>`` (``read_bench_gpu``)."""
    return read_bench_gpu(RESULTS / name)[""]


# --------------------------------------------------------------------------- steps for the chapter

@dataclass(frozen=True)
class StepPoint:
    """One step of chapter 15 in one dtype and layout: the traffic its kernel asks for in
    copies (``predicted``), its measured ratios to ``copy_`` over the launch shapes timed
    (``measured``), the one ratio that stands for the step (``shown``: step 4's chosen
    launch ``TUNED``, else the median over the launches), and where they come from."""

    step: str
    dtype: str
    layout: str
    predicted: float
    measured: tuple[float, ...]
    shown: float
    source: str


def predicted_ratio(design: str, heads: int, dtype: str,
                    heads_per_program: int | None = None) -> float:
    """``gpu_steps.predicted_bytes`` of a design over the bytes of a copy (independent of
    batch, seq and head_dim)."""
    x_bytes = {"bfloat16": 2, "float16": 2, "float32": 4}[dtype]
    args = (1, heads, 1, 2, x_bytes)
    return (gpu_steps.predicted_bytes(design, *args, heads_per_program=heads_per_program)
            / gpu_steps.predicted_bytes("copy", *args))


def run_steps(run: StepRun) -> list[StepPoint]:
    """The chapter's steps from a run of the step kernels (``measure`` or a stored run):
    each step's launches, step 4's chosen launch (``TUNED``) first."""
    heads = int(run.meta["shape"].strip("()").split(",")[1])
    tuned = config_text(TUNED["block_s"], TUNED["heads_per_program"], TUNED["num_warps"])
    points = []
    models = {"step 1: tables per head": ("per head", None),
              "step 2: stride-2 loads": ("per head", None),
              "step 2: rows split in registers": ("per head", None),
              STEP3: ("per block", None), STEP4: ("per block", TUNED["heads_per_program"])}
    for step, (model, per_program) in models.items():
        for dtype in sorted({t.dtype for t in run.find(step)}):
            for layout in ("half", "interleaved"):
                found = [t for t in run.find(step, dtype, layout) if t.us == t.us]
                if not found:
                    continue
                ratios = tuple(t.ratio for t in found)
                chosen = [t.ratio for t in found if t.config == tuned]
                shown = chosen[0] if step == STEP4 and chosen else statistics.median(ratios)
                points.append(StepPoint(step, dtype, layout,
                                        predicted_ratio(model, heads, dtype, per_program),
                                        ratios, shown,
                                        f"run of {run.meta['date']} on {run.meta['device']}"))
    return points
