"""``convsim load`` against bare aiohttp clients and guidellm, on the same mock server.

Run: python tests/bench/bench_load.py [--seconds S] [--repeats N] [--parts ...]
     [--guidellm PATH] [--vllm PATH] [--peers-venvs DIR]

Prints, each measured in this run (the mock server, ``convsim load`` and the peers in
their own processes, as users run them; the bare clients in this process):

1. ``closed``: closed loop, zero-latency mock, concurrency 256, one worker: requests/s of
   ``convsim load`` over those of two bare aiohttp loops, non-streaming and streaming,
   on asyncio and (where installed) uvloop, median and range over the repeats:
   - *bare*: ``bench_mock_server.drive``, the least a client can do (one prebuilt body,
     streams scanned for a marker, nothing parsed);
   - *bare client*: what any multi-turn load client must do at least: encode each
     request's body, parse the answer's JSON (every server-sent event of a stream) to
     get the text it feeds back, and time the first token.
   The client is the bottleneck in all of them (about a core each), so the ratio is that
   of their CPU per request, which is printed too.
2. ``open``: open loop, constant arrivals at 200 and 500 sessions/s: achieved rate
   against the target, send-delay p99, and whether the run is valid.
3. ``ttft``: streaming with the mock's TTFT at 50 ms: reported TTFT p50 at concurrency
   256 and 32, and whether each run is valid (a client that saturates is flagged).
4. ``memory``: 10,000 concurrent three-turn sessions against a mock answering in 1 s,
   1 s think time: peak RSS of the ``convsim load`` process and the sessions alive.
5. ``run``: the whole ``convsim run`` process (start-up, pack validation, the runtime,
   the default metrics, the results file and the summaries) for 20,000 one-turn
   conversations whose request is a bare loop's, at concurrency 256, against that bare
   loop sending the same 20,000 requests from this process (``bare_requests``: encodes
   each body, parses each answer; its own start-up is not counted, which favours it):
   the ratio of their wall times, median and range over the repeats, and the CPU per
   conversation of the ``convsim run`` process.
6. ``peers``: guidellm and vLLM's serving benchmark (``vllm bench serve``) on the same
   mock and settings (streaming, concurrency 32, 20-word prompts, 16 tokens out):
   requests/s, the client's cores over its own benchmark window and requests/s per
   core, and TTFT p50 at zero latency and with the mock's TTFT at 50 ms. Give their
   commands (``--guidellm PATH``, ``--vllm PATH``) or ``--peers-venvs DIR`` to install
   each in its own virtual environment there (both bring torch; vLLM's client runs on
   the CPU). vLLM's benchmark needs a tokenizer: a one-word-per-token vocabulary is
   written for it, so nothing is downloaded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).parent))
from bench_mock_server import Server, drive, mock_server

SESSIONS = ["--synthetic", "turns=1,input_tokens=20,output_tokens=16", "--no-exact-output"]
USER_TEXT = " ".join(["word"] * 20)

try:
    import uvloop
except ImportError:  # measured where installed
    uvloop = None

LOOPS = ["asyncio"] + (["uvloop"] if uvloop is not None else [])


# -- measuring other processes --------------------------------------------------------


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, []))
    return found


def _cpu(pids: list[int]) -> float:
    total = 0.0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # own time and that of children it has reaped: a worker that exits keeps counting
        total += sum(int(f) for f in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK")


class CpuSampler(threading.Thread):
    """CPU of a process tree, sampled twice a second: the median rate in cores over
    the middle of the run (start-up and shutdown left out)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.samples: list[tuple[float, float]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.5):
            self.samples.append((time.perf_counter(), _cpu(_tree(self.pid))))

    def cores_over_last(self, seconds: float) -> float | None:
        """Cores used over the last ``seconds`` before the process ended (a tool's own
        benchmark window, which ends just before it exits): its start-up is left out."""
        if len(self.samples) < 2:
            return None
        t_end, c_end = self.samples[-1]
        start = [(t, c) for t, c in self.samples if t >= t_end - seconds - 0.25]
        t0, c0 = start[0] if start[0][0] < t_end else self.samples[-2]
        return (c_end - c0) / (t_end - t0)

    def busy_cores(self) -> float | None:
        rates = [
            (c1 - c0) / (t1 - t0)
            for (t0, c0), (t1, c1) in zip(self.samples, self.samples[1:], strict=False)
        ]
        if len(rates) < 3:
            return None
        cut = len(rates) // 5
        middle = sorted(rates[cut : len(rates) - cut] or rates)
        return statistics.median(middle)


class Measured:
    """A command's exit, peak RSS (MB) and CPU samples."""

    def __init__(self, code: int, max_rss_mb: float, sampler: CpuSampler, cpu_s: float) -> None:
        self.code, self.max_rss_mb, self.sampler = code, max_rss_mb, sampler
        self.cpu_s = cpu_s


def measure(command: list[str], **kw: Any) -> Measured:
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)
    sampler = CpuSampler(proc.pid)
    sampler.start()
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    sampler.done.set()
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{command[:4]} exited {proc.returncode}: {err.decode()[-2000:]}")
    return Measured(
        proc.returncode, usage.ru_maxrss / 1024, sampler, usage.ru_utime + usage.ru_stime
    )


def load(server: Server, *extra: str) -> tuple[dict[str, Any], Measured]:
    """One ``convsim load`` run against ``server``: its JSON result, and the process."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        measured = measure(
            [
                sys.executable, "-m", "convsim", "load",
                "--model", "openai-compatible:mock-model",
                "--model-arg", f"base_url={server.url}/v1",
                "--no-calibrate", "--out", str(out), *extra,
            ]
        )  # fmt: skip
        result: dict[str, Any] = json.loads(out.read_text())
        return result, measured


# -- the bare client: the least a multi-turn load client does --------------------------


async def bare_client(
    server: Server,
    *,
    seconds: float,
    concurrency: int,
    stream: bool,
    requests: float = float("inf"),
    text: str = USER_TEXT,
    max_tokens: int = 16,
    warm: bool = True,
) -> dict[str, float]:
    """``concurrency`` workers, each encoding its request's body, reading the answer's
    text from its JSON (every event of a stream) and timing the first token; for
    ``seconds`` or until ``requests`` are done."""
    headers = {"Content-Type": "application/json"}
    endpoint = server.url + "/v1/chat/completions"
    timeout = aiohttp.ClientTimeout(total=None, connect=10, sock_read=60)
    done = sent = 0
    user_text = text

    async def one(session: aiohttp.ClientSession) -> str:
        body = json.dumps(
            {
                "model": "mock-model",
                "messages": [{"role": "user", "content": user_text}],
                "max_tokens": max_tokens,
                "stream": stream,
            },
            separators=(",", ":"),
        ).encode()
        started = time.perf_counter()
        async with session.post(endpoint, data=body, headers=headers, timeout=timeout) as resp:
            if not stream:
                data = json.loads(await resp.read())
                return str(data["choices"][0]["message"]["content"])
            pieces: list[str] = []
            first = None
            async for line in resp.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                event = json.loads(line[6:])
                choices = event.get("choices") or [{}]
                text = choices[0].get("delta", {}).get("content")
                if text:
                    if first is None:
                        first = time.perf_counter() - started
                    pieces.append(text)
            return "".join(pieces)

    async def worker(session: aiohttp.ClientSession, stop_at: float) -> None:
        nonlocal done, sent
        while time.perf_counter() < stop_at and sent < requests:
            sent += 1
            await one(session)
            done += 1

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        if warm:
            await asyncio.gather(*(one(session) for _ in range(concurrency)))
        cpu = time.process_time()
        started = time.perf_counter()
        await asyncio.gather(*(worker(session, started + seconds) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu
    return {
        "rps": done / elapsed,
        "client_cores": cpu / elapsed,
        "us_per_request": cpu / done * 1e6,
    }


Job = Callable[[], Coroutine[Any, Any, dict[str, float]]]


def on_loop(loop: str, coro: Job) -> dict[str, float]:
    factory = uvloop.new_event_loop if loop == "uvloop" and uvloop is not None else None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro())


def _spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f} (range {min(values):.2f}-{max(values):.2f})"


# -- the parts -----------------------------------------------------------------------


def closed_loop(seconds: float, repeats: int) -> None:
    for stream in (False, True):
        for loop in LOOPS:
            vs_bare: list[float] = []
            vs_client: list[float] = []
            with mock_server() as server:
                for _ in range(repeats):
                    settings = {"seconds": seconds, "concurrency": 256, "stream": stream}
                    bare = on_loop(loop, lambda s=settings: drive(server, **s))  # type: ignore[misc]
                    client = on_loop(loop, lambda s=settings: bare_client(server, **s))  # type: ignore[misc]
                    result, _ = load(
                        server, *SESSIONS, "--concurrency", "256", "--duration", str(seconds),
                        "--warmup", "1", "--loop", loop,
                        "--model-arg", f"stream={str(stream).lower()}",
                    )  # fmt: skip
                    rps = result["throughput"]["requests_per_s"]
                    us = result["client"]["cpu_cores"] / rps * 1e6
                    vs_bare.append(rps / bare["rps"])
                    vs_client.append(rps / client["rps"])
                    bare_us = bare["client_cores"] / bare["rps"] * 1e6
                    print(
                        f"  closed c=256 stream={stream} {loop}: bare {bare['rps']:,.0f}/s "
                        f"({bare_us:.0f} us/req), bare client {client['rps']:,.0f}/s "
                        f"({client['us_per_request']:.0f} us/req), convsim load {rps:,.0f}/s "
                        f"({us:.0f} us/req, in flight {result['client']['mean_in_flight']:.0f})",
                        flush=True,
                    )
            print(
                f"closed loop c=256 stream={stream} {loop}: convsim load / bare "
                f"{_spread(vs_bare)}; / bare client {_spread(vs_client)}; target >= 0.8",
                flush=True,
            )


def open_loop(seconds: float) -> None:
    with mock_server() as server:
        for rate in (200, 500):
            r, _ = load(
                server, *SESSIONS, "--rate", str(rate), "--duration", str(seconds),
                "--warmup", "1", "--arrival", "constant",
            )  # fmt: skip
            print(
                f"open loop {rate}/s: achieved {r['achieved_rate']:.1f}/s "
                f"({(r['achieved_rate'] / rate - 1) * 100:+.2f}%), send delay p99 "
                f"{r['schedule_delay_ms']['p99']:.2f} ms, "
                f"valid {r['valid']} {r['invalid_reasons']}",
                flush=True,
            )


def ttft(seconds: float) -> None:
    with mock_server("--ttft-ms", "50") as server:
        for concurrency in (256, 32):
            r, _ = load(
                server, *SESSIONS, "--concurrency", str(concurrency), "--duration", str(seconds),
                "--warmup", "1",
            )  # fmt: skip
            print(
                f"streaming, server TTFT 50 ms, c={concurrency}: reported TTFT p50 "
                f"{r['latency_ms']['ttft']['p50']:.1f} ms, "
                f"{r['throughput']['requests_per_s']:,.0f} req/s, "
                f"valid {r['valid']} {r['invalid_reasons']}",
                flush=True,
            )


def memory(seconds: float, sessions: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = 2 * sessions + 1000  # the server's sockets and the client's, both children
    if soft < needed and (hard == resource.RLIM_INFINITY or hard >= needed):
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    with mock_server("--ttft-ms", "1000") as server:
        r, m = load(
            server, "--synthetic", "turns=3,input_tokens=64,output_tokens=16",
            "--no-exact-output", "--concurrency", str(sessions), "--think-time", "1",
            "--duration", str(max(seconds, 8.0)), "--ramp-up", "5", "--warmup", "2",
        )  # fmt: skip
    failed = r["requests"]["failed"]
    print(
        f"{sessions:,} concurrent sessions (1 s answers, 1 s think time, started over 5 s): "
        f"{failed} failed requests, peak RSS "
        f"{m.max_rss_mb:.0f} MB (target <= 500), sessions alive mean "
        f"{r['client']['mean_sessions']:,.0f} max {r['client']['max_sessions']:,}, requests in "
        f"flight mean {r['client']['mean_in_flight']:,.0f}, "
        f"{r['throughput']['requests_per_s']:,.0f} req/s, TTFT p50 "
        f"{r['latency_ms']['ttft']['p50']:.0f} ms, valid {r['valid']} {r['invalid_reasons']}",
        flush=True,
    )


RUN_TEXT = "Hello there, how are you?"
RUN_MAX_TOKENS = 32


def write_one_turn_pack(folder: Path, conversations: int) -> Path:
    """A pack of ``conversations`` one-turn conversations whose request is the bare
    loop's (one user message, ``RUN_MAX_TOKENS``)."""
    flows = {
        "default": {
            "turns": [
                {
                    "turn_id": "ask",
                    "prompt_template": RUN_TEXT,
                    "config": {"max_tokens": RUN_MAX_TOKENS},
                }
            ]
        }
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "turn_configs.yml").write_text(json.dumps(flows))
    with open(folder / "scenarios.jsonl", "w") as fh:
        for i in range(conversations):
            fh.write(json.dumps({"scenario_id": f"q{i:06d}", "scenario_description": "x"}) + "\n")
    return folder


def run_command(seconds_cap: float, conversations: int, repeats: int) -> None:
    """``convsim run`` of one-turn conversations, the whole process, against a bare loop
    sending the same requests (a fresh connection pool each, as the run has)."""
    ratios: list[float] = []
    with tempfile.TemporaryDirectory() as tmp, mock_server() as server:
        pack = write_one_turn_pack(Path(tmp) / "pack", conversations)
        out = Path(tmp) / "run.jsonl"
        for _ in range(repeats):
            bare = on_loop(
                "asyncio",
                lambda: bare_client(
                    server, seconds=seconds_cap, concurrency=256, stream=False,
                    requests=conversations, text=RUN_TEXT, max_tokens=RUN_MAX_TOKENS,
                    warm=False,
                ),
            )  # fmt: skip
            bare_s = conversations / bare["rps"]
            started = time.perf_counter()
            measured = measure(
                [
                    sys.executable, "-m", "convsim", "run", str(pack),
                    "--model", "openai-compatible:mock-model",
                    "--base-url", f"{server.url}/v1", "--concurrency", "256",
                    "--out", str(out), "--overwrite",
                ]
            )  # fmt: skip
            run_s = time.perf_counter() - started
            lines = sum(1 for _ in out.open())
            if lines != conversations:
                raise RuntimeError(f"convsim run wrote {lines} lines, not {conversations}")
            ratios.append(bare_s / run_s)
            print(
                f"  convsim run, {conversations:,} one-turn conversations, c=256: "
                f"{run_s:.2f} s ({measured.cpu_s / conversations * 1e6:.0f} us CPU per "
                f"conversation, start-up included); bare loop {bare_s:.2f} s "
                f"({bare['us_per_request']:.0f} us/req)",
                flush=True,
            )
    print(
        f"convsim run whole process / bare loop, {conversations:,} requests: "
        f"{_spread(ratios)}; target >= 0.5",
        flush=True,
    )


def _guidellm(command: str, server: Server, concurrency: int, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        prompts = Path(tmp) / "prompts.jsonl"
        prompts.write_text("\n".join(json.dumps({"prompt": USER_TEXT}) for _ in range(2000)))
        out = Path(tmp) / "out.json"
        m = measure(
            [
                command, "run",
                "--backend", f"kind=openai_http,target={server.url},validate_backend=false,"
                "model=mock-model",
                "--profile", f"kind=concurrent,streams={concurrency}",
                "--data", f"kind=json_file,path={prompts}",
                "--constraint", f"kind=max_duration,seconds={seconds:g}",
                "--output", f"kind=json,path={out}",
                "--disable-console",
            ],
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
            cwd=tmp,
        )  # fmt: skip
        bench = json.loads(out.read_text())["benchmarks"][0]
    metrics = bench["metrics"]
    return {
        "rps": metrics["request_totals"]["successful"] / bench["duration"],
        "cores": m.sampler.cores_over_last(bench["duration"]),
        "ttft_p50_ms": metrics["time_to_first_token_ms"]["successful"]["median"],
    }


_TOKENIZER = """
import sys
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
vocab = {"<unk>": 0, "<eos>": 1, "word": 2}
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>").save_pretrained(
    sys.argv[1]
)
"""


def _vllm(command: str, server: Server, concurrency: int, seconds: float) -> dict[str, Any]:
    """``vllm bench serve`` with the random dataset; its tokenizer is a one-word-per-token
    vocabulary written here (it needs one, and nothing is downloaded)."""
    python = str(Path(command).parent / "python")
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = Path(tmp) / "tokenizer"
        subprocess.run([python, "-c", _TOKENIZER, str(tokenizer)], check=True)
        out = Path(tmp) / "out.json"
        prompts = int(max(seconds, 6.0) * 1500)  # about that long on this machine
        m = measure(
            [
                command, "bench", "serve", "--backend", "openai-chat",
                "--base-url", server.url, "--endpoint", "/v1/chat/completions",
                "--model", "mock-model", "--tokenizer", str(tokenizer),
                "--dataset-name", "random", "--random-input-len", "20",
                "--random-output-len", "16", "--num-prompts", str(prompts),
                "--max-concurrency", str(concurrency), "--disable-tqdm",
                "--save-result", "--result-filename", str(out),
            ],
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
            cwd=tmp,
        )  # fmt: skip
        result = json.loads(out.read_text())
    return {
        "rps": result["request_throughput"],
        "cores": m.sampler.cores_over_last(result["duration"]),
        "ttft_p50_ms": result["median_ttft_ms"],
    }


def _ours(server: Server, concurrency: int, seconds: float) -> dict[str, Any]:
    result, m = load(
        server, *SESSIONS, "--concurrency", str(concurrency), "--duration", str(seconds)
    )
    return {
        "rps": result["throughput"]["requests_per_s"],
        "cores": m.sampler.cores_over_last(result["duration_s"]),
        "ttft_p50_ms": result["latency_ms"]["ttft"]["p50"],
    }


def _install(venv: Path, package: str, command: str) -> str:
    path = venv / "bin" / command
    if not path.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", package], check=True)
    return str(path)


def peers(seconds: float, guidellm: str | None, vllm: str | None, venvs: Path | None) -> None:
    if venvs is not None:  # each in its own environment: both bring torch
        guidellm = guidellm or _install(venvs / "guidellm", "guidellm", "guidellm")
        vllm = vllm or _install(venvs / "vllm", "vllm", "vllm")
    tools: dict[str, Callable[[str, Server, int, float], dict[str, Any]]] = {}
    if guidellm is not None:
        tools["guidellm"] = lambda *a: _guidellm(guidellm, *a)  # type: ignore[arg-type]
    if vllm is not None:
        tools["vllm bench serve"] = lambda *a: _vllm(vllm, *a)  # type: ignore[arg-type]
    if not tools:
        print("peers: not run (give --guidellm PATH, --vllm PATH or --peers-venvs DIR)")
        return
    seconds = max(seconds, 6.0)
    for ttft_ms in (0, 50):
        with mock_server("--ttft-ms", str(ttft_ms)) as server:
            rows = {name: run(server, 32, seconds) for name, run in tools.items()}
            rows["convsim load"] = _ours(server, 32, seconds)
        for name, row in rows.items():
            cores = row["cores"] or float("nan")
            print(
                f"peers, c=32, streaming, server TTFT {ttft_ms} ms: {name}: "
                f"{row['rps']:,.0f} req/s on {cores:.2f} cores ({row['rps'] / cores:,.0f} "
                f"per core), TTFT p50 {row['ttft_p50_ms']:.1f} ms",
                flush=True,
            )


PARTS = ("closed", "open", "ttft", "memory", "run", "peers")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument(
        "--conversations", type=int, default=20_000, help="one-turn conversations of `run`"
    )
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--guidellm", default=None, help="guidellm's command")
    parser.add_argument("--vllm", default=None, help="vllm's command")
    parser.add_argument(
        "--peers-venvs", type=Path, default=None, help="install the peers in venvs here"
    )
    args = parser.parse_args()
    if "closed" in args.parts:
        closed_loop(args.seconds, args.repeats)
    if "open" in args.parts:
        open_loop(args.seconds)
    if "ttft" in args.parts:
        ttft(args.seconds)
    if "memory" in args.parts:
        memory(args.seconds, args.sessions)
    if "run" in args.parts:
        run_command(600.0, args.conversations, args.repeats)
    if "peers" in args.parts:
        peers(args.seconds, args.guidellm, args.vllm, args.peers_venvs)


if __name__ == "__main__":
    main()
