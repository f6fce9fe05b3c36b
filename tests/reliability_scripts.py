"""The scripts that test_reliability.py runs in child processes (see child.py).

Each calls ``case(id, fn)`` (from child.PRELUDE) once per case, so a case that kills the
interpreter is named in the failure. Arguments arrive in ``sys.argv``.
"""

ABSURD_SCRIPT = '''
# Work is counted, not timed: Python line events while the load runs (sys.settrace). A loop
# sized by an absurd count runs past LINE_CAP, and the tracer then stops it with WorkBudget.
import json, resource, sys, time, tracemalloc, pyggml_codec
cases, valid, LINE_CAP = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
pyggml_codec.load(valid, "cpu", n_threads=1).close()  # warm: imports, backend, a full load
base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
class WorkBudget(BaseException):
    pass
for case_id, path in cases:
    def attempt(path=path):
        lines = [0]
        def tracer(frame, event, arg):
            if event == "line":
                lines[0] += 1
                if lines[0] > LINE_CAP:
                    sys.settrace(None)
                    raise WorkBudget(f"more than {LINE_CAP} Python lines")
            return tracer
        tracemalloc.start()
        t0 = time.perf_counter()
        sys.settrace(tracer)
        try:
            pyggml_codec.load(path, "cpu", n_threads=1).close()
            out = {"raised": None}
        except BaseException as exc:
            out = {"raised": type(exc).__name__, "mro": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}
        finally:
            sys.settrace(None)
        out["seconds"] = time.perf_counter() - t0  # printed, never asserted
        out["lines"] = lines[0]
        out["peak_mb"] = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        return out
    case(case_id, attempt)
case("rss", lambda: {"growth_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base_rss})
'''


FUZZ_GUARD = '''
import random, sys, gguf_fuzz
data = open(sys.argv[1], "rb").read()
header_end, n = int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(1234)
for i in range(n):
    edits = gguf_fuzz.random_edits(rng, header_end, len(data))
    case(f"mutation{i}:{edits}".replace(" ", ""), lambda e=edits: gguf_fuzz.load_or_refuse(gguf_fuzz.apply(data, e)))
'''


SWEEP_SCRIPT = '''
import sys, numpy as np, pyggml_codec
LENGTHS = [1, 2, 511, 512, 513, 2047, 2048, 2049, 4099, 10007]
for path in sys.argv[1:]:
    kind = "f16file" if "f16" in path else "f32file"
    for precision in ("f32", "s2cpp"):
        codec = pyggml_codec.load(path, "cpu", n_threads=1, precision=precision)
        for pad in ("code_frame", "frame_length"):
            for n in LENGTHS:
                x = (0.1 * np.random.default_rng(n).standard_normal(n)).astype(np.float32)
                def enc(x=x, pad=pad):
                    c = codec.encode(x, pad_to=pad)
                    return {"shape": list(c.shape), "dtype": str(c.dtype), "min": int(c.min()),
                            "row_max": c.max(axis=1).tolist()}
                case(f"encode/{kind}/{precision}/{pad}/n={n}", enc)
        for decode_path in ("split", "fused"):
            for t in (1, 2, 3, 7, 9):
                codes = np.random.default_rng(t).integers(0, 32, (10, t))
                def dec(codes=codes, decode_path=decode_path):
                    a = codec.decode(codes, decode_path=decode_path)
                    return {"shape": list(a.shape), "dtype": str(a.dtype), "finite": bool(np.isfinite(a).all())}
                case(f"decode/{kind}/{precision}/{decode_path}/T={t}", dec)
        codec.close()
'''


THREADS_SCRIPT = '''
import sys, threading, numpy as np, pyggml_codec
from concurrent.futures import ThreadPoolExecutor
SIZES = [64] + [32] * 9
def codes(t, seed):
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(0, s, t) for s in SIZES]).astype(np.int32)
codec = pyggml_codec.load(sys.argv[1], "cpu", n_threads=1)
jobs = [("decode", codes(t, s)) for t, s in ((5, 0), (5, 1), (3, 2), (9, 3), (5, 4))]
jobs.append(("encode", (0.1 * np.random.default_rng(5).standard_normal(2 * 2048 + 7)).astype(np.float32)))
run = lambda job: codec.decode(job[1]) if job[0] == "decode" else codec.encode(job[1])
serial = [run(j) for j in jobs]
def worker(k):
    order = [(k + i) % len(jobs) for i in range(len(jobs))] * 2
    return [i for i in order if not np.array_equal(run(jobs[i]), serial[i])]
def shared():
    with ThreadPoolExecutor(4) as pool:
        wrong = [f.result() for f in [pool.submit(worker, k) for k in range(4)]]
    return {"calls": 4 * 2 * len(jobs), "wrong": sum(wrong, [])}
case("four_threads", shared)
def close_while_busy():
    outcomes, started = [], threading.Barrier(4)
    def busy(k):
        started.wait()
        for n in range(100000):  # until closed: a fixed short run could end first on a loaded machine
            try:
                ok = np.array_equal(run(jobs[(k + n) % len(jobs)]), serial[(k + n) % len(jobs)])
                outcomes.append("equal" if ok else "WRONG")
            except pyggml_codec.ClosedError:
                outcomes.append("closed")
                return
    threads = [threading.Thread(target=busy, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    started.wait()
    codec.decode(jobs[0][1])
    codec.close()
    for t in threads:
        t.join()
    return {o: outcomes.count(o) for o in set(outcomes)}
case("close_while_busy", close_while_busy)
'''


RSS_SCRIPT = '''
import os, sys, numpy as np, pyggml_codec
path, broken, cycles, warm = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
page = os.sysconf("SC_PAGE_SIZE")
rss_mb = lambda: int(open("/proc/self/statm").read().split()[1]) * page / 2**20
n_fds = lambda: len(os.listdir("/proc/self/fd"))
x = (0.1 * np.random.default_rng(0).standard_normal(4096)).astype(np.float32)
def cycle():
    with pyggml_codec.load(path, "cpu", n_threads=1) as c:
        out = (c.encode(x), c.decode(np.zeros((10, 2), np.int32)))
    try:
        pyggml_codec.load(broken, "cpu", n_threads=1).close()  # the failure path must not leak either
    except pyggml_codec.ModelFileError:
        pass
    else:
        raise AssertionError(f"the broken file {broken} loaded; the cycle must exercise the failure path")
    return out
def cycles_():
    ref = cycle()
    for i in range(1, cycles):
        out = cycle()
        assert all(np.array_equal(a, b) for a, b in zip(out, ref)), f"cycle {i} gave other results"
        if i + 1 == warm:
            base = (rss_mb(), n_fds())
    return {"rss_mb": rss_mb() - base[0], "fds": n_fds() - base[1], "base_mb": base[0]}
case("growth", cycles_)
'''


INTERRUPT_SCRIPT = '''
# Each interrupt is fired from inside encode at a point that exists whatever the machine's
# speed (a hook on the N-th call of a stage), so it always lands inside the call: mid graph
# build, after the encoder graph's compute, before the quantizer graph's, in the host VQ.
import _thread, functools, os, signal, sys, numpy as np, pyggml_codec
# A job started in the background by a non-interactive shell inherits SIGINT ignored, and Python
# then leaves it so (interrupt_main does nothing): install Python's own handler, as a terminal has.
signal.signal(signal.SIGINT, signal.default_int_handler)
from pyggml_codec.graphs import ops
from pyggml_codec.model import vq
from pyggml_codec.backend import ggml_graph as runtime  # Graph lives in backend.ggml_graph
x = (0.1 * np.random.default_rng(0).standard_normal(3 * 44100)).astype(np.float32)
codec = pyggml_codec.load(sys.argv[1], "cpu", n_threads=2)
ref = codec.encode(x)
fire = {"interrupt_main": _thread.interrupt_main, "sigint": lambda: os.kill(os.getpid(), signal.SIGINT)}
armed = {}
def hooked(owner, name, after=False):
    original = getattr(owner, name)
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        hook = armed.get(name)
        if hook is not None and not after:
            hook()
        result = original(*args, **kwargs)
        if hook is not None and after:
            hook()
        return result
    setattr(owner, name, wrapper)
hooked(ops.Builder, "input")
hooked(runtime.Graph, "run", after=True)
hooked(runtime.Graph, "build")
hooked(vq, "residual_quantize")
def at_call(name, n, how):
    count = [0]
    def hook():
        count[0] += 1
        if count[0] == n:
            armed.pop(name)
            fire[how]()
    armed[name] = hook
for i, (how, name, n, fresh) in enumerate([("interrupt_main", "input", 3, True), ("sigint", "run", 1, False),
                                            ("interrupt_main", "build", 2, True),
                                            ("sigint", "residual_quantize", 1, False)]):
    def run(how=how, name=name, n=n, fresh=fresh):
        if fresh:
            codec.clear_cache()  # so that the interrupt lands while graphs are being built
        at_call(name, n, how)
        done = False
        try:
            codec.encode(x)
            done = True
        except KeyboardInterrupt:
            pass
        armed.pop(name, None)
        same = bool(np.array_equal(codec.encode(x), ref))
        return {"outcome": "late" if done else "interrupted", "same": same}
    case(f"{i}:{how}@{name}#{n}", run)
'''
